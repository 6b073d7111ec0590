"""``fairseq-aggressive-import-hf HF_DIR OUT_DIR``: a local transformers
checkpoint directory converted into a model directory of this package
(:func:`fairseq_aggressive.hf.import_hf`)."""
import argparse
import sys


def cli_main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="fairseq-aggressive-import-hf", description=__doc__.split("\n\n")[0])
    ap.add_argument("hf_dir", help="a transformers checkpoint directory (config.json, weights, tokenizer files)")
    ap.add_argument("out_dir", help="the model directory to write (new, or empty)")
    ap.add_argument("--source-lang", default="src",
                    help="the source language's name in the dictionaries (src); for a multilingual model (mBART, "
                         "M2M100, NLLB) the language it will translate from, as its tokenizer names it (eng_Latn)")
    ap.add_argument("--target-lang", default="tgt",
                    help="the target language's name in the dictionaries (tgt); for a multilingual model the "
                         "language it will translate into (deu_Latn)")
    args = ap.parse_args(argv)
    from .convert import ConversionError, import_hf

    try:
        meta = import_hf(args.hf_dir, args.out_dir, args.source_lang, args.target_lang)
    except ConversionError as e:
        print(f"fairseq-aggressive-import-hf: {e}", file=sys.stderr)
        return 2
    print(f"{args.out_dir}: {meta['imported_from']['model_type']} model, {meta['encoder_layers']}+"
          f"{meta['decoder_layers']} layers, d={meta['embed_dim']}, {meta['parameters']:,} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
