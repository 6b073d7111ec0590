"""A per-pass trace of one sentence, in the form of SAD's Table 2 and GAD's
Table 17: each pass's draft, the tokens the verifier accepted, where the draft
and the verifier parted (the bifurcation: the drafted token and the
verifier's) and what the pass emitted.

    python scripts/diagnostics/trace_passes.py models/uagec-9x3 "речення з помилкою ." \\
        [--decoding iad|feature-ar|gad|blockwise] [--max-draft-len N] [other Translator settings]

The generator runs its loop in Python (``--python-loop``: one verifier call per
pass, the same output as the engine's loop) and the trace reads each pass's
rows and results as the verifier returns them.  The last line checks the
output against the Translator's own (engine loop) output.
"""
import argparse
import sys


def main(argv=None):
    from fairseq_aggressive.streaming.options import add_decoding_arguments, decoding_settings
    from fairseq_aggressive.translator import Translator

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("sentence")
    names = add_decoding_arguments(p, greedy=False)
    args = p.parse_args(argv)
    settings = decoding_settings(args, names)
    settings.setdefault("decoding", "iad")
    settings.pop("python_loop", None)
    reference = Translator.from_pretrained(args.model_dir, **settings)
    traced = Translator(reference.hub, python_loop=True, **settings)
    gen = traced.generator
    d = reference.hub.tgt_dict
    passes = []
    step = gen.verifier.step

    def recording_step(sents, rows, branches=None, **kw):
        res = step(sents, rows, branches=branches, **kw)
        passes.append((list(rows), branches, res))
        return res

    gen.verifier.step = recording_step
    out = traced.translate_static([args.sentence])[0]  # (the generator's loop, whose passes are recorded)

    def words(ids):
        return " ".join(d[t] for t in ids) if ids else "-"

    print(f"source: {args.sentence}")
    for n, (rows, branches, res) in enumerate(passes, 1):
        row, emit, n_match = rows[0], res.emit[0], res.n_match[0]
        lens = branches[0] if branches else [len(row) - 1]
        drafts, at = [], 1
        for k in lens:
            drafts.append(row[at:at + k])
            at += k
        kept = res.kept[0] if branches else 0
        draft = drafts[kept]
        print(f"pass {n}: after '{d[row[0]]}' drafted {len(draft)}: {words(draft)}"
              + (f"  ({len(drafts)} branches, kept branch {kept + 1})" if len(drafts) > 1 else ""))
        line = f"        accepted {n_match} of {len(draft)}: {words(draft[:n_match])}"
        if n_match < len(draft) and len(emit) > n_match:
            line += f" | bifurcation at {n_match + 1}: drafted '{d[draft[n_match]]}', verifier '{d[emit[n_match]]}'"
        print(line)
        print(f"        emitted {len(emit)}: {words(emit)}")
    same = out == reference.translate(args.sentence)
    print(f"output: {out}")
    print(f"{len(passes)} passes; equal to the engine loop's output: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
