"""What a pass costs by its width, measured on this machine: the shape adaptive drafting reads.

A verify pass feeds the target `width` tokens (the pending token and width - 1 drafts). What that costs against a
one-token pass depends on the model, its precision, the batch size and the CPU (Whisper base in fp32 on a 2-core
AMX Xeon: a 9-token pass 1.4x a 1-token one at batch 1, 1.7x at batch 8, 2.1x at batch 8 with the timestamp
rules), so it is measured, never guessed: `width_costs(run, key)` times `run(width)` (one pass of that width,
rolled back) at each of `WIDTHS`, at a cache length of `KV_LEN` (median of `REPEATS`, never below the narrower
width's), and interpolates between them. The figures are kept on disk (`$MMACCEL_CACHE/pass_costs/<key
hash>.json`, keyed by the CPU, its units, the thread count, torch's version and what the caller says the pass is),
so a second process reads them instead of measuring (one to six seconds a batch size). A file that cannot be read
is measured again and rewritten; one that cannot be written is skipped with one warning line.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from mmaccel.engine.machine import UNIT_FLAGS, cpu_flags, cpu_model
from mmaccel.paths import default_cache_dir

WIDTHS = (1, 2, 3, 5, 9, 17)   # tokens per pass measured (others are interpolated)
KV_LEN = 32                    # cache entries before a timed pass (a prompt and ~28 tokens of transcript or text)
REPEATS = 7


def time_ms(run: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median and best milliseconds of `run()` over `repeats` calls after one warm-up call."""
    run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


@dataclass(frozen=True)
class WidthCosts:
    """Milliseconds of one pass by its width (tokens fed), measured here or read from the cache (`source`).
    Called with a draft count d it gives the pass of width d + 1 relative to a one-token pass (`PassCosts.shape`)."""

    ms: dict[int, float]
    source: str                  # "measured" | "cache"

    def __call__(self, drafts: int) -> float:
        return self.at(drafts + 1) / self.ms[1]

    def at(self, width: int) -> float:
        """Milliseconds of a pass of `width` tokens: linear between the widths measured, past the last along the
        last two."""
        widths = sorted(self.ms)
        lo = max([w for w in widths if w <= width], default=widths[0])
        hi = min([w for w in widths if w > lo], default=None)
        if hi is None:                                       # beyond the widest: extend the last segment
            lo, hi = widths[-2], widths[-1]
        slope = (self.ms[hi] - self.ms[lo]) / (hi - lo)
        return max(self.ms[lo] + slope * (width - lo), 1e-6)


def fingerprint(module: nn.Module) -> str:
    """A cheap identity of `module`'s weights: every tensor's name, dtype, shape and first values (a hash)."""
    h = hashlib.sha256(f"{type(module).__module__}.{type(module).__qualname__}".encode())
    for name, t in module.state_dict().items():
        h.update(f"{name}:{t.dtype}:{list(t.shape)}".encode())
        head = t.detach().reshape(-1)[:64].cpu().contiguous()
        h.update(head.view(torch.uint8).numpy().tobytes() if head.numel() else b"")
    return h.hexdigest()[:24]


def width_costs(run: Callable[[int], object], key: dict, widths: tuple[int, ...] = WIDTHS, repeats: int = REPEATS,
                cache_dir: str | os.PathLike | None = None) -> WidthCosts:
    """The pass `run(width)` times by width: read from the cache under `key` (what the pass is: model, precision,
    batch size, ... as JSON values) and this machine, else measured now (median of `repeats`) and cached."""
    full = {**key, "cpu": cpu_model(), "units": [f for f in UNIT_FLAGS if f in cpu_flags()],
            "threads": torch.get_num_threads(), "torch": torch.__version__, "widths": list(widths), "kv_len": KV_LEN}
    name = hashlib.sha256(json.dumps(full, sort_keys=True).encode()).hexdigest()[:24]
    path = Path(cache_dir if cache_dir is not None else default_cache_dir() / "pass_costs") / f"{name}.json"
    cached = _read(path, full)
    if cached is not None:
        return WidthCosts(cached, "cache")
    with torch.inference_mode():
        ms, most = {}, 0.0
        for w in widths:            # a wider pass does no less work: a dip is the clock's noise
            most = max(most, time_ms(lambda w=w: run(w), repeats)[0])
            ms[w] = round(most, 4)
    _write(path, {"key": full, "ms": {str(w): t for w, t in ms.items()}})
    return WidthCosts(ms, "measured")


def _read(path: Path, key: dict) -> dict[int, float] | None:
    """The cached figures of `key`, None where missing, unreadable or not this key's."""
    try:
        doc = json.loads(path.read_text())
        ms = {int(w): float(t) for w, t in doc["ms"].items()}
        if doc["key"] != key or sorted(ms) != key["widths"] or not all(t > 0 for t in ms.values()):
            return None
        return ms
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write(path: Path, doc: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
    except OSError as e:
        warnings.warn(f"mmaccel: pass costs not cached at {path} ({type(e).__name__}: {e})", stacklevel=3)
