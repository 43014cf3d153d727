"""Adaptive drafting: greedy's tokens whatever each pass drafts; draft lengths from acceptance and measured cost."""

import pytest
import torch

from mmaccel.core.adaptive import PROBE_AFTER, AdaptiveDrafting, DraftLengths, PassCosts, Pooled
from mmaccel.core.methods import Resources, build_method
from mmaccel.core.proposers import MedusaHead, RaggedRows
from mmaccel.core.sampling import Sampling
from mmaccel.core.speculative import decode
from tests.conftest import scripted

METHODS = [("speculative", {"k": 3}), ("speculative", {"k": 4, "stop_below": 0.9, "siblings": 2}),
           ("tree", {"depth": 3, "width": 2}), ("ngram", {"k": 3}), ("early-exit", {"k": 3, "exit_layer": 1}),
           ("medusa", {"depth": 3, "width": 2})]


@pytest.fixture(scope="module")
def resources(target, draft):
    torch.manual_seed(0)
    heads = torch.nn.ModuleList(MedusaHead(64, 97) for _ in range(3))
    return Resources(model=target, draft=draft, heads=heads)


def run(resources, inputs, name, params, adaptive=None, **kw):
    config = build_method(name, **params).loop_config(resources, adaptive)
    return decode(resources.model, inputs, config, prompt_tokens=inputs, **kw)


@pytest.mark.parametrize("schedule", [(3, 0, 0, 2, 0, 1), (0, 0, 3, 0, 2, 1)])       # the second starts plain
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name, params", METHODS)
def test_passes_drafting_less_or_nothing_keep_greedys_tokens(resources, prompts, monkeypatch, batch, name, params,
                                                             schedule):
    scripted(monkeypatch, schedule)
    base = run(resources, prompts[:batch], "ar", {}, max_new_tokens=24)
    out = run(resources, prompts[:batch], name, params, AdaptiveDrafting(), max_new_tokens=24)
    assert out.tokens == base.tokens
    assert out.stats.accepted_hist.get(1, 0) > 0         # plain steps happened


def test_a_perfect_draft_is_accepted_whole_after_plain_steps(target, prompts, monkeypatch):
    # the draft (the target itself) catches up on the tokens of the plain steps: were one missed, its
    # next drafts would be off by a position and rejected
    scripted(monkeypatch, (3, 0, 0))
    resources = Resources(model=target, draft=target)
    base = run(resources, prompts, "ar", {}, max_new_tokens=24)
    out = run(resources, prompts, "speculative", {"k": 3}, AdaptiveDrafting(), max_new_tokens=24)
    assert out.tokens == base.tokens and set(out.stats.accepted_hist) == {1, 4}


def test_the_measured_choice_keeps_greedys_tokens_and_costs_carry_over(resources, prompts):
    adaptive = AdaptiveDrafting()
    base = run(resources, prompts, "ar", {}, max_new_tokens=24)
    for _ in range(2):
        assert run(resources, prompts, "speculative", {"k": 3}, adaptive, max_new_tokens=24).tokens == base.tokens
    (key, costs), = adaptive.costs.items()
    assert key == ("DraftModelProposer", 3, None, len(prompts)) and 0 in costs.seconds and sum(costs.seen.values()) > 4
    assert len(adaptive.pooled[key[:3]].reach) == 3             # by method, whatever the batch size


def test_sampled_rules_keep_k_fixed(resources, prompts):
    """Seeded draws depend on the pass widths: a sampled run drafts k every pass, adaptive or not."""
    sampling = Sampling(temperature=1.0)
    fixed = run(resources, prompts, "speculative", {"k": 3}, max_new_tokens=16, sampling=sampling, seed=3)
    adaptive = AdaptiveDrafting()
    out = run(resources, prompts, "speculative", {"k": 3}, adaptive, max_new_tokens=16, sampling=sampling, seed=3)
    assert out.tokens == fixed.tokens and out.stats.nfe == fixed.stats.nfe and not adaptive.costs


def _costs(plain=1.0, per_draft=0.5, most=4):
    costs = PassCosts()
    for _ in range(3):
        for d in range(most + 1):
            costs.add(d, plain + per_draft * d)
    return costs


def _plain_steps_before_a_probe(lengths, rows=1):
    for n in range(1000):
        if lengths.choose([True] * rows):
            return n
        lengths.record(0, [0] * rows, [True] * rows, 1.0)


def test_drafting_stops_when_drafts_are_rejected_and_probes_again():
    lengths = DraftLengths(_costs(), Pooled(), rows=2, most=4)
    for _ in range(3):
        lengths.record(4, [0, 0], [True, True], 3.0)
    assert lengths.choose([True, True]) == 0
    # drafts once more to see acceptance, after more plain steps where a probe costs more
    cheap = _plain_steps_before_a_probe(lengths, 2)
    assert cheap >= PROBE_AFTER
    costly = DraftLengths(_costs(per_draft=2.0), Pooled(), rows=1, most=4)
    for _ in range(3):
        costly.record(4, [0], [True], 9.0)
    assert _plain_steps_before_a_probe(costly) > 3 * cheap


def test_a_new_call_starts_from_what_the_methods_earlier_calls_showed():
    adaptive = AdaptiveDrafting()
    adaptive.costs[("m", 4, None, 1)] = _costs()
    first = adaptive.for_call(("m", 4, None), rows=1, most=4)
    assert first.choose([True]) >= 1                            # the prior: drafts are often accepted
    for _ in range(30):
        first.record(first.choose([True]) or 1, [0], [True], 2.0)
    second = adaptive.for_call(("m", 4, None), rows=1, most=4)
    assert second.choose([True]) == 0                           # its rows start plain: the method's drafts fail
    assert adaptive.for_call(("other", 4, None), rows=1, most=4).choose([True]) >= 1


def test_accepted_drafts_keep_the_longest_chain_that_pays():
    lengths = DraftLengths(_costs(), Pooled(), rows=2, most=4)
    for _ in range(3):
        lengths.record(4, [4, 4], [True, True], 3.0)
    assert lengths.choose([True, True]) == 4
    expensive = DraftLengths(_costs(per_draft=2.0), Pooled(), rows=1, most=4)
    for _ in range(3):
        expensive.record(4, [2], [True], 9.0)              # ~2 of 4 accepted: not worth 3x a plain step
    assert expensive.choose([True]) == 0
    short = DraftLengths(_costs(), Pooled(), rows=1, most=4)
    for _ in range(3):
        short.record(4, [1], [True], 3.0)                       # this row's chains stop after one draft:
    assert short.choose([True]) == 1                            # asking for more gains nothing


def test_a_plain_step_is_measured_once_before_choosing():
    costs = PassCosts()
    lengths = DraftLengths(costs, Pooled(), rows=1, most=3, depth=2)
    assert lengths.choose([True]) == 3                          # a tree of 3 nodes, 2 deep
    lengths.record(3, [2], [True], 2.0)
    assert lengths.choose([True]) == 0                          # what drafting has to beat
    lengths.record(0, [0], [True], 1.0)
    assert lengths.choose([True]) == 3                          # about 3 tokens for 2 s against 1 for 1 s
    for _ in range(4):
        lengths.record(3, [0], [True], 2.0)
    assert lengths.choose([True]) == 0


def test_pass_costs_between_the_counts_seen():
    costs = PassCosts()
    costs.add(4, 3.0)
    assert costs.estimate(4) == 3.0 and costs.estimate(2) is None and costs.estimate(0) is None
    costs.add(0, 1.0)                                   # half of 4 drafts' extra second is drafting at all
    assert costs.estimate(2) == pytest.approx(2.5) and costs.estimate(1) == pytest.approx(2.25)
    costs.add(2, 2.0)                                   # then a line through the draft counts seen
    assert costs.estimate(3) == pytest.approx(2.5) and costs.estimate(1) == pytest.approx(1.5)


def test_a_measured_shape_prices_the_widths_not_seen():
    costs = PassCosts(shape=lambda d: 1.0 + 0.25 * d)       # the target's pass by width, relative to one token
    assert costs.estimate(0) == 1.0 and costs.estimate(4) == 2.0        # before any pass: the shape itself
    costs.add(0, 2.0)                                       # a plain step sets the scale
    assert costs.estimate(4) == pytest.approx(4.0)
    costs.add(4, 5.0)                                       # 1 s beyond the target's width: drafting, 0.25 s a draft
    assert costs.estimate(2) == pytest.approx(2.0 * 1.5 + 0.5) and costs.estimate(0) == 2.0
    cheap = PassCosts(shape=costs.shape)
    cheap.add(0, 2.0)
    cheap.add(4, 3.0)                                       # cheaper than the shape says: drafting costs no less than 0
    assert cheap.estimate(2) == pytest.approx((2.0 + 2 * 3.0) / (1 + 2 * 2) * 1.5)      # a fitted, b = 0


def test_with_a_shape_the_first_pass_is_chosen_not_forced():
    flat, steep = (DraftLengths(PassCosts(shape=shape), Pooled(), rows=1, most=4)
                   for shape in (lambda d: 1.0 + 0.05 * d, lambda d: 1.0 + d))
    assert flat.choose([True]) == 4                         # cheap widths: the prior's acceptance pays for all 4
    assert steep.choose([True]) == 0                        # each draft costs a plain step: none pays
    flat.record(4, [0], [True], 1.2)
    assert flat.choose([True]) == 0                         # once it drafted, a plain step is measured once


def test_the_prior_is_asked_once_per_batch_size():
    asked = []
    adaptive = AdaptiveDrafting(prior=lambda rows: asked.append(rows) or (lambda d: 1.0 + d / rows))
    for rows in (1, 8, 1):
        adaptive.for_call(("m", 4, None), rows=rows, most=4)
    assert asked == [1, 8] and adaptive.costs[("m", 4, None, 8)].shape(8) == 2.0
    assert AdaptiveDrafting(prior=lambda rows: None).for_call(("m", 4, None), 1, 4).costs.shape is None


def test_ragged_rows_keep_each_rows_own_entries_in_order():
    a, b = torch.tensor([[1, 2, 0], [3, 0, 0]]), torch.tensor([[7, 8], [9, 0]])
    rows = RaggedRows(a, torch.tensor([2, 1])).append(b, torch.tensor([2, 1]))
    assert rows.counts.tolist() == [4, 2] and rows.block.shape == (2, 5)
    assert rows.block[0, :4].tolist() == [1, 2, 7, 8] and rows.block[1, :2].tolist() == [3, 9]
    assert a.tolist() == [[1, 2, 0], [3, 0, 0]]                 # the starting block is never written
    features = RaggedRows(a[..., None].expand(-1, -1, 2), torch.tensor([2, 1]))
    features.append(b[..., None].expand(-1, -1, 2), torch.tensor([2, 1]))
    assert features.block[0, :4, 1].tolist() == [1, 2, 7, 8] and features.block.shape == (2, 5, 2)


def test_ragged_rows_grow_one_entry_at_a_time_as_a_join_would():
    rows, expected = RaggedRows(torch.tensor([[5], [6]]), torch.tensor([1, 0])), [[5], []]
    for step in range(40):                      # past several doublings of the spare columns
        active = torch.tensor([True, step % 3 == 0])
        rows.append(torch.tensor([[step], [100 + step]]), active.long())
        expected[0].append(step)
        if step % 3 == 0:
            expected[1].append(100 + step)
    assert rows.block.shape == (2, 41) and rows.counts.tolist() == [41, 14]
    assert [r[:c].tolist() for r, c in zip(rows.block, rows.counts)] == expected