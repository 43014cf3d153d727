"""An evaluation's output directory: its config, fixed global batches, and per-batch records that
make a rerun resume.

Layout of `DIR` (written by `mmaccel eval image` / `mmaccel eval wer`):

    config.json              what the run generates (method, parameters, seeds, model, inputs); written first
    batches/batch_000012.json  one record per finished batch, written last for that batch
    summary.json             the merged result (rank 0)
    ... command-specific outputs (samples/*.png, utterances.jsonl)

Every file is written to a hidden temporary sibling and renamed into place (`os.replace`), so a
killed run leaves whole files or none. A batch counts as done when its record exists and matches
(the record is written after the batch's other outputs); a rerun skips done batches. A rerun with
another config is refused unless `--overwrite`, which deletes this command's outputs (only those
names, nothing else in `DIR`) and starts again. A non-empty `DIR` without `config.json` is refused
too, so nothing a user put there is overwritten.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmaccel.core.stats import DecodeStats
from mmaccel.errors import InputError, check

CONFIG_FILE = "config.json"
SUMMARY_FILE = "summary.json"
BATCH_DIR = "batches"


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    """Write `data` to `path` through a hidden temporary sibling and `os.replace`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def write_json_atomic(path: Path, obj: Any) -> Path:
    """`obj` as indented JSON (+ newline) at `path`, atomically."""
    return write_bytes_atomic(path, (json.dumps(obj, indent=2) + "\n").encode("utf-8"))


def read_json(path: Path) -> Any | None:
    """The JSON at `path`, or None if it is missing or unreadable (a record to redo)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def save_array_atomic(path: Path, array) -> Path:
    """A numpy array as `.npy`, atomically."""
    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return write_bytes_atomic(path, buffer.getvalue())


def load_array(path: Path):
    """A `.npy` written by `save_array_atomic`, or None if missing or unreadable."""
    import numpy as np

    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None


# ---- the directory --------------------------------------------------------------------------


def _normalised(config: dict) -> dict:
    return json.loads(json.dumps(config))


def prepare_run_dir(root: Path, config: dict, outputs: tuple[str, ...], overwrite: bool = False) -> str:
    """Make `root` hold a run of `config`; returns "new", "resume" or "overwritten".

    `outputs`: the names (files or folders) this command writes in `root` besides config.json; only
    they are deleted by `overwrite`. Raises `InputError` when `root` holds another config or foreign
    files and `overwrite` is False."""
    root = Path(root)
    check(not root.exists() or root.is_dir(), f"--out {root} exists and is not a directory")
    config = _normalised(config)
    config_path = root / CONFIG_FILE
    status = "new"
    if config_path.is_file():
        old = read_json(config_path)
        if old == config and not overwrite:
            return "resume"
        if old != config and not overwrite:
            differs = sorted(k for k in set(config) | set(old or {}) if (old or {}).get(k) != config.get(k))
            raise InputError(f"{root} holds an earlier run with another config (differs in: "
                             f"{', '.join(differs) or 'unreadable config.json'}); pass --overwrite to delete its "
                             "outputs and start again, or choose another --out")
        status = "overwritten"
    elif root.is_dir() and any(root.iterdir()):
        names = [p.name for p in root.iterdir() if p.name in outputs]
        if not overwrite:
            raise InputError(f"--out {root} is not empty and holds no {CONFIG_FILE} of an `mmaccel eval` run; "
                             "choose a new or empty directory, or pass --overwrite (which deletes only "
                             f"{', '.join(outputs)} there)")
        status = "overwritten" if names else "new"
    for name in (CONFIG_FILE, *outputs):
        target = root / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
    root.mkdir(parents=True, exist_ok=True)
    write_json_atomic(config_path, config)
    return status


# ---- global batches -------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """Global batch `index`: items [start, stop) of the run, seeded with `seed`."""

    index: int
    start: int
    stop: int
    seed: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def plan_batches(n: int, batch_size: int, base_seed: int = 0) -> list[Batch]:
    """Items 0..n-1 cut into batches of `batch_size` (the last may be shorter); batch j has seed
    `base_seed + j`. The plan depends only on (n, batch_size, base_seed), never on the processes."""
    check(isinstance(n, int) and n >= 1, f"need at least one item, got {n!r}")
    check(isinstance(batch_size, int) and batch_size >= 1, f"--batch-size must be >= 1, got {batch_size!r}")
    return [Batch(j, s, min(s + batch_size, n), base_seed + j) for j, s in enumerate(range(0, n, batch_size))]


def batch_record_path(root: Path, batch: Batch) -> Path:
    return Path(root) / BATCH_DIR / f"batch_{batch.index:06d}.json"


def read_batch_record(root: Path, batch: Batch) -> dict | None:
    """The record of a finished `batch`, or None if it must be (re)computed: missing, unreadable,
    or written for another range or seed."""
    record = read_json(batch_record_path(root, batch))
    if not isinstance(record, dict):
        return None
    if [record.get("start"), record.get("stop"), record.get("seed")] != [batch.start, batch.stop, batch.seed]:
        return None
    return record


def write_batch_record(root: Path, batch: Batch, record: dict) -> dict:
    """Write `record` (+ the batch's range and seed) as the batch's done-marker; call it last."""
    record = {"batch": batch.index, "start": batch.start, "stop": batch.stop, "seed": batch.seed, **record}
    write_json_atomic(batch_record_path(root, batch), record)
    return record


# ---- decoding statistics in records -----------------------------------------------------------


def total_stats(records: list[dict], key: str = "stats") -> DecodeStats:
    """The sum of the batches' `DecodeStats` (stored as dicts under `key`), in batch order."""
    total = DecodeStats()
    for record in records:
        total = total + DecodeStats.from_dict(record[key])
    return total
