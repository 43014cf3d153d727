"""DecodeStats: aggregation across calls, JSON output, phase timing and peak memory."""

import json
import mmap
from collections import Counter
from dataclasses import fields

import pytest
import torch

from mmaccel.core import stats as stats_module
from mmaccel.core.speculative import LoopConfig, decode
from mmaccel.core.stats import MERGES, DecodeStats, _rss_mb, counters, declare_counter, track_peak_memory


def test_stats_aggregate_and_serialise(target, prompts):
    a = decode(target, prompts[:2], LoopConfig(), max_new_tokens=5).stats
    b = decode(target, prompts[2:], LoopConfig(), max_new_tokens=7).stats
    total = a + b
    assert total.nfe == a.nfe + b.nfe == 12 and total.new_tokens == 2 * 5 + 2 * 7
    assert total.mean_accepted == 1.0 and sum(total.accepted_hist.values()) == 2 * 4 + 2 * 6
    assert set(total.time_s) >= {"prefill", "verify", "total"} and total.wall_s >= a.wall_s
    doc = json.loads(json.dumps(total.to_dict()))
    assert doc["nfe"] == 12 and doc["accepted_hist"] == {"1": 20} and doc["peak_mem_mb"] > 0


def _spike(mb: int) -> None:
    """Map `mb` MB of fresh anonymous memory, touch every page, unmap it: a resident-set spike
    whatever the allocator keeps (a freed torch tensor's pages may be reused without a new peak)."""
    with mmap.mmap(-1, mb * 2**20) as m:
        for i in range(0, len(m), mmap.PAGESIZE):
            m[i] = 1


def test_peak_memory_sees_a_large_allocation():
    stats = DecodeStats()
    before = _rss_mb()
    with track_peak_memory(stats):
        _spike(256)                         # 256 MB, touched, freed before the block ends
    assert stats.peak_mem_mb >= before + 200 > _rss_mb()


def test_nested_peaks_keep_the_outer_spike():
    outer, inner = DecodeStats(), DecodeStats()
    before = _rss_mb()
    with track_peak_memory(outer):
        _spike(256)                         # the outer block's spike, freed before the inner block
        with track_peak_memory(inner):
            torch.ones(8).add_(1)
    assert outer.peak_mem_mb >= before + 200 > inner.peak_mem_mb


def test_mean_accepted_from_histogram():
    s = DecodeStats()
    s.record_accepted([1, 3, 3, 5])
    assert s.mean_accepted == 3.0


def _two_values(spec) -> tuple:
    """Two different non-default values of a counter's kind, exact at one decimal digit."""
    kind = type(spec.default)
    return {int: (3, 5), float: (1.5, 2.5), str: ("cuda:0", "cuda:1"), list: ([0.5], [1.5, 2.5]),
            dict: ({"prefill": 0.5, "total": 1.5}, {"total": 2.5, "verify": 0.5}),
            Counter: (Counter({1: 2, 3: 1}), Counter({3: 4, 5: 1}))}[kind]


def _expected_merge(rule: str, a, b):
    """Each merge rule, written out independently of `MERGES`."""
    if rule == "sum_per_key":
        return type(a)({k: a.get(k, 0) + b.get(k, 0) for k in [*a, *(k for k in b if k not in a)]})
    return {"sum": lambda: a + b, "max": lambda: max(a, b), "last": lambda: b, "concat": lambda: a + b}[rule]()


def _pair() -> tuple[DecodeStats, DecodeStats]:
    a, b = DecodeStats(), DecodeStats()
    for spec in counters():
        va, vb = _two_values(spec)
        setattr(a, spec.name, va)
        setattr(b, spec.name, vb)
    return a, b


def test_every_field_is_a_declared_counter_with_a_rule_and_help():
    declared = [spec.name for spec in counters() if not spec.extra]
    assert declared == [f.name for f in fields(DecodeStats) if f.name != "extra"]
    assert {"nfe", "draft_passes", "new_tokens", "accepted_hist", "time_s", "peak_mem_mb", "device", "deviation",
            "deviation_per_row", "exit_hist", "cache_mb"} <= set(declared)
    for spec in counters():
        assert spec.merge in MERGES and spec.help, spec
    with pytest.raises(ValueError, match="merge must be one of"):
        stats_module.counter(0, merge="mean", help="x")


def test_add_follows_each_counters_merge_rule():
    a, b = _pair()
    before = (a.to_dict(), b.to_dict())
    total = a + b
    for spec in counters():
        va, vb = _two_values(spec)
        expected = _expected_merge(spec.merge, va, vb)
        assert getattr(total, spec.name) == expected and type(getattr(total, spec.name)) is type(expected), spec.name
    assert (a.to_dict(), b.to_dict()) == before                  # the operands are left as they were
    assert (DecodeStats() + DecodeStats()).to_dict() == DecodeStats().to_dict()


def test_every_counter_round_trips_through_json():
    a, b = _pair()
    for x in (a, b, a + b, DecodeStats()):
        doc = json.loads(json.dumps(x.to_dict()))
        back = DecodeStats.from_dict(doc)
        for spec in counters():
            assert getattr(back, spec.name) == getattr(x, spec.name), spec.name
            assert type(getattr(back, spec.name)) is type(spec.default), spec.name
        assert back.to_dict() == x.to_dict()


def test_json_layout_is_unchanged():
    """The keys, values and order that committed benchmark JSON and resumed evaluations hold."""
    empty = DecodeStats()
    assert json.dumps(empty.to_dict()) == (
        '{"nfe": 0, "draft_passes": 0, "new_tokens": 0, "mean_accepted": 0.0, "accepted_hist": {}, "time_s": {}, '
        '"peak_mem_mb": 0.0, "device": "cpu", "deviation": 0.0, "deviation_per_row": []}')
    full = DecodeStats(nfe=7, draft_passes=3, new_tokens=12, accepted_hist=Counter({3: 1, 1: 2}),
                       time_s={"prefill": 0.1234567, "total": 1.0}, peak_mem_mb=123.456, device="cuda:0",
                       deviation=0.01234567, deviation_per_row=[0.0123456789], exit_hist=Counter({4: 2, 2: 1}),
                       cache_mb=1.23456)
    assert json.dumps(full.to_dict()) == (
        '{"nfe": 7, "draft_passes": 3, "new_tokens": 12, "mean_accepted": 1.6667, "accepted_hist": {"1": 2, "3": 1}, '
        '"time_s": {"prefill": 0.123457, "total": 1.0}, "peak_mem_mb": 123.5, "device": "cuda:0", "deviation": 0.012346, '
        '"deviation_per_row": [0.012346], "exit_hist": {"2": 1, "4": 2}, "mean_exit_layer": 3.3333, "cache_mb": 1.235}')
    assert "deviation_per_row" not in full.to_dict(summary=True)
    assert full.reported() == {"exit_hist": {"2": 1, "4": 2}, "mean_exit_layer": 3.3333, "cache_mb": 1.235}
    assert empty.reported() == {}


def test_a_method_declares_a_counter_in_its_own_module(monkeypatch):
    monkeypatch.setattr(stats_module, "_EXTRA", dict(stats_module._EXTRA))      # forget it after the test
    declare_counter("test_restarts", merge="sum", help="restarts of a test method")
    declare_counter("test_widths", Counter(), merge="sum_per_key", help="window width -> how often")
    declare_counter("test_restarts", merge="sum", help="restarts of a test method")  # a reloaded module: no-op
    a, b = DecodeStats(), DecodeStats()
    assert a.test_restarts == 0 and "test_restarts" not in a.to_dict()
    assert a.to_dict() == DecodeStats().to_dict()            # unused, it leaves the JSON as it was
    a.test_restarts += 2
    a.test_widths.update([4, 4, 8])
    b.test_restarts = 3
    total = a + b
    assert total.test_restarts == 5 and total.test_widths == {4: 2, 8: 1}
    doc = json.loads(json.dumps(total.to_dict()))
    assert list(doc)[-2:] == ["test_restarts", "test_widths"] and doc["test_widths"] == {"4": 2, "8": 1}
    back = DecodeStats.from_dict(doc)
    assert back.test_restarts == 5 and back.test_widths == Counter({4: 2, 8: 1}) and back == total
    assert total.reported() == {"test_restarts": 5, "test_widths": {"4": 2, "8": 1}}
    with pytest.raises(ValueError, match="already declared"):
        declare_counter("test_restarts", merge="max", help="restarts of a test method")
    with pytest.raises(ValueError, match="already a DecodeStats attribute"):
        declare_counter("nfe", help="target passes again")
    with pytest.raises(AttributeError):
        _ = DecodeStats().test_undeclared
