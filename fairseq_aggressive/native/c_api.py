"""The Python side of the engine's C API (``csrc/capi/c_api.cpp``): its version,
the structs it shares with Python (mirrored as :class:`ctypes.Structure`), the
weight dtype codes and the ctypes signatures of its functions."""
import ctypes

# must equal kApiVersion in csrc/capi/c_api.cpp (checked at load)
API_VERSION = 21

# dtype codes of fa_set_weight (fa::DType in csrc/model/weights.h)
F32, F16, I8 = 0, 1, 2


class Config(ctypes.Structure):
    """fa::Config (csrc/model/weights.h): the model's shape and fairseq options."""

    _fields_ = [(n, ctypes.c_int32) for n in (
        "C", "H", "F", "enc_layers", "dec_layers", "src_vocab", "tgt_vocab",
        "enc_normalize_before", "dec_normalize_before", "act", "pad", "unk", "eos")] + [
        (n, ctypes.c_float) for n in ("enc_embed_scale", "dec_embed_scale", "ln_eps")] + [
        ("enc_dim", ctypes.c_int32)]


# Config.act: the activations the engine computes, by their torch function names (fa::Activation)
ACTIVATIONS = ("relu", "gelu", "silu")


class PassArgs(ctypes.Structure):
    """fa::PassArgs (csrc/model/pass.h): one verification pass's inputs and outputs
    (pointers as addresses, 0 for none)."""

    P = ctypes.c_void_p
    _fields_ = [("n", ctypes.c_int32), ("sent", P), ("row_len", P), ("tokens", P), ("n_branch", P),
                ("branch_len", P), ("max_len", ctypes.c_int32), ("min_len", ctypes.c_int32),
                ("unk_penalty", ctypes.c_float), ("temperature", ctypes.c_float), ("beta", ctypes.c_int32),
                ("tau", ctypes.c_float), ("choice", P), ("score", P), ("n_emit", P), ("n_match", P), ("done", P),
                ("winner", P), ("feats", P), ("row_max_len", P), ("has_forced", ctypes.c_int32),
                ("forced", ctypes.c_int32), ("scores", ctypes.c_int32), ("lse_ns", P)]
    del P


class DraftArgs(ctypes.Structure):
    """fa::DraftArgs (csrc/loop/block_drafter.h): one block-drafter pass."""

    P, I = ctypes.c_void_p, ctypes.c_int32
    _fields_ = [("n", I), ("sent", P), ("row_len", P), ("tokens", P), ("k", I), ("causal", I), ("out", P),
                ("feats", P), ("autoregressive", I), ("min_prob", ctypes.c_float), ("lens", P)]
    del P, I


# draft positions counted one by one in LoopStats (kLoopPositions; the last counts every later one)
LOOP_POSITIONS = 32


class LoopStats(ctypes.Structure):
    """fa::LoopStats (csrc/loop/counters.h): passes and drafts, by draft position."""

    _fields_ = [(n, ctypes.c_int64) for n in ("passes", "sentence_passes", "drafted", "accepted", "draft_ns")] + [
        ("position_drafted", ctypes.c_int64 * LOOP_POSITIONS), ("position_accepted", ctypes.c_int64 * LOOP_POSITIONS)]


class CopyRates(ctypes.Structure):
    """fa::CopyRates (csrc/loop/counters.h): what source-copy drafts learnt, per kind of draft."""

    _fields_ = [(n, ctypes.c_int64) for n in (
        "copy_trials", "copy_hits", "sync_trials", "sync_hits", "cont_trials", "cont_hits")]


# passes counted by their rows in RunStats (kRunRowsHist; the last counts 64 rows or more)
RUN_ROWS_HIST = 65


class RunStats(ctypes.Structure):
    """fa::RunStats (csrc/loop/counters.h): the engine's one record of a
    running batch's counters: its loop's, its rows', its passes by rows and
    what source-copy drafts learnt."""

    I64 = ctypes.c_int64
    _anonymous_ = ("loop",)  # its counters read as the struct's own (stats.passes)
    _fields_ = [("loop", LoopStats), ("emitted", I64), ("joined", I64), ("left", I64), ("dropped", I64),
                ("pass_rows", I64 * RUN_ROWS_HIST), ("copy", CopyRates)]
    del I64


class DrafterSettings(ctypes.Structure):
    """fa::DrafterSettings (csrc/loop/drafter.h): every drafter's settings, each reading its own."""

    I, F = ctypes.c_int32, ctypes.c_float
    _fields_ = [("max_draft", I), ("ngram_min", I), ("ngram_max", I), ("bos", I), ("k", I), ("room", I),
                ("min_prob", F), ("shared_encoder", I), ("causal", I)]
    del I, F
    #: every field but max_draft, at the value a drafter that does not read it is given
    DEFAULTS = dict(ngram_min=1, ngram_max=4, bos=0, k=8, room=1 << 20, min_prob=0.0, shared_encoder=0, causal=0)


class RunSettings(ctypes.Structure):
    """fa::RunSettings (csrc/loop/running_batch.h): what every row of a running
    batch shares: its drafter (by name: DRAFTERS), the first token, the
    draft-length policy on or off, the score rules (with the forced first
    output token, if any), acceptance, and whether output scores are kept."""

    I, F = ctypes.c_int32, ctypes.c_float
    _fields_ = [("drafter", ctypes.c_char_p), ("first", I), ("budget", I), ("min_len", I), ("unk_penalty", F),
                ("temperature", F), ("beta", I), ("tau", F), ("has_forced", I), ("forced", I),
                ("draft", DrafterSettings), ("no_scores", I)]
    del I, F


# the engine's drafters, by the names its table (csrc/loop/drafter.cpp) registers them under
DRAFTERS = ("greedy", "copy", "feature", "blockwise", "nar")


class StaticOutput(ctypes.Structure):
    """fa::StaticOutput (csrc/loop/running_batch.h): where a static batch's sentences' tokens, scores and passes go."""

    P = ctypes.c_void_p
    _fields_ = [("out_cap", ctypes.c_int32), ("out_tokens", P), ("out_scores", P), ("out_len", P), ("passes", P)]
    del P


class BeamArgs(ctypes.Structure):
    """fa::BeamArgs (csrc/beam/beam_search.h): a beam search's settings and where it writes its hypotheses."""

    I, F, P = ctypes.c_int32, ctypes.c_float, ctypes.c_void_p
    _fields_ = [("beam", I), ("nbest", I), ("first", I), ("max_len", I), ("min_len", I), ("unk_penalty", F),
                ("temperature", F), ("len_penalty", F), ("normalize", I), ("no_repeat_ngram", I),
                ("n_out", P), ("tokens", P), ("positional", P), ("score", P), ("src", P), ("src_len", P),
                ("max_draft", I), ("ngram_min", I), ("ngram_max", I), ("draft_hyps", I)]
    del I, F, P


class BeamCounts(ctypes.Structure):
    """fa::BeamCounts (csrc/beam/beam_search.h): what a beam search did: steps (per
    sentence), of them those drafts served whole, hypotheses read, of them
    those a draft served, decoder passes and their row positions."""

    _fields_ = [(name, ctypes.c_int64) for name in ("steps", "replayed", "reads", "drafted", "passes", "positions")]


def draft_cap(max_draft) -> int:
    """A cap on drafts as the engine's loops take it: None (no cap) is -1."""
    return -1 if max_draft is None else int(max_draft)


def declare(lib) -> None:
    """Set the argument and result types of every function of the library."""
    P, I, I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    L64 = ctypes.POINTER(ctypes.c_int64)
    signatures = {
        "fa_version": (I, []),
        "fa_sizeof": (I, [ctypes.c_char_p]),
        "fa_isa": (ctypes.c_char_p, []),
        "fa_layout": (I, [I]),
        "fa_amx_state": (I, []),
        "fa_source_key": (ctypes.c_char_p, []),
        "fa_model_new": (P, [ctypes.POINTER(Config)]),
        "fa_new_error": (ctypes.c_char_p, []),
        "fa_set_weight": (I, [P, ctypes.c_char_p, I, I, P, I, I]),
        "fa_model_build": (I, [P]),
        "fa_model_error": (ctypes.c_char_p, [P]),
        "fa_model_free": (None, [P]),
        "fa_model_share": (P, [P]),
        "fa_half_linears": (I, [P]),
        "fa_int8_linears": (I, [P]),
        "fa_pass_weight_bytes": (I64, [P]),
        "fa_weights_id": (I64, [P]),
        "fa_set_threads": (I, [P, I]),
        "fa_pool_stats": (None, [P, L64]),
        "fa_set_pool_timeout": (None, [P, I]),
        "fa_begin": (P, [P, I, P, P, I]),
        "fa_begin_encoded": (P, [P, I, P, P, I]),
        "fa_state_free": (None, [P]),
        "fa_state_take": (P, [P, I, P]),
        "fa_encoder_out": (I64, [P, P, I64]),
        "fa_length": (I, [P, I]),
        "fa_shortlist_common": (I, [P, I]),
        "fa_shortlist": (I, [P, P, I, I, P]),
        "fa_pass": (I, [P, P, ctypes.POINTER(PassArgs)]),
        "fa_decode": (I, [P, P, P, P, ctypes.POINTER(RunSettings), P, P, I, ctypes.POINTER(StaticOutput),
                          ctypes.POINTER(RunStats)]),
        "fa_decode_beam": (I, [P, P, ctypes.POINTER(BeamArgs), ctypes.POINTER(BeamCounts)]),
        "fa_set_mask_embed": (I, [P, P]),
        "fa_set_feature_proj": (I, [P, P, P, I]),
        "fa_set_own_feature_proj": (I, [P, P, P]),
        "fa_draft": (I, [P, P, ctypes.POINTER(DraftArgs)]),
        "fa_set_heads": (I, [P, P, P, I, P, P, I]),
        "fa_heads": (I, [P, P, I, P, P, P]),
        "fa_run_new": (P, [P, P, ctypes.POINTER(RunSettings)]),
        "fa_run_free": (None, [P]),
        "fa_run_join": (I, [P, P, I, P, P, P, P, P, P]),
        "fa_run_step": (I, [P, P, I, ctypes.c_double, P, I]),
        "fa_run_take": (I, [P, I, P, P, I, P]),
        "fa_run_drop": (I, [P, I]),
        "fa_run_wake": (None, [P]),
        "fa_run_active": (I, [P]),
        "fa_run_stats": (None, [P, ctypes.POINTER(RunStats)]),
        "fa_pass_cost": (I, [P, P, I]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes


def declare_testing(lib) -> None:
    """The test library's extra functions (csrc/testing/)."""
    I, I64, L64 = ctypes.c_int, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)
    lib.fa_pool_selftest.restype = I64
    lib.fa_pool_selftest.argtypes = [I, I, I, I, I, I, I, L64]
    lib.fa_pool_lose_next_count.restype = None
    lib.fa_pool_lose_next_count.argtypes = [ctypes.c_void_p]
    lib.fa_set_beam_mutant.restype = None
    lib.fa_set_beam_mutant.argtypes = [I]
    lib.fa_set_drafted_pass_delay.restype = None
    lib.fa_set_drafted_pass_delay.argtypes = [I]
    lib.fa_set_run_fault_token.restype = None
    lib.fa_set_run_fault_token.argtypes = [I]
    lib.fa_set_realized_check.restype = None
    lib.fa_set_realized_check.argtypes = [I]
    lib.fa_set_eager_projection_bytes.restype = None
    lib.fa_set_eager_projection_bytes.argtypes = [ctypes.c_void_p, I64]
    lib.fa_set_screen.restype = None
    lib.fa_set_screen.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_float]
    lib.fa_screen_counts.restype = None
    lib.fa_screen_counts.argtypes = [L64]
    P = ctypes.c_void_p
    lib.fa_test_linear.restype = I
    lib.fa_set_amx_min_rows.restype = I
    lib.fa_set_amx_min_rows.argtypes = [I]
    lib.fa_set_product_pieces.restype = I
    lib.fa_set_product_pieces.argtypes = [I]
    lib.fa_amx_products.restype = I64
    lib.fa_amx_products.argtypes = []
    lib.fa_test_amx_caller_shapes.restype = I
    lib.fa_test_amx_caller_shapes.argtypes = [I, I, I]
    lib.fa_test_linear.argtypes = [I, I, I, I, I, P, P, P, P, P]
    lib.fa_test_attend.restype = I
    lib.fa_test_stream_hints.restype = I
    lib.fa_test_stream_ahead_lines.restype = I
    lib.fa_test_stream_ahead_lines.argtypes = []
    lib.fa_test_stream_hints.argtypes = [I64, I, I, I, I64, P]
    lib.fa_test_attend.argtypes = [I, I, I, I64, P, P, P, P, P, P, P]
    lib.fa_test_attend_queries.restype = I
    lib.fa_test_attend_queries.argtypes = [I, I, I, I64, I64, P, P, P, P, P]
    lib.fa_test_row_reductions.restype = I
    lib.fa_test_storage_offsets.restype = I
    lib.fa_test_storage_offsets.argtypes = [L64, I]
    lib.fa_test_row_reductions.argtypes = [I, P, P, P, P, P]
    lib.fa_test_logsumexp_coarse.restype = I
    lib.fa_test_logsumexp_coarse.argtypes = [I, P, P, P]
    lib.fa_test_realized.restype = I
    lib.fa_test_realized.argtypes = [I, P, P]
    lib.fa_stage_times.restype = I
    lib.fa_stage_times.argtypes = [L64, I, I]


def mismatch(lib):
    """None if the library implements this API version and these structs, else
    what differs."""
    try:
        version = lib.fa_version
    except AttributeError:
        return "it has no fa_version()"
    version.restype, version.argtypes = ctypes.c_int, []
    if version() != API_VERSION:
        return f"its API version is {version()}, this Python code expects {API_VERSION}"
    try:
        declare(lib)
    except AttributeError as e:  # an entry point added since it was built (a new loop)
        return f"it lacks an entry point this Python code declares ({e})"
    for struct in (Config, PassArgs, DraftArgs, LoopStats, CopyRates, RunStats, DrafterSettings, RunSettings,
                   StaticOutput, BeamArgs, BeamCounts):
        size = lib.fa_sizeof(struct.__name__.encode())
        if size != ctypes.sizeof(struct):
            return f"its {struct.__name__} has {size} bytes, the Python mirror {ctypes.sizeof(struct)}"
    return None
