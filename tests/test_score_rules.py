"""fairseq's score rules, one table both verifiers must satisfy: pad is never
chosen, the unk penalty, the minimum length, EOS forced at the length cap and
the temperature, a forced first token.  Each case makes one token dominate the model's output (so
the rule decides what is emitted), steps the verifier through its
:class:`~fairseq_aggressive.verifiers.Verifier` interface (one token per pass,
then greedy's own output as drafts, several positions per pass), and checks
the tokens and scores against fairseq's ``SequenceGenerator`` and the rule's
visible effect."""
import pytest
import torch

from helpers import greedy, make_model, make_sample, make_task, random_rows

from fairseq_aggressive.acceptance import ExactAcceptance
from fairseq_aggressive.engines import build_verifier
from fairseq_aggressive.native import available
from fairseq_aggressive.verifiers import ScoreRules

ENGINES = ["torch"] + (["native"] if available() is None else [])


def dominant(model, token: int, strength: float = 8.0) -> None:
    """Make ``token`` the model's top choice at every position: the last
    layer's final norm adds a fixed direction, the output row of ``token`` reads it."""
    torch.manual_seed(0)
    e = torch.randn(model.decoder.embed_dim)
    e /= e.norm()
    with torch.no_grad():
        model.decoder.layers[-1].final_layer_norm.bias += strength * e
        model.decoder.output_projection.weight[token] = strength * e


# name, the dominant token, ScoreRules fields, max_len, what the outputs show
CASES = [
    ("pad never", "pad", {}, 12, lambda d, o: d.pad() not in o),
    ("unk without a penalty", "unk", {}, 12, lambda d, o: o[0] == d.unk()),
    ("unk penalty", "unk", {"unk_penalty": 1000.0}, 12, lambda d, o: d.unk() not in o),
    ("minimum length", "eos", {"min_len": 4}, 12, lambda d, o: o.index(d.eos()) == 4 and len(o) == 5),
    ("EOS forced at the cap", "word", {}, 5, lambda d, o: len(o) == 6 and o[-1] == d.eos() and o[0] == 10),
    ("temperature", "word", {"temperature": 3.0}, 8, lambda d, o: o[0] == 10),
    # fairseq's prefix token (transformers' forced_bos_token_id): scored by its log-probability
    ("forced first token", "word", {"forced": 20}, 8, lambda d, o: o[0] == 20 and o[1] == 10),
    ("forced first token, unk", "word", {"forced": 3, "unk_penalty": 2.0}, 8, lambda d, o: o[0] == 3 and o[1] == 10),
]


def verify(verifier, sample, max_len: int, drafts=None):
    """Decode a batch through the verifier: [last] + up to 3 drafted tokens per pass."""
    B = sample["net_input"]["src_tokens"].size(0)
    eos = verifier.rules.eos
    verifier.begin(sample, max_len)
    outs, scores = [[] for _ in range(B)], [[] for _ in range(B)]
    active, passes = list(range(B)), 0
    with verifier.running():
        while active:
            rows = [[outs[b][-1] if outs[b] else eos] + (drafts[b][len(outs[b]): len(outs[b]) + 3] if drafts else [])
                    for b in active]
            res = verifier.step(active, rows)
            passes += 1
            for i, b in enumerate(active):
                outs[b] += res.emit[i]
                scores[b] += res.scores[i]
            active = [b for i, b in enumerate(active) if not res.done[i]]
    return outs, scores, passes


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name,token,fields,max_len,shows", CASES, ids=[c[0] for c in CASES])
def test_score_rules_table(engine, name, token, fields, max_len, shows):
    task = make_task()
    d = task.target_dictionary
    model = make_model(task, seed=3)
    dominant(model, {"pad": d.pad(), "unk": d.unk(), "eos": d.eos(), "word": 10}[token])
    rules = ScoreRules(d.pad(), d.unk(), d.eos(), **fields)
    sample = make_sample(random_rows(d, 3, 4, 9, seed=5), d.pad())
    prefix = None if rules.forced is None else torch.full((sample["net_input"]["src_tokens"].size(0), 1),
                                                           rules.forced)
    ref = greedy(model, d, sample, max_len_a=0, max_len_b=max_len, min_len=rules.min_len,
                 unk_penalty=rules.unk_penalty, temperature=rules.temperature, prefix_tokens=prefix)
    ref_tokens = [r[0]["tokens"].tolist() for r in ref]
    ref_scores = [r[0]["positional_scores"] for r in ref]
    verifier = build_verifier(engine, model, d, ExactAcceptance(), rules)
    assert verifier.name == engine
    wrong = [[10] * len(r) for r in ref_tokens]  # the dominant token everywhere: rejected where a rule decides
    for drafts in (None, wrong, ref_tokens):
        outs, scores, passes = verify(verifier, sample, max_len, drafts)
        assert outs == ref_tokens, (name, engine, drafts is not None)
        for s, r in zip(scores, ref_scores):
            assert torch.allclose(torch.tensor(s), r, atol=1e-4), (name, engine)
        if drafts is ref_tokens:  # several positions per pass: fewer passes than tokens
            assert passes < max(len(o) for o in outs)
    assert all(shows(d, o) for o in outs), (name, outs)
