"""DecodeStats: what a decoding call cost — target/draft passes, accepted lengths, time, memory."""

from __future__ import annotations

import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


@dataclass
class DecodeStats:
    """Counters of one or more decoding calls; `+` aggregates, `to_dict()` is JSON-ready.

    nfe counts target forward passes including the prefill (plain AR: one per generated token).
    The accepted-length histogram counts, per verifying target pass and per active row, the tokens
    that pass emitted (1 for plain AR, up to K+1 for K drafts).
    """

    nfe: int = 0
    draft_passes: int = 0
    new_tokens: int = 0
    accepted_hist: Counter = field(default_factory=Counter)
    time_s: dict[str, float] = field(default_factory=dict)
    peak_mem_mb: float = 0.0
    device: str = "cpu"
    deviation: float = 0.0   # summed TV budget spent by relaxed rules (0 for lossless ones)
    deviation_per_row: list[float] = field(default_factory=list)  # the same, per generated sequence

    @property
    def mean_accepted(self) -> float:
        steps = sum(self.accepted_hist.values())
        return sum(k * v for k, v in self.accepted_hist.items()) / steps if steps else 0.0

    @property
    def wall_s(self) -> float:
        return self.time_s.get("total", sum(self.time_s.values()))

    def record_accepted(self, lengths: list[int]) -> None:
        self.accepted_hist.update(lengths)

    @contextmanager
    def timed(self, phase: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.time_s[phase] = self.time_s.get(phase, 0.0) + time.perf_counter() - t0

    def __add__(self, other: "DecodeStats") -> "DecodeStats":
        times = dict(self.time_s)
        for k, v in other.time_s.items():
            times[k] = times.get(k, 0.0) + v
        return DecodeStats(
            nfe=self.nfe + other.nfe, draft_passes=self.draft_passes + other.draft_passes,
            new_tokens=self.new_tokens + other.new_tokens,
            accepted_hist=self.accepted_hist + other.accepted_hist, time_s=times,
            peak_mem_mb=max(self.peak_mem_mb, other.peak_mem_mb), device=other.device,
            deviation=self.deviation + other.deviation,
            deviation_per_row=self.deviation_per_row + other.deviation_per_row)

    def to_dict(self) -> dict:
        return {
            "nfe": self.nfe, "draft_passes": self.draft_passes, "new_tokens": self.new_tokens,
            "mean_accepted": round(self.mean_accepted, 4),
            "accepted_hist": {str(k): v for k, v in sorted(self.accepted_hist.items())},
            "time_s": {k: round(v, 6) for k, v in self.time_s.items()},
            "peak_mem_mb": round(self.peak_mem_mb, 1), "device": self.device,
            "deviation": round(self.deviation, 6),
            "deviation_per_row": [round(d, 6) for d in self.deviation_per_row],
        }


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (4096 / 2**20)


@contextmanager
def track_peak_memory(stats: DecodeStats, device: torch.device | str = "cpu", interval_s: float = 0.002):
    """Record the peak memory of the enclosed block into `stats.peak_mem_mb`.

    CUDA: peak allocated bytes. CPU: peak resident set size of the process, sampled by a thread
    (a CPU tensor allocator has no peak counter); it includes the weights already resident.
    """
    device = torch.device(device)
    stats.device = str(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        yield
        stats.peak_mem_mb = max(stats.peak_mem_mb, torch.cuda.max_memory_allocated(device) / 2**20)
        return
    try:
        peak = [_rss_mb()]
    except OSError:  # no /proc: report nothing rather than a wrong number
        yield
        return
    done = threading.Event()

    def sample():
        while not done.wait(interval_s):
            peak[0] = max(peak[0], _rss_mb())

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        stats.peak_mem_mb = max(stats.peak_mem_mb, peak[0], _rss_mb())
