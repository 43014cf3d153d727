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
    exit_hist: Counter = field(default_factory=Counter)  # early exit: tokens emitted after each layer count
    cache_mb: float = 0.0    # largest KV cache a call allocated (where the method reports it), MB
    fallbacks: int = 0       # tokens a rejection sampler gave up on (CSpD's residual: a draw from the target instead)

    @property
    def mean_exit_layer(self) -> float:
        """Average number of layers run per token emitted by an early-exit decoder (0 if none)."""
        n = sum(self.exit_hist.values())
        return sum(k * v for k, v in self.exit_hist.items()) / n if n else 0.0

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
            deviation_per_row=self.deviation_per_row + other.deviation_per_row,
            exit_hist=self.exit_hist + other.exit_hist, cache_mb=max(self.cache_mb, other.cache_mb),
            fallbacks=self.fallbacks + other.fallbacks)

    def to_dict(self) -> dict:
        return {
            "nfe": self.nfe, "draft_passes": self.draft_passes, "new_tokens": self.new_tokens,
            "mean_accepted": round(self.mean_accepted, 4),
            "accepted_hist": {str(k): v for k, v in sorted(self.accepted_hist.items())},
            "time_s": {k: round(v, 6) for k, v in self.time_s.items()},
            "peak_mem_mb": round(self.peak_mem_mb, 1), "device": self.device,
            "deviation": round(self.deviation, 6),
            "deviation_per_row": [round(d, 6) for d in self.deviation_per_row],
            **({"exit_hist": {str(k): v for k, v in sorted(self.exit_hist.items())},
                "mean_exit_layer": round(self.mean_exit_layer, 4)} if self.exit_hist else {}),
            **({"cache_mb": round(self.cache_mb, 3)} if self.cache_mb else {}),
            **({"fallbacks": self.fallbacks} if self.fallbacks else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "DecodeStats":
        """Inverse of `to_dict()` for the counters that add up (passes, tokens, histograms, times,
        memory, deviation), so stats stored as JSON (a resumed evaluation's batches) aggregate like fresh ones."""
        return cls(nfe=int(d.get("nfe", 0)), draft_passes=int(d.get("draft_passes", 0)),
                   new_tokens=int(d.get("new_tokens", 0)),
                   accepted_hist=Counter({int(k): int(v) for k, v in d.get("accepted_hist", {}).items()}),
                   time_s={k: float(v) for k, v in d.get("time_s", {}).items()},
                   peak_mem_mb=float(d.get("peak_mem_mb", 0.0)), device=d.get("device", "cpu"),
                   deviation=float(d.get("deviation", 0.0)),
                   deviation_per_row=[float(x) for x in d.get("deviation_per_row", [])],
                   exit_hist=Counter({int(k): int(v) for k, v in d.get("exit_hist", {}).items()}),
                   cache_mb=float(d.get("cache_mb", 0.0)), fallbacks=int(d.get("fallbacks", 0)))


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (4096 / 2**20)


def _hwm_mb() -> float:
    """The kernel's resident-set high-water mark of this process (VmHWM), MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise OSError("no VmHWM in /proc/self/status")


def _reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to clear_refs); False if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


_open_peaks: list[list[float]] = []     # running peaks of the enclosing CPU trackers (resets are nested)


@contextmanager
def track_peak_memory(stats: DecodeStats, device: torch.device | str = "cpu", interval_s: float = 0.002):
    """Record the peak memory of the enclosed block into `stats.peak_mem_mb`.

    CUDA: peak allocated bytes. CPU: peak resident set size of the process (weights already
    resident included), from the kernel's high-water mark reset at entry, so a short spike is never
    missed however busy the machine; where that is unavailable, RSS sampled by a thread.
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
        _fold(_hwm_mb())
    except OSError:  # no /proc: report nothing rather than a wrong number
        yield
        return
    if _reset_hwm():
        _open_peaks.append(peak)
        try:
            yield
        finally:
            _open_peaks.pop()
            peak[0] = max(peak[0], _hwm_mb())
            _fold(peak[0])
            stats.peak_mem_mb = max(stats.peak_mem_mb, peak[0])
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


def _fold(mb: float) -> None:
    """Credit `mb` to every enclosing tracker before a nested reset (or after a nested exit)."""
    for peak in _open_peaks:
        peak[0] = max(peak[0], mb)
