"""A random-weight Marian checkpoint shaped like Helsinki-NLP/opus-mt-en-de
(6+6 layers, d=512, 8 heads, FFN 2048, swish, a 58,101-token shared
vocabulary), with a SentencePiece model trained on the bundled English sample,
imported, and that sample binarized for it: what docs/hugging-face.md times
against CTranslate2's conversion of the same checkpoint and transformers'
own generate.  No download: the weights are random, so every sentence runs to
its length limit, the same work for every engine.

    python scripts/hf_marian_sample.py --work work/hf-opus [--layers 6 --dim 512]
    python scripts/hf_marian_sample.py --work work/hf-opus --time-transformers 40

The second form times transformers' generate(num_beams=1) on the first N
sentences, one at a time, with torch's threads as set (2 on 2 cores).
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "debian-ende-sample" / "test.tok.en"
L_A, L_B = 1.2, 10  # the length rule of the runs (fairseq's --max-len-a/b)


def make(work: Path, layers: int, dim: int, vocab: int) -> None:
    import sentencepiece as spm
    import torch
    import transformers

    from fairseq_aggressive.hf import import_hf

    hf = work / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(work / "sp"), vocab_size=800,
                                   bos_id=-1, eos_id=0, unk_id=1, pad_id=-1, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(work / "sp.model"))
    n = sp.get_piece_size()
    pieces = {sp.id_to_piece(i): i for i in range(n)}
    pieces.update({f"▁unused{i}": i for i in range(n, vocab - 1)})  # the rest of an OPUS-MT-sized vocabulary
    pieces["<pad>"] = vocab - 1
    (hf / "vocab.json").write_text(json.dumps(pieces))
    for name in ("source.spm", "target.spm"):
        (hf / name).write_bytes((work / "sp.model").read_bytes())
    cfg = transformers.MarianConfig(
        vocab_size=vocab, d_model=dim, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=8,
        decoder_attention_heads=8, encoder_ffn_dim=4 * dim, decoder_ffn_dim=4 * dim, max_position_embeddings=512,
        pad_token_id=vocab - 1, eos_token_id=0, decoder_start_token_id=vocab - 1, forced_eos_token_id=0,
        activation_function="swish", scale_embedding=True)
    torch.manual_seed(0)
    model = transformers.MarianMTModel(cfg).eval()
    model.generation_config.bad_words_ids = [[vocab - 1]]
    model.save_pretrained(hf)
    out = work / "model"
    if not out.exists():
        import_hf(str(hf), str(out))
    data = work / "data"
    data.mkdir(exist_ok=True)
    enc = [" ".join(sp.encode(line, out_type=str)) for line in lines]
    for side in ("src", "tgt"):
        (data / f"test.{side}").write_text("\n".join(enc) + "\n", encoding="utf-8")
    subprocess.run(["fairseq-preprocess", "-s", "src", "-t", "tgt", "--testpref", str(data / "test"),
                    "--srcdict", str(out / "dict.src.txt"), "--tgtdict", str(out / "dict.tgt.txt"),
                    "--destdir", str(data / "bin"), "--workers", "1"], check=True)
    print(f"{hf} (transformers), {out} (imported), {data / 'bin'} (the sample, {len(lines)} sentences)")


def time_transformers(work: Path, n: int) -> None:
    import torch
    import transformers

    hf = work / "hf"
    tok = transformers.MarianTokenizer(str(hf / "source.spm"), str(hf / "target.spm"), str(hf / "vocab.json"))
    model = transformers.MarianMTModel.from_pretrained(hf).eval()
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()[:n]
    ids = [tok(line)["input_ids"] for line in lines]
    with torch.no_grad():
        for x in ids[:3]:  # warm-up
            model.generate(torch.tensor([x]), num_beams=1, do_sample=False, max_new_tokens=5)
        t0 = time.perf_counter()
        for x in ids:  # fairseq's length rule: at most 1.2 * len + 10 tokens before EOS
            model.generate(torch.tensor([x]), num_beams=1, do_sample=False,
                           max_new_tokens=int(L_A * len(x) + L_B) + 1)
        dt = time.perf_counter() - t0
    print(f"transformers {transformers.__version__} generate, batch 1, {torch.get_num_threads()} threads: "
          f"{1000 * dt / len(ids):.1f} ms per sentence ({len(ids)} sentences)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default=str(ROOT / "work" / "hf-opus"))
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=58101)
    ap.add_argument("--time-transformers", type=int, default=0, metavar="N")
    args = ap.parse_args(argv)
    work = Path(args.work)
    if args.time_transformers:
        time_transformers(work, args.time_transformers)
    else:
        make(work, args.layers, args.dim, args.vocab)
    return 0


if __name__ == "__main__":
    sys.exit(main())
