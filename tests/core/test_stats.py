"""DecodeStats: aggregation across calls, JSON output, phase timing and peak memory."""

import json
import mmap

import torch

from mmaccel.core.speculative import LoopConfig, decode
from mmaccel.core.stats import DecodeStats, _rss_mb, track_peak_memory


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
