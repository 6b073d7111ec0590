"""Hugging Face checkpoints imported (fairseq_aggressive.hf): small
random-initialised Marian models shaped like opus-mt-en-de, converted; greedy
decoding through fairseq's own generator, the native engine and IAD gives
transformers' own generate(num_beams=1) token ids on every sentence, at batch
1 and 8; what cannot convert exactly is refused and nothing is written."""
import argparse
import importlib.util
import json
import os

import pytest
import torch

from helpers import make_sample, python
from hf_helpers import L, hf_ids

transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")



def marian_dir(tmp_path, name="hf", seed=0, V=64, **overrides):
    """A random Marian checkpoint shaped like opus-mt-en-de (post-norm, swish,
    scaled embeddings, shared vocabulary, pad last), scaled down; with vocab.json."""
    opts = dict(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
                pad_token_id=V - 1, eos_token_id=0, decoder_start_token_id=V - 1, forced_eos_token_id=0,
                activation_function="swish", scale_embedding=True, init_std=0.3)
    opts.update(overrides)
    cfg = transformers.MarianConfig(**opts)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(cfg).eval()
    model.generation_config.bad_words_ids = [[V - 1]]  # as every OPUS-MT checkpoint's: never the pad token
    with torch.no_grad():  # varied outputs, some ending before the length limit, as a trained model's
        tables = {id(t.weight): t.weight for t in (model.get_encoder().embed_tokens, model.get_decoder().embed_tokens)}
        for weight in tables.values():
            weight.normal_(0, 0.5)
            weight[V - 1] = 0.0  # the pad token's row stays zero in training (padding_idx), as CTranslate2 assumes
        model.final_logits_bias.normal_(0, 1.0)
        model.final_logits_bias[0, 0] += 11.0
        for n, p in model.named_parameters():
            if "layer_norm" in n and n.endswith("weight"):
                p.uniform_(0.5, 2.0)
    path = tmp_path / name
    model.save_pretrained(path)
    vocab = {"</s>": 0, "<unk>": 1, **{f"▁w{i}": i for i in range(2, V - 1)}, "<pad>": V - 1}
    (path / "vocab.json").write_text(json.dumps(vocab))
    return path, model


def sources(V, n, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        k = int(torch.randint(1, 30, (1,), generator=g))
        out.append(torch.randint(2, V - 1, (k,), generator=g).tolist() + [0])  # Marian ids, </s> last
    return out


def hf_greedy(model, rows, pad):
    """transformers' greedy token ids per sentence (after the start token, up to Marian's EOS, 0)."""
    return hf_ids(model, rows, pad, 0)


def load(out):
    from fairseq import checkpoint_utils

    import fairseq_aggressive  # noqa: F401

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(out / "model.pt")],
                                                                    arg_overrides={"data": str(out)})
    return models[0].eval(), task


def decode(model, task, rows, **opts):
    """The converted model's outputs, in transformers' ids, batch by batch as given."""
    from fairseq_aggressive.hf import from_hf_ids, to_hf_ids

    # (--min-len 0: transformers' generate may end a sentence at once, fairseq's default does not)
    gen = task.build_generator([model], argparse.Namespace(beam=1, max_len_a=0, max_len_b=L, min_len=0, **opts))
    sample = make_sample([from_hf_ids(r) for r in rows], task.target_dictionary.pad())
    return [to_hf_ids(h[0]["tokens"].tolist()) for h in task.inference_step(gen, [model], sample)], gen


MODES = {
    "fairseq greedy (torch)": dict(),
    "engine greedy": dict(decoding="iad", engine="native", max_draft_len=0),
    "engine IAD": dict(decoding="iad", engine="native"),
    "torch IAD": dict(decoding="iad", engine="torch"),
}


@pytest.fixture(scope="module")
def converted_marian(tmp_path_factory):
    """The random Marian checkpoint imported and loaded; 24 sources and transformers' outputs."""
    from fairseq_aggressive.hf import import_hf

    tmp_path = tmp_path_factory.mktemp("marian")
    hf, model = marian_dir(tmp_path)
    meta = import_hf(str(hf), str(tmp_path / "out"))
    assert meta["arch"] == "hf_transformer" and meta["imported_from"]["model_type"] == "marian"
    fs, task = load(tmp_path / "out")
    rows = sources(64, 24, seed=1)
    ref = [h for i in range(0, len(rows), 8) for h in hf_greedy(model, rows[i : i + 8], 63)]  # in batches of 8
    assert len({tuple(r) for r in ref}) > 16  # varied outputs, some ended before the limit
    assert any(len(r) <= L for r in ref)
    assert [hf_greedy(model, [r], 63)[0] for r in rows[:8]] == ref[:8]  # transformers' batch 1 agrees with its 8
    return fs, task, rows, ref


@pytest.mark.parametrize("mode", list(MODES))
def test_converted_marian_decodes_as_transformers(mode, converted_marian):
    fs, task, rows, ref = converted_marian
    for bsz in (1, 8):
        got = []
        for i in range(0, len(rows), bsz):
            out, gen = decode(fs, task, rows[i: i + bsz], **MODES[mode])
            got += out
        assert got == ref, (mode, bsz)
    if "engine" in mode:
        assert type(gen.verifier).__name__ == "NativeVerifier"


def test_refused_and_nothing_written(tmp_path):
    from fairseq_aggressive.hf import ConversionError, import_hf

    hf, _ = marian_dir(tmp_path, activation_function="tanh")
    with pytest.raises(ConversionError, match="activation 'tanh'"):
        import_hf(str(hf), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".import")]
    hf2, _ = marian_dir(tmp_path, name="hf2", share_encoder_decoder_embeddings=False)
    with pytest.raises(ConversionError, match="separate source and target vocabularies"):
        import_hf(str(hf2), str(tmp_path / "out"))
    hf3, model = marian_dir(tmp_path, name="hf3")
    model.generation_config.bad_words_ids = None
    model.generation_config.save_pretrained(hf3)
    with pytest.raises(ConversionError, match="may emit its pad token"):
        import_hf(str(hf3), str(tmp_path / "out"))
    good, _ = marian_dir(tmp_path, name="good")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ConversionError, match="not empty"):
        import_hf(str(good), str(tmp_path / "full"))
    other = tmp_path / "pegasus"
    transformers.PegasusForConditionalGeneration(transformers.PegasusConfig(
        vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32)).save_pretrained(other)
    with pytest.raises(ConversionError, match="model type 'pegasus'"):
        import_hf(str(other), str(tmp_path / "out"))
    os.remove(good / "vocab.json")
    with pytest.raises(ConversionError, match="no vocab.json"):
        import_hf(str(good), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_the_command_line(tmp_path, capsys):
    from fairseq_aggressive.hf.cli import cli_main

    hf, _ = marian_dir(tmp_path)
    assert cli_main([str(hf), str(tmp_path / "out")]) == 0
    assert "marian model, 2+2 layers, d=32" in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path / "out")) == ["MODEL.json", "dict.src.txt", "dict.tgt.txt", "model.pt"]
    assert cli_main([str(hf), str(tmp_path / "out")]) == 2
    assert "not empty" in capsys.readouterr().err


def test_the_environment_imports_transformers_cleanly():
    """No torchaudio that cannot load (one built for another torch) is left
    where transformers would try to import it."""
    if importlib.util.find_spec("torchaudio") is not None:
        import torchaudio  # noqa: F401  (must load when present)
    from transformers import AutoModelForSeq2SeqLM  # noqa: F401


def marian_with_tokenizer(tmp_path):
    """A random Marian checkpoint with a SentencePiece model trained here on the
    bundled English sample (one model for both sides, as vocab.json)."""
    import sentencepiece as spm

    text = (os.path.dirname(__file__) + "/../data/debian-ende-sample/test.tok.en")
    lines = open(text, encoding="utf-8").read().splitlines()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines[:-40]), model_prefix=str(tmp_path / "sp"),
                                   vocab_size=200, bos_id=-1, eos_id=0, unk_id=1, pad_id=-1,
                                   minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    V = sp.get_piece_size() + 1
    hf, model = marian_dir(tmp_path, V=V)
    (hf / "vocab.json").write_text(json.dumps({**{sp.id_to_piece(i): i for i in range(V - 1)}, "<pad>": V - 1}))
    for name in ("source.spm", "target.spm"):
        (hf / name).write_bytes((tmp_path / "sp.model").read_bytes())
    return hf, model, lines[-40:]


def test_text_through_the_translator_is_transformers(tmp_path):
    """Sentences through Translator (static and streamed) of the imported
    directory: transformers' tokenizer ids and greedy outputs, decoded alike."""
    from fairseq_aggressive.hf import from_hf_ids, import_hf
    from fairseq_aggressive.translator import Translator

    hf, model, lines = marian_with_tokenizer(tmp_path)
    import_hf(str(hf), str(tmp_path / "out"))
    tok = transformers.MarianTokenizer(str(hf / "source.spm"), str(hf / "target.spm"), str(hf / "vocab.json"))
    V = model.config.vocab_size
    want = []
    for line in lines:
        ids = tok(line)["input_ids"]
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), num_beams=1, do_sample=False, max_new_tokens=L + 1)[0].tolist()
        want.append((ids, tok.decode(out, skip_special_tokens=True)))
    for settings in (dict(decoding="iad", engine="native", max_len_a=0, max_len_b=L),
                     dict(max_len_a=0, max_len_b=L)):  # (fairseq's own greedy)
        t = Translator.from_pretrained(str(tmp_path / "out"), **settings)
        assert [t.hub.encode(s).tolist() for s in lines] == [from_hf_ids(ids) for ids, _ in want]
        assert [t.translate(s) for s in lines] == [text for _, text in want], settings
        if "decoding" in settings:  # streamed through the engine's running batch
            assert t.running_decoder() is not None
            assert t.translate_batch(lines, rows=8) == [text for _, text in want]
    assert V > 100 and len({text for _, text in want}) > 10


@pytest.mark.e2e  # (a whole run: fairseq-preprocess, the bench, a CTranslate2 conversion)
def test_the_bench_runs_ctranslate2_on_the_same_checkpoint(tmp_path):
    """The bench on an imported model: CTranslate2's conversion of the
    transformers checkpoint it came from (sources with their EOS, --min-len 0)
    decodes as the engine does; fairseq's greedy and the engine's agree."""
    pytest.importorskip("ctranslate2")

    from helpers import run, tool

    from fairseq_aggressive.hf import import_hf

    hf, model, lines = marian_with_tokenizer(tmp_path)
    import_hf(str(hf), str(tmp_path / "out"))
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(hf / "source.spm"))
    data = tmp_path / "data"
    data.mkdir()
    for side in ("src", "tgt"):
        (data / f"test.{side}").write_text("".join(" ".join(sp.encode(s, out_type=str)) + "\n" for s in lines))
    out = tmp_path / "out"
    python([tool("fairseq-preprocess"), "-s", "src", "-t", "tgt", "--testpref", str(data / "test"),
            "--srcdict", str(out / "dict.src.txt"), "--tgtdict", str(out / "dict.tgt.txt"),
            "--destdir", str(data / "bin"), "--workers", "1"], check=True, capture_output=True)
    js = tmp_path / "b.json"
    run([tool("fairseq-aggressive-bench"), str(data / "bin"), "--path", str(out / "model.pt"),
         "--user-dir", "fairseq_aggressive", "--task", "aggressive_translation", "-s", "src", "-t", "tgt",
         "--gen-subset", "test", "--max-len-a", "0", "--max-len-b", str(L), "--min-len", "0", "--warmup", "2",
         "--threads", "1", "--batch-size", "4", "--bench-modes", "greedy,greedy-native,ct2", "--bench-json", str(js)])
    res = json.loads(js.read_text())
    assert res["modes"]["greedy-native"]["identical_to_greedy"] == len(lines)
    assert res["modes"]["ct2"]["identical_to_greedy"] >= len(lines) - 1  # (other kernels: a near tie may flip one)
    assert (out / "model.pt.ct2" / "model.bin").is_file()


def test_the_engines_beam_search_is_fairseqs_on_a_converted_model(tmp_path):
    """Beam search (5) on the engine against fairseq's own on the converted
    model (transformers' beam search stops and normalizes otherwise:
    docs/hugging-face.md), the start token and the forbidden rows included."""
    from fairseq_aggressive.hf import from_hf_ids, import_hf

    hf, model = marian_dir(tmp_path)
    import_hf(str(hf), str(tmp_path / "out"))
    fs, task = load(tmp_path / "out")
    rows = sources(64, 16, seed=3)
    outs = {}
    for engine in ("torch", "native"):
        gen = task.build_generator([fs], argparse.Namespace(beam=5, max_len_a=0, max_len_b=L, min_len=0,
                                                            engine=engine))
        sample = make_sample([from_hf_ids(r) for r in rows], task.target_dictionary.pad())
        outs[engine] = [h[0]["tokens"].tolist() for h in task.inference_step(gen, [fs], sample)]
        if engine == "native":
            assert type(gen).__name__ != "SequenceGenerator"
    assert outs["native"] == outs["torch"]
    assert all(0 not in t and 1 not in t for t in outs["torch"])  # never <s> or <pad>


def test_int8_is_the_int8_models_own_greedy(tmp_path):
    """--inference-precision int8 on a converted model: the engine's greedy and
    IAD give the int8 model's greedy in torch (fairseq's generator)."""
    from fairseq_aggressive.hf import import_hf

    hf, _ = marian_dir(tmp_path)
    import_hf(str(hf), str(tmp_path / "out"))
    rows = sources(64, 16, seed=4)
    outs = {}
    for name, opts in (("torch", dict(engine="torch")),  # fairseq's own generator, on the int8 model
                       ("engine greedy", dict(engine="native", decoding="iad", max_draft_len=0)),
                       ("engine IAD", dict(engine="native", decoding="iad"))):
        fs, task = load(tmp_path / "out")  # (quantized in place by each generator: a fresh copy each)
        outs[name] = [t for i in range(0, 16, 8)
                      for t in decode(fs, task, rows[i: i + 8], inference_precision="int8", **opts)[0]]
    assert outs["engine greedy"] == outs["torch"] and outs["engine IAD"] == outs["torch"]


def test_a_feature_drafter_on_a_converted_model_keeps_transformers_output(tmp_path):
    """A --feature-ar drafter (random, one layer) reading the converted
    verifier's encoder output and features: its drafts are checked by the
    verifier, so the output is still transformers' greedy, on the engine and in torch."""
    from fairseq_aggressive.drafters import FeatureARDrafter
    from fairseq_aggressive.generator import build_generator
    from fairseq_aggressive.hf import from_hf_ids, import_hf, to_hf_ids
    from helpers import make_model

    hf, model = marian_dir(tmp_path)
    import_hf(str(hf), str(tmp_path / "out"))
    fs, task = load(tmp_path / "out")
    d = task.target_dictionary
    dr = make_model(task, arch="block_nat", seed=5, shared_encoder=True,
                    init_encoder_from=str(tmp_path / "out/model.pt"), verifier_features=True, feature_ar=True,
                    decoder_layers=1, block_causal_prefix=True, encoder_learned_pos=True, max_source_positions=128,
                    share_all_embeddings=True)
    rows = sources(64, 16, seed=6)
    ref = hf_greedy(model, rows[:8], 63) + hf_greedy(model, rows[8:], 63)  # (batches of 8 give batch 1's: above)
    for engine in ("native", "torch"):
        drafter = FeatureARDrafter(dr, d, 4, engine=engine)
        gen = build_generator([fs], d, drafter, engine=engine, max_len_a=0, max_len_b=L, min_len=0)
        got = []
        for i in range(0, 16, 8):
            sample = make_sample([from_hf_ids(r) for r in rows[i: i + 8]], d.pad())
            got += [to_hf_ids(h[0]["tokens"].tolist()) for h in gen.generate([fs], sample, bos_token=d.bos())]
        assert got == ref, engine
        assert gen.stats.drafted > 0


def test_the_server_answers_with_transformers_outputs(tmp_path):
    """The server's backend (two continuous-batching workers) on an imported
    directory: every answer is transformers' decoded greedy output."""
    from fairseq_aggressive.hf import import_hf
    from fairseq_aggressive.serving.backend import DecodeBackend

    hf, model, lines = marian_with_tokenizer(tmp_path)
    import_hf(str(hf), str(tmp_path / "out"))
    tok = transformers.MarianTokenizer(str(hf / "source.spm"), str(hf / "target.spm"), str(hf / "vocab.json"))
    want = {}
    for line in lines[:16]:
        ids = tok(line)["input_ids"]
        with torch.no_grad():  # the model's own length rule: 1.2 x source + 10 (the server's default)
            out = model.generate(torch.tensor([ids]), num_beams=1, do_sample=False,
                                 max_new_tokens=int(1.2 * len(ids) + 10) + 1)[0].tolist()
        want[line] = tok.decode(out, skip_special_tokens=True)
    backend = DecodeBackend(str(tmp_path / "out"), workers=2, native_threads=1, max_len_a=1.2, max_len_b=10)
    try:
        assert backend.mode == "continuous"
        reqs = [backend.submit(lines[i: i + 4]) for i in range(0, 16, 4)]
        got = [t for r in reqs for t in r.future.result(timeout=120)]
    finally:
        assert backend.close() == 0
    assert got == [want[s] for s in lines[:16]]
