"""Bad input gets a clear error before any decoding starts."""
import argparse

import pytest
from fairseq import options

from fairseq_aggressive.verifiers import UnsupportedModelError
from helpers import make_model, make_task


def gen_args(**kw):
    base = dict(beam=1, nbest=1, max_len_a=0, max_len_b=200, min_len=1, unnormalized=False,
                lenpen=1, unkpen=0, temperature=1.0, sampling=False, no_repeat_ngram_size=0,
                prefix_size=0, constraints=None, match_source_len=False, lm_path=None,
                diverse_beam_groups=-1, diversity_rate=-1, print_alignment=None,
                retain_dropout=False, score_reference=False)
    base.update(kw)
    return argparse.Namespace(**base)


def test_unknown_decoding_rejected_by_cli():
    parser = options.get_generation_parser(default_task="aggressive_translation")
    with pytest.raises(SystemExit):
        options.parse_args_and_arch(parser, input_args=["data", "--user-dir", "fairseq_aggressive",
                                                         "--task", "aggressive_translation", "--decoding", "fast"])


def test_unknown_decoding_rejected_by_build_generator():
    task = make_task()
    model = make_model(task)
    with pytest.raises(ValueError, match="unknown --decoding 'fast'"):
        task.build_generator([model], gen_args(decoding="fast"))


def test_negative_max_draft_len():
    with pytest.raises(ValueError, match="--max-draft-len must be >= 0"):
        make_task(max_draft_len=-1)


def test_iad_with_a_beam_is_drafted_beam_search_on_the_engine():
    """--decoding iad --beam N: the engine's beam search, drafted; on the torch path an
    error naming the engine; the other aggressive decodings still need --beam 1."""
    from fairseq_aggressive.native import available
    from fairseq_aggressive.native.beam import NativeBeamGenerator

    task = make_task(decoding="iad")
    model = make_model(task)
    if available() is None:
        gen = task.build_generator([model], gen_args(beam=5))
        assert isinstance(gen, NativeBeamGenerator) and gen.drafts is not None and gen.beam_size == 5
    with pytest.raises(ValueError, match="runs in the native engine"):
        make_task(decoding="iad", engine="torch").build_generator([model], gen_args(beam=5))
    with pytest.raises(ValueError, match="--beam 1"):
        make_task(decoding="blockwise").build_generator([model], gen_args(beam=5))


@pytest.mark.parametrize(
    "option,value,flag",
    [("no_repeat_ngram_size", 2, "--no-repeat-ngram-size"), ("prefix_size", 1, "--prefix-size"),
     ("sampling", True, "--sampling"), ("constraints", "ordered", "--constraints"),
     ("print_alignment", "hard", "--print-alignment"), ("match_source_len", True, "--match-source-len"),
     ("nbest", 2, "--nbest")],
)
def test_options_that_change_greedy_are_refused(option, value, flag):
    task = make_task(decoding="iad")
    model = make_model(task)
    with pytest.raises(ValueError, match=flag):
        task.build_generator([model], gen_args(**{option: value}))


def test_beam_mode_is_stock():
    from fairseq.sequence_generator import SequenceGenerator

    task = make_task()
    model = make_model(task)
    gen = task.build_generator([model], gen_args(beam=5))
    assert type(gen) is SequenceGenerator


def test_ensemble_refused():
    task = make_task(decoding="iad")
    with pytest.raises(ValueError, match="single model"):
        task.build_generator([make_model(task), make_model(task, seed=1)], gen_args())


@pytest.mark.parametrize(
    "overrides,msg",
    [(dict(adaptive_softmax_cutoff="10,20"), "adaptive softmax"),
     (dict(cross_self_attention=True), "cross-self-attention")],
)
def test_decoders_the_verifier_cannot_run_exactly(overrides, msg):
    task = make_task(decoding="iad")
    model = make_model(task, **overrides)
    with pytest.raises(UnsupportedModelError, match=msg):
        task.build_generator([model], gen_args())


def test_non_transformer_ar_model_refused():
    task = make_task(decoding="iad")
    model = make_model(task, arch="lstm", encoder_hidden_size=32, decoder_hidden_size=32,
                       decoder_out_embed_dim=32, encoder_embed_dim=32, decoder_embed_dim=32,
                       criterion="cross_entropy")
    with pytest.raises(UnsupportedModelError, match="Transformer decoders"):
        task.build_generator([model], gen_args())


def test_non_autoregressive_model_refused():
    task = make_task(decoding="iad")
    task.target_dictionary.add_symbol("<mask>")
    model = make_model(task, arch="nonautoregressive_transformer")
    with pytest.raises(UnsupportedModelError, match="non-autoregressive"):
        task.build_generator([model], gen_args())


@pytest.mark.parametrize("option,value,message", [
    ("decoding", "fast", "unknown --decoding 'fast'"),
    ("engine", "gpu", "--engine must be one of"),
    ("max_draft_len", -2, "--max-draft-len must be >= 0"),
    ("iad_ngram_min", 0, "--iad-ngram-min/--iad-ngram-max"),
    ("iad_branches", 9, "--iad-branches must be at most 8"),
    ("draft_cost", "1,x", "--draft-cost must be"),
    ("block_size", 0, "--block-size must be an integer >= 1"),
    ("drafter_shortlist", 0, "--drafter-shortlist must be an integer >= 1"),
    ("native_threads", "many", "--native-threads must be"),
    ("native_isa", "sse9", "--native-isa must be auto or one of"),
])
def test_decoding_options_are_checked_once_when_read(option, value, message):
    """Every decoding option is checked where the task reads them (the task's
    configuration at creation, per-call arguments when a generator is built),
    with the flag named."""
    from fairseq_aggressive.decoding_options import DecodingOptions

    values = {"decoding": "iad", option: value}
    with pytest.raises(ValueError, match=message):
        DecodingOptions.read(values.get)
    task = make_task()
    with pytest.raises(ValueError, match=message):  # a hub call's argument
        task.decoding_options(argparse.Namespace(**values))


def test_decoding_options_read_typed_values():
    from fairseq_aggressive.decoding_options import DecodingOptions

    opts = make_task(decoding="iad", native_threads="2", draft_cost="off", max_draft_len=3).decoding_options()
    assert (opts.decoding, opts.native_threads, opts.draft_cost, opts.max_draft_len, opts.aggressive) == (
        "iad", 2, "off", 3, True)
    assert DecodingOptions.read(lambda name: None) == DecodingOptions()  # every default
    per_call = make_task(decoding="iad").decoding_options(argparse.Namespace(max_draft_len=0, native_threads=None))
    assert per_call.max_draft_len == 0 and per_call.native_threads is None


def test_each_decoding_option_is_declared_once():
    """A decoding option is one row of decoding_options.OPTIONS: the task's
    field (default, help) and DecodingOptions' field come from it, and no
    other module declares it."""
    import dataclasses
    import re

    from fairseq_aggressive.decoding_options import OPTIONS, DecodingOptions
    from fairseq_aggressive.tasks import config
    from helpers import ROOT

    names = [o.name for o in OPTIONS]
    assert len(set(names)) == len(names)
    assert [f.name for f in dataclasses.fields(DecodingOptions)] == names
    task = {f.name: f for f in dataclasses.fields(config.AggressiveTranslationConfig)}
    for o in OPTIONS:
        assert task[o.name].default == o.default and task[o.name].metadata["help"] == o.help, o.name
        assert getattr(DecodingOptions(), o.name) == o.read(o.default), o.name
    for module in ("tasks/config.py", "decoding.py", "translator.py"):
        with open(f"{ROOT}/fairseq_aggressive/{module}", encoding="utf-8") as f:
            text = f.read()
        declared = [n for n in names if re.search(rf"^\s+{n}\s*:.*=\s*field\(", text, re.M)]
        assert not declared, (module, declared)
