"""The loop: every greedy method is bit-identical to plain greedy; sampled methods keep the law."""

import pytest
import torch

from mmaccel.core.methods import Resources, build_method
from mmaccel.core.proposers import MedusaHead
from mmaccel.core.sampling import CFG, Sampling
from mmaccel.core.speculative import LoopConfig, decode
from mmaccel.errors import InputError
from mmaccel.lm.hf import HFCausalLM
from tests.conftest import tiny_llama

GREEDY_METHODS = [
    ("speculative", {"k": 3}), ("speculative", {"k": 1}), ("speculative", {"k": 4, "stop_below": 0.9, "siblings": 2}),
    ("tree", {"depth": 3, "width": 2}), ("ngram", {"k": 3}),
    ("sjd", {"window": 4}), ("sjd-coupled", {"window": 4}), ("early-exit", {"k": 3, "exit_layer": 1}),
    ("sjd", {"window": 7, "init": "above", "stride": 3}),
    ("medusa", {"depth": 3, "width": 2}), ("medusa-typical", {"depth": 2}),
]


@pytest.fixture(scope="module")
def resources(target, draft):
    torch.manual_seed(0)
    heads = torch.nn.ModuleList(MedusaHead(64, 97) for _ in range(3))
    return Resources(model=target, draft=draft, heads=heads)


def run(resources, inputs, name, params, **kw):
    method = build_method(name, **params)
    model = kw.pop("model", resources.model)
    return decode(model, inputs, method.loop_config(resources), prompt_tokens=kw.pop("prompt_tokens", inputs), **kw)


@pytest.mark.parametrize("batch", [1, 3, 4])
@pytest.mark.parametrize("name, params", GREEDY_METHODS)
def test_greedy_methods_are_bit_identical_to_greedy(resources, prompts, batch, name, params):
    inputs = prompts[:batch]
    base = run(resources, inputs, "ar", {}, max_new_tokens=24)
    out = run(resources, inputs, name, params, max_new_tokens=24)
    assert out.tokens == base.tokens
    assert out.stats.nfe <= base.stats.nfe


def test_ar_equals_transformers_generate(target, prompts):
    base = decode(target, prompts, LoopConfig(), max_new_tokens=16)
    for prompt, row in zip(prompts, base.tokens):
        ref = target.hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)
        assert ref[0, len(prompt):].tolist() == row


def test_eos_stops_each_row_and_ragged_acceptance_happens(resources, prompts):
    base = run(resources, prompts, "ar", {}, max_new_tokens=30)
    eos = base.tokens[0][5]                      # a token row 0 emits early
    stop = base.tokens[0].index(eos) + 1
    base = run(resources, prompts, "ar", {}, max_new_tokens=30, eos_token_id=eos)
    out = run(resources, prompts, "speculative", {"k": 4}, max_new_tokens=30, eos_token_id=eos)
    assert out.tokens == base.tokens and base.tokens[0][-1] == eos and len(base.tokens[0]) == stop
    assert len(out.stats.accepted_hist) > 1      # rows accepted different lengths


@pytest.mark.parametrize("name, params", [("speculative", {"k": 3}), ("tree", {"depth": 2, "width": 2}), ("sjd", {"window": 3})])
def test_greedy_with_cfg_matches_greedy_cfg(resources, prompts, name, params):
    cfg = CFG(resources.model, scale=2.5)
    cond, uncond = prompts[:2], [p[-1:] for p in prompts[:2]]
    draft = CFG(resources.draft, scale=2.5)
    res = Resources(model=cfg, draft=draft, heads=resources.heads)
    base = run(res, (cond, uncond), "ar", {}, max_new_tokens=16, prompt_tokens=cond, model=cfg)
    out = run(res, (cond, uncond), name, params, max_new_tokens=16, prompt_tokens=cond, model=cfg)
    assert out.tokens == base.tokens
    plain = run(resources, cond, "ar", {}, max_new_tokens=16)
    assert plain.tokens != base.tokens          # guidance changed the output


def test_same_seed_same_output(resources, prompts):
    s = Sampling(temperature=1.0, top_k=20)
    a = run(resources, prompts, "speculative", {"k": 3}, max_new_tokens=12, sampling=s, seed=5)
    b = run(resources, prompts, "speculative", {"k": 3}, max_new_tokens=12, sampling=s, seed=5)
    c = run(resources, prompts, "speculative", {"k": 3}, max_new_tokens=12, sampling=s, seed=6)
    assert a.tokens == b.tokens and a.tokens != c.tokens


@pytest.mark.parametrize("name, params", [("speculative", {"k": 3}), ("sjd-coupled", {"window": 4}),
                                          ("sjd-coupled", {"window": 7, "init": "above", "stride": 3}),
                                          ("tree", {"depth": 2, "width": 2})])
def test_coupled_methods_reproduce_coupled_ar_sampling(resources, prompts, name, params):
    s = Sampling(temperature=1.0)
    ar = decode(resources.model, prompts, LoopConfig(coupled=True), max_new_tokens=16, sampling=s, seed=9)
    method = build_method(name, **params)
    cfg = method.loop_config(resources)
    cfg = LoopConfig(cfg.proposer, "coupled", cfg.k, cfg.tree, coupled=True)
    out = decode(resources.model, prompts, cfg, max_new_tokens=16, sampling=s, seed=9, prompt_tokens=prompts)
    assert out.tokens == ar.tokens


# --- distribution of sampled decoding, on a model with a 6-token vocabulary -----------------------

VOCAB = 6
ROWS = 6000


@pytest.fixture(scope="module")
def small_vocab():
    target = HFCausalLM(tiny_llama(3, layers=2, hidden=32, vocab=VOCAB))
    draft = HFCausalLM(tiny_llama(4, layers=1, hidden=32, vocab=VOCAB))
    for m in (target, draft):
        with torch.no_grad():
            m.hf.lm_head.weight.mul_(0.4)         # soften, so every token keeps real mass
    return Resources(model=target, draft=draft)


def exact_triple_law(model, prompt):
    """p(x0, x1, x2 | prompt) [6, 6, 6], from the model directly."""
    def next_law(seq):
        return model.prefill([seq], room=4).logits[0].softmax(-1)
    law = torch.zeros(VOCAB, VOCAB, VOCAB)
    p0 = next_law(prompt)
    for a in range(VOCAB):
        p1 = next_law(prompt + [a])
        for b in range(VOCAB):
            law[a, b] = p0[a] * p1[b] * next_law(prompt + [a, b])
    return law


def sampled_triples(res, name, params, prompt):
    inputs = [prompt] * ROWS
    cfg = build_method(name, **params).loop_config(res)
    out = decode(res.model, inputs, cfg, max_new_tokens=3, sampling=Sampling(temperature=1.0), seed=1234,
                 prompt_tokens=inputs)
    return torch.tensor(out.tokens)                     # [ROWS, 3]


def chi2_rejects(samples: torch.Tensor, law: torch.Tensor) -> bool:
    """Pearson chi-square goodness of fit at level 0.001 (Wilson-Hilferty critical value)."""
    counts = torch.bincount(samples, minlength=law.numel()).double()
    expected = law.flatten().double() * samples.numel()
    stat = ((counts - expected) ** 2 / expected).sum().item()
    df = law.numel() - 1
    critical = df * (1 - 2 / (9 * df) + 3.09 * (2 / (9 * df)) ** 0.5) ** 3
    return stat > critical


def pair_tests(triples, law):
    """The (x0, x1) and (x1, x2) pair laws: x1 and x2 are emitted by drafting + verification."""
    first = triples[:, 0] * VOCAB + triples[:, 1]
    second = triples[:, 1] * VOCAB + triples[:, 2]
    return chi2_rejects(first, law.sum(2)), chi2_rejects(second, law.sum(0))


@pytest.mark.parametrize("name, params", [("speculative", {"k": 2}), ("sjd", {"window": 3}), ("ngram", {"k": 2}),
                                          ("tree", {"depth": 2, "width": 2}), ("sjd-coupled", {"window": 3}),
                                          ("sjd", {"window": 3, "init": "above", "stride": 1}), ("ar", {})])
def test_sampled_methods_reproduce_the_target_law(small_vocab, name, params):
    prompt = [1, 2, 3]
    law = exact_triple_law(small_vocab.model, prompt)
    assert pair_tests(sampled_triples(small_vocab, name, params, prompt), law) == (False, False)


def test_negative_control_always_accept_fails(small_vocab, monkeypatch):
    import mmaccel.core.acceptance as acc
    real = acc.accept_speculative
    monkeypatch.setitem(acc.RULES, "speculative",
                        lambda d, q, p, u, e, **kw: real(d, q, p, torch.zeros_like(u), e))
    prompt = [1, 2, 3]
    law = exact_triple_law(small_vocab.model, prompt)
    assert pair_tests(sampled_triples(small_vocab, "speculative", {"k": 2}, prompt), law) == (True, True)


@pytest.mark.parametrize("name, params, message", [
    ("nope", {}, "unknown method"), ("speculative", {"k": 0}, "k must be"), ("speculative", {"k": -2}, "k must be"),
    ("tree", {"depth": 0}, "depth"), ("sjd", {"window": 0}, "window"), ("ngram", {"foo": 1}, "does not take"),
    ("medusa-typical", {"epsilon": 2.0}, "epsilon"), ("sjd", {"init": "zeros"}, "init"),
    ("sjd", {"init": "above"}, "row width"), ("sjd", {"init": "above", "stride": -1}, "stride must be"),
    ("speculative", {"siblings": 2}, "need stop_below"), ("speculative", {"siblings": -1, "stop_below": 0.5}, "siblings must be"),
])
def test_bad_method_arguments(resources, prompts, name, params, message):
    with pytest.raises(InputError, match=message):
        build_method(name, **params).loop_config(resources)


def test_fresh_guesses_from_one_row_up(resources, prompts):
    """init "above": a fresh guess is the emitted token `stride` back, or the window's own guess a row back."""
    from mmaccel.core.jacobi import JacobiProposer
    from mmaccel.core.proposers import DraftContext

    proposer = JacobiProposer(window=5, mode="greedy", init="above", stride=2)
    emitted = torch.tensor([[7, 8, 9, -1, -1, -1], [5, 4, -1, -1, -1, -1]])
    ctx = DraftContext(pending=torch.tensor([9, 4]), history=[], num_generated=torch.tensor([3, 2]),
                       sampling=Sampling(), sampler=None, emitted=emitted)
    proposer.start(None, 0, ctx)
    drafts = proposer.propose(ctx, 5).tokens
    # row 0: entries are generated indices 3..7; one row up: 1, 2 (emitted), then the window's own guesses
    assert drafts.tolist() == [[8, 9, 8, 9, 8], [5, 4, 5, 4, 5]]


def test_the_jacobi_window_resizes_keeping_its_first_guesses():
    from mmaccel.core.jacobi import JacobiProposer
    from mmaccel.core.proposers import DraftContext

    proposer = JacobiProposer(window=4, mode="greedy")
    ctx = DraftContext(pending=torch.tensor([3, 5]), history=[], num_generated=torch.tensor([1, 1]),
                       sampling=Sampling(), sampler=None)
    proposer.start(None, 0, ctx)
    proposer.tokens = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    proposer.fresh = torch.tensor([[False] * 4, [False, False, True, True]])
    assert proposer.propose(ctx, 2).tokens.tolist() == [[1, 2], [5, 6]] and proposer.window == 2
    proposer.resize(4, ctx)                               # topped up with fresh guesses: the last one repeated
    assert proposer.tokens.tolist() == [[1, 2, 2, 2], [5, 6, 6, 6]]
    assert proposer.fresh.tolist() == [[False, False, True, True]] * 2
    with pytest.raises(InputError, match="window"):
        proposer.resize(0, ctx)


def test_a_plug_in_changing_the_jacobi_width_every_pass_keeps_greedys_tokens(resources, prompts):
    import itertools

    from mmaccel.core.jacobi import JacobiProposer
    from mmaccel.core.methods import Method

    class Cycling(JacobiProposer):
        """A width per pass from a schedule, through the public `propose(ctx, k)`."""

        widths = itertools.cycle([4, 1, 3, 2, 4, 4])

        def propose(self, ctx, k):
            return super().propose(ctx, min(k, next(self.widths)))

    method = Method("jacobi-cycling", "Jacobi, its width changing by pass", lambda r: Cycling(4, "greedy"), k=4)
    base = run(resources, prompts, "ar", {}, max_new_tokens=20)
    out = decode(resources.model, prompts, method.loop_config(resources), prompt_tokens=prompts, max_new_tokens=20)
    assert out.tokens == base.tokens and out.stats.nfe <= base.stats.nfe


def test_bad_sampling_and_lengths(resources, prompts):
    with pytest.raises(InputError, match="temperature"):
        Sampling(temperature=-1.0)
    with pytest.raises(InputError, match="top_p"):
        Sampling(temperature=1.0, top_p=0.0)
    with pytest.raises(InputError, match="cfg_scale"):
        CFG(resources.model, scale=-1)
    with pytest.raises(InputError, match="max_new_tokens"):
        run(resources, prompts, "ar", {}, max_new_tokens=0)
    with pytest.raises(InputError, match="needs a draft"):
        build_method("speculative").loop_config(Resources(model=resources.model))


class OracleProposer:
    """Proposes the known greedy continuation for row 0 and junk for the others (ragged extremes)."""

    needs_hidden = False

    def __init__(self, truth):
        self.truth = truth

    def start(self, inputs, room, ctx):
        pass

    def passes(self):
        return 0

    def propose(self, ctx, k):
        from mmaccel.core.proposers import Draft
        rows = []
        for b, n in enumerate(ctx.num_generated.tolist()):
            good = self.truth[b][n : n + k]
            rows.append(good + [0] * (k - len(good)) if b == 0 else [0] * k)
        return Draft(torch.tensor(rows))

    def observe(self, *args):
        pass


def test_rows_finishing_at_different_steps_stay_within_the_cache(target, prompts):
    """Regression: a finished row still takes one fed block before rollback; the cache must have room."""
    long_first = sorted(prompts, key=len, reverse=True)
    truth = decode(target, long_first, LoopConfig(), max_new_tokens=20).tokens
    out = decode(target, long_first, LoopConfig(OracleProposer(truth), k=6), max_new_tokens=10)
    assert out.tokens == [t[:10] for t in truth]
    assert out.stats.accepted_hist[7] >= 2          # row 0 overshot max_new_tokens by whole drafts


@pytest.mark.parametrize("name, params", [("ar", {}), ("speculative", {"k": 3}), ("tree", {"depth": 3, "width": 2}),
                                          ("sjd", {"window": 4})])
def test_commit_pass_says_which_pass_committed_each_token(resources, prompts, name, params):
    out = run(resources, prompts, name, params, max_new_tokens=20)
    for tokens, passes in zip(out.tokens, out.commit_pass):
        assert len(passes) == len(tokens) and passes[0] == 1                # the prefill commits the first token
        assert all(a <= b for a, b in zip(passes, passes[1:])) and passes[-1] <= out.stats.nfe
        # a verify pass commits the accepted drafts and one token of its own, at most k + 1 (or depth + 1)
        assert max(passes.count(p) for p in set(passes)) <= 1 + params.get("k", params.get("depth", params.get("window", 0)))
    if name == "ar":
        assert out.commit_pass == [list(range(1, len(t) + 1)) for t in out.tokens]
    else:
        assert any(len(set(p)) < len(p) for p in out.commit_pass)             # some pass accepted a draft
