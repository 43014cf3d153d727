"""The run directory: config checks, --overwrite, fixed batches, atomic records, stats round trip."""

import json

import pytest

from mmaccel.core.stats import DecodeStats
from mmaccel.errors import InputError
from mmaccel.eval.rundir import (
    CONFIG_FILE,
    plan_batches,
    prepare_run_dir,
    read_batch_record,
    total_stats,
    write_batch_record,
    write_json_atomic,
)

OUTPUTS = ("samples", "batches", "summary.json")


def test_new_resume_refuse_overwrite(tmp_path):
    root = tmp_path / "run"
    config = {"method": "sjd", "params": {"window": 8}, "seed": 0}
    assert prepare_run_dir(root, config, OUTPUTS) == "new"
    assert json.loads((root / CONFIG_FILE).read_text()) == config
    (root / "samples").mkdir()
    (root / "samples" / "0.png").write_bytes(b"x")
    (root / "mine.txt").write_text("a user's file")
    assert prepare_run_dir(root, dict(config), OUTPUTS) == "resume"
    assert (root / "samples" / "0.png").exists()
    with pytest.raises(InputError, match=r"another config \(differs in: params, seed\); pass --overwrite"):
        prepare_run_dir(root, {**config, "seed": 1, "params": {}}, OUTPUTS)
    assert json.loads((root / CONFIG_FILE).read_text()) == config            # refused: nothing touched
    assert prepare_run_dir(root, {**config, "seed": 1}, OUTPUTS, overwrite=True) == "overwritten"
    assert not (root / "samples").exists() and (root / "mine.txt").read_text() == "a user's file"
    assert prepare_run_dir(root, {**config, "seed": 1}, OUTPUTS, overwrite=True) == "overwritten"   # same config: fresh


def test_foreign_directory_is_refused(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "summary.json").write_text("{}")
    (tmp_path / "photos" / "holiday.png").write_bytes(b"x")
    with pytest.raises(InputError, match="not empty and holds no config.json"):
        prepare_run_dir(tmp_path / "photos", {"a": 1}, OUTPUTS)
    prepare_run_dir(tmp_path / "photos", {"a": 1}, OUTPUTS, overwrite=True)
    assert (tmp_path / "photos" / "holiday.png").exists() and not (tmp_path / "photos" / "summary.json").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        prepare_run_dir(tmp_path / "file", {}, OUTPUTS)
    (tmp_path / "empty").mkdir()
    assert prepare_run_dir(tmp_path / "empty", {}, OUTPUTS) == "new"


def test_plan_batches_is_fixed_and_seeded():
    plan = plan_batches(7, 3, base_seed=10)
    assert [(b.index, b.start, b.stop, b.seed) for b in plan] == [(0, 0, 3, 10), (1, 3, 6, 11), (2, 6, 7, 12)]
    with pytest.raises(InputError, match="--batch-size must be >= 1"):
        plan_batches(7, 0)
    with pytest.raises(InputError, match="at least one item"):
        plan_batches(0, 2)


def test_batch_records_and_atomic_writes(tmp_path):
    b = plan_batches(4, 2, base_seed=5)[1]
    assert read_batch_record(tmp_path, b) is None
    write_batch_record(tmp_path, b, {"files": ["a.png"]})
    assert read_batch_record(tmp_path, b)["files"] == ["a.png"]
    assert read_batch_record(tmp_path, plan_batches(4, 2, base_seed=6)[1]) is None     # another seed: redo
    (tmp_path / "batches" / "batch_000001.json").write_text('{"trunc')                  # unreadable: redo
    assert read_batch_record(tmp_path, b) is None
    write_json_atomic(tmp_path / "x.json", {"a": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batches", "x.json"]           # no temporary left
    assert (tmp_path / "x.json").read_text() == '{\n  "a": 1\n}\n'


def test_stats_round_trip_adds_like_decode_stats():
    a = DecodeStats(nfe=5, draft_passes=2, new_tokens=9, peak_mem_mb=10.0, deviation=0.5, deviation_per_row=[0.5])
    a.record_accepted([1, 2, 2])
    a.time_s = {"decode": 1.25}
    b = DecodeStats(nfe=3, new_tokens=4, peak_mem_mb=12.0, deviation_per_row=[0.0])
    b.record_accepted([4])
    b.exit_hist.update([3, 3])
    assert DecodeStats.from_dict(a.to_dict()).to_dict() == a.to_dict()
    total = total_stats([{"stats": a.to_dict()}, {"stats": b.to_dict()}])
    assert total.to_dict() == (a + b).to_dict()
