"""On a GPU (tests marked ``cuda``, skipped where torch sees none): every drafter's
decoding on the torch verifier against fairseq's own greedy search on the same device,
batch 1 and N, float32 and float16 (``model.half()``, as ``fairseq-generate --fp16``).

A sentence passes when its tokens equal greedy's or when they first differ where greedy's
model gives the two tokens log-probabilities within rounding's reach (a pass over several
positions and a one-token step run different kernels): 1e-4 in float32, 0.05 in float16
(outputs rounded to float16 steps of 2^-11, about 0.01 on a logit of 20)."""
import pytest
import torch

from fairseq_aggressive.acceptance import TopBetaTauAcceptance
from fairseq_aggressive.drafters import BlockwiseHeadsDrafter, FeatureARDrafter, InputCopyDrafter, NARBlockDrafter
from fairseq_aggressive.generator import build_generator
from helpers import greedy, make_model, make_sample, make_task, random_rows

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device here")]

TOLERANCE = {torch.float32: 1e-4, torch.float16: 0.05}
DTYPES = {"float32": torch.float32, "float16": torch.float16}
# (batch size, (shortest, longest) source, seed)
BATCHES = [(1, (1, 10), 1), (8, (1, 30), 3), (32, (1, 40), 5)]


def on_gpu(model, dtype):
    return model.cuda().to(dtype).eval()


def first_difference(a, b):
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)


def to_gpu(sample):
    from fairseq import utils

    return utils.move_to_cuda(sample)  # the ids too: fairseq's generator indexes them on the device


def tally(model, d, sample, ref, out, dtype, counts, failures):
    """Count each sentence of ``out`` as identical to greedy's ``ref``, a near-tie, or a failure."""
    net = sample["net_input"]
    for i in range(len(ref)):
        a, b = ref[i][0]["tokens"].tolist(), out[i][0]["tokens"].tolist()
        counts["total"] += 1
        if a == b:
            counts["identical"] += 1
            continue
        k = first_difference(a, b)
        if k is None:  # one a prefix of the other: no choice between two tokens
            failures.append((i, a, b))
            continue
        src = net["src_tokens"][i : i + 1]
        with torch.no_grad():
            x = model(src, net["src_lengths"][i : i + 1], torch.tensor([[d.eos()] + a[:k]], device=src.device))
            lp = model.get_normalized_probs(x, log_probs=True)[0, -1].float()
        if abs(float(lp[a[k]] - lp[b[k]])) < TOLERANCE[dtype]:
            counts["near_ties"] += 1
        else:
            failures.append((i, k, a, b, float(lp[a[k]] - lp[b[k]])))


def check_against_greedy(model, d, make_drafter, dtype, batches=BATCHES, max_len_b=50, repeat=False, **gen_kw):
    """Decode ``batches`` with greedy and with the drafter; the counts, after asserting
    that every difference is a near-tie."""
    counts = dict(total=0, identical=0, near_ties=0, drafted=0)
    failures = []
    for bsz, (lo, hi), seed in batches:
        rows = random_rows(d, bsz, lo, hi, seed=seed)
        if repeat:  # sources that the output copies in part (IAD's drafts get accepted)
            rows = [r[:-1] + r[: len(r) // 2] + [d.eos()] for r in rows]
        sample = to_gpu(make_sample(rows, d.pad()))
        ref = greedy(model, d, sample, max_len_b=max_len_b)
        gen = build_generator([model], d, make_drafter(), engine="torch", max_len_b=max_len_b, **gen_kw)
        tally(model, d, sample, ref, gen.generate([model], sample), dtype, counts, failures)
        counts["drafted"] += gen.stats.drafted
    assert not failures, f"{counts}: {failures[:3]}"
    assert counts["drafted"] > 0, counts
    return counts


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [{}, dict(encoder_layers=3, decoder_layers=1, decoder_normalize_before=True)])
def test_iad_equals_greedy_on_cuda(dtype, shape):
    task = make_task()
    d = task.target_dictionary
    model = on_gpu(make_model(task, seed=1, **shape), DTYPES[dtype])
    check_against_greedy(model, d, lambda: InputCopyDrafter(d, d), DTYPES[dtype], repeat=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [4, 25])
@pytest.mark.parametrize("beta", [None, 1])  # exact GAD, and GAD++ with beta 1 (exact too)
def test_gad_equals_greedy_on_cuda(dtype, k, beta):
    task = make_task()
    d = task.target_dictionary
    ar = on_gpu(make_model(task, seed=2), DTYPES[dtype])
    dr = on_gpu(make_model(task, arch="block_nat", seed=12, decoder_layers=2, block_src_copy=True), DTYPES[dtype])
    kw = dict(acceptance=TopBetaTauAcceptance(1, 1.0)) if beta else {}
    check_against_greedy(ar, d, lambda: NARBlockDrafter(dr, d, k), DTYPES[dtype], **kw)


@pytest.mark.parametrize("dtype", DTYPES)
def test_blockwise_equals_greedy_on_cuda(dtype):
    task = make_task()
    d = task.target_dictionary
    m = on_gpu(make_model(task, arch="transformer_blockwise", seed=3, blockwise_k=4), DTYPES[dtype])
    check_against_greedy(m, d, lambda: BlockwiseHeadsDrafter(m, d), DTYPES[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_feature_ar_equals_greedy_on_cuda(dtype, tmp_path):
    from test_feature_ar import verifier_and_feature_drafter

    task = make_task()
    d = task.target_dictionary
    ar, dr = verifier_and_feature_drafter(task, tmp_path)
    ar, dr = on_gpu(ar, DTYPES[dtype]), on_gpu(dr, DTYPES[dtype])
    check_against_greedy(ar, d, lambda: FeatureARDrafter(dr, d, 4, engine="torch"), DTYPES[dtype])


def test_shipped_uagec_model_iad_on_cuda():
    """The shipped 9+3 GEC model on 64 sentences of the bundled UA-GEC sample, batch 16, float32
    and float16: IAD equals greedy on every sentence but near-ties, and accepts drafts."""
    from pathlib import Path

    from fairseq import checkpoint_utils

    root = Path(__file__).resolve().parents[1]
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(root / "models/uagec-9x3/model.pt")],
        arg_overrides={"data": str(root / "models/uagec-9x3")})
    src_d, tgt_d = task.source_dictionary, task.target_dictionary
    lines = (root / "data/uagec-sample/test.tok.src").read_text(encoding="utf-8").splitlines()[:64]
    from fairseq.data.encoders.subword_nmt_bpe import SubwordNMTBPE, SubwordNMTBPEConfig

    bpe = SubwordNMTBPE(SubwordNMTBPEConfig(bpe_codes=str(root / "models/uagec-9x3/bpe.codes")))
    rows = [src_d.encode_line(bpe.encode(s), add_if_not_exist=False).long().tolist() for s in lines]
    for dtype in (torch.float32, torch.float16):
        model = on_gpu(models[0], dtype)
        counts, failures, accepted = dict(total=0, identical=0, near_ties=0), [], 0
        for j in range(0, len(rows), 16):
            sample = to_gpu(make_sample(rows[j : j + 16], src_d.pad()))
            ref = greedy(model, tgt_d, sample, max_len_a=1.2, max_len_b=10)
            gen = build_generator([model], tgt_d, InputCopyDrafter(src_d, tgt_d), engine="torch",
                                      max_len_a=1.2, max_len_b=10)
            tally(model, tgt_d, sample, ref, gen.generate([model], sample), dtype, counts, failures)
            accepted += gen.stats.accepted
        assert not failures and counts["total"] == len(rows), (dtype, counts, failures[:3])
        assert accepted > 0
