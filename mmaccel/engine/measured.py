"""Figures measured on this machine and kept on disk, so that a second process reads them instead of measuring.

`measured(kind, key, measure, valid)` returns what `measure()` gave (a JSON object) for `key` on this machine: read
from `$MMACCEL_CACHE/<kind>/<hash>.json` when a file there holds this key (the caller's, plus the CPU, its units,
the thread count and torch's version) and passes `valid`, else measured now and written. A file that cannot be read
or is not valid is measured again and rewritten; one that cannot be written is skipped with one warning line.
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
from pathlib import Path

import torch
from torch import nn

from mmaccel.engine.machine import UNIT_FLAGS, cpu_flags, cpu_model
from mmaccel.paths import default_cache_dir


def time_ms(run: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median and best milliseconds of `run()` over `repeats` calls after one warm-up call."""
    run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def fingerprint(module: nn.Module) -> str:
    """A cheap identity of `module`'s weights: every tensor's name, dtype, shape and first values (a hash)."""
    h = hashlib.sha256(f"{type(module).__module__}.{type(module).__qualname__}".encode())
    for name, t in module.state_dict().items():
        h.update(f"{name}:{t.dtype}:{list(t.shape)}".encode())
        head = t.detach().reshape(-1)[:64].cpu().contiguous()
        h.update(head.view(torch.uint8).numpy().tobytes() if head.numel() else b"")
    return h.hexdigest()[:24]


def machine_key() -> dict:
    """What a timing depends on besides the work: the CPU, its units, the thread count and torch's version."""
    return {"cpu": cpu_model(), "units": [f for f in UNIT_FLAGS if f in cpu_flags()],
            "threads": torch.get_num_threads(), "torch": torch.__version__}


def measured(kind: str, key: dict, measure: Callable[[], dict], valid: Callable[[dict], bool] = lambda v: True,
             cache_dir: str | os.PathLike | None = None) -> tuple[dict, str]:
    """(`measure()`'s figures for `key` on this machine, "cache" | "measured"); `cache_dir` defaults to
    `$MMACCEL_CACHE/<kind>`."""
    full = {**key, **machine_key()}
    name = hashlib.sha256(json.dumps(full, sort_keys=True).encode()).hexdigest()[:24]
    path = Path(cache_dir if cache_dir is not None else default_cache_dir() / kind) / f"{name}.json"
    try:
        doc = json.loads(path.read_text())
        if doc["key"] == full and isinstance(doc["value"], dict) and valid(doc["value"]):
            return doc["value"], "cache"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    value = measure()
    _write(path, {"key": full, "value": value})
    return value, "measured"


def _write(path: Path, doc: dict) -> None:
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        warnings.warn(f"mmaccel: measurements not cached at {path} ({type(e).__name__}: {e})", stacklevel=3)


def fastest(kind: str, key: dict, candidates: dict[str, Callable[[], Callable[[], object]]], repeats: int = 3,
            cache_dir: str | os.PathLike | None = None) -> tuple[str, dict[str, float], str]:
    """(the candidate that ran fastest here, each one's milliseconds, "cache" | "measured"). `candidates`: name ->
    a builder returning the call to time (median of `repeats` after a warm-up). On a cache hit nothing is built."""
    def measure() -> dict:
        return {"ms": {name: round(time_ms(build(), repeats)[0], 3) for name, build in candidates.items()}}

    def valid(value: dict) -> bool:
        return sorted(value["ms"]) == sorted(candidates) and all(float(t) > 0 for t in value["ms"].values())
    value, source = measured(kind, {**key, "candidates": sorted(candidates)}, measure, valid, cache_dir)
    ms = {name: float(t) for name, t in value["ms"].items()}
    return min(ms, key=ms.get), ms, source
