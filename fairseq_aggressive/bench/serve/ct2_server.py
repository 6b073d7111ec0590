"""What the ``ct2`` system's server (``--serve-ct2``) decodes with: CTranslate2
greedy with the hub's BPE and fairseq's length limit.  It imports neither
torch nor fairseq (nor this package's root): the server runs without them."""
import os
from typing import Callable, List


def length_cap(max_len_a: float, max_len_b: int, src_len: int, max_positions: int) -> int:
    """fairseq's output length limit (generator.length_cap, repeated here: the
    CTranslate2 server does not import the package)."""
    return min(int(max_len_a * src_len + max_len_b), max_positions - 1)


def ct2_translators(args) -> List[Callable]:
    """CTranslate2 greedy with the hub's BPE, as bench/ct2_worker.py's
    ``translate`` calls it (source tokens without EOS, beam 1, fairseq's length
    limit as ``max_decoding_length``), one callable per worker on one
    translator with ``inter_threads=workers``."""
    import ctranslate2
    from subword_nmt import apply_bpe

    # fairseq's subword_nmt BPE, built as fairseq/data/encoders/subword_nmt_bpe.py builds it
    bpe_args = apply_bpe.create_parser().parse_args(
        ["--codes", os.path.join(args.model_dir, "bpe.codes"), "--separator", "@@"])
    bpe = apply_bpe.BPE(bpe_args.codes, bpe_args.merges, bpe_args.separator, None, bpe_args.glossaries)
    translator = ctranslate2.Translator(args.serve_ct2, device="cpu", compute_type=args.compute_type,
                                        inter_threads=args.workers, intra_threads=args.threads)

    def translate_batch(texts: List[str]) -> List[str]:
        tokens = [bpe.process_line(t).split() for t in texts]  # hub.encode's tokens, without its EOS
        caps = [length_cap(args.max_len_a, args.max_len_b, len(t) + 1, args.max_positions) for t in tokens]
        res = translator.translate_batch(tokens, beam_size=1, max_decoding_length=max(caps),
                                         min_decoding_length=1, return_scores=False)
        # greedy is prefix-stable: a sentence's own cap is a cut of the batch's
        # hub.decode: the dictionary's string, then the BPE removed
        return [(" ".join(r.hypotheses[0][:cap]) + " ").replace("@@ ", "").rstrip() for r, cap in zip(res, caps)]

    return [translate_batch] * args.workers
