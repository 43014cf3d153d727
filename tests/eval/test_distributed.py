"""Sharding and the process group; `eval image` and `eval wer` under `torchrun --nproc-per-node 2`
(CPU, gloo) give exactly the outputs of one process."""

import json

import numpy as np
import pytest
import torch

from mmaccel.cli import main
from mmaccel.errors import InputError
from mmaccel.eval.distributed import Dist, default_threads, distributed, launch_env
from tests.eval.conftest import torchrun, write_pngs


def test_launch_env():
    master = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert launch_env({}) is None and launch_env({"RANK": "0"}) is None
    assert launch_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", **master}) == {
        "RANK": 3, "WORLD_SIZE": 4, "LOCAL_RANK": 1, "LOCAL_WORLD_SIZE": 2}
    assert launch_env({"RANK": "1", "WORLD_SIZE": "2", **master}) == {"RANK": 1, "WORLD_SIZE": 2, "LOCAL_RANK": 1,
                                                                      "LOCAL_WORLD_SIZE": 2}
    with pytest.raises(InputError, match="WORLD_SIZE='two' is not an integer"):
        launch_env({"RANK": "0", "WORLD_SIZE": "two", **master})
    with pytest.raises(InputError, match="RANK=2 is not in"):
        launch_env({"RANK": "2", "WORLD_SIZE": "2", **master})
    with pytest.raises(InputError, match="MASTER_PORT is not: start the command with torchrun"):
        launch_env({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "localhost"})


def test_round_robin_shards_cover_every_unit_once():
    shards = [Dist(rank=r, world_size=3).shard(8) for r in range(3)]
    assert shards == [[0, 3, 6], [1, 4, 7], [2, 5]]
    assert Dist().gather_units({1: "b", 0: "a"}, 2) == ["a", "b"]
    with pytest.raises(InputError, match="not computed"):
        Dist().gather_units({0: "a"}, 2)


def test_one_process_without_launcher_and_threads_restored(monkeypatch):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    with distributed(threads=2) as dist:
        assert not dist.active and dist.is_main and dist.world_size == 1 and torch.get_num_threads() == 2
        assert dist.all_gather(5) == [5] and dist.broadcast(6) == 6 and dist.on_main(lambda: 7) == 7
        with pytest.raises(InputError, match="boom"):
            dist.agree(lambda: (_ for _ in ()).throw(InputError("boom")))
    assert torch.get_num_threads() == before and default_threads(10_000) == 1


def _summary_core(summary: dict) -> dict:
    """What must not depend on the number of processes (timings and counts of this run excluded)."""
    drop = {"seconds", "processes", "threads", "out", "generated_batches", "resumed_batches", "transcription_s",
            "rtfx", "stats", "decode_s", "decoder_speedup", "speedup", "greedy"}
    core = {k: v for k, v in summary.items() if k not in drop}
    core["stats"] = {k: v for k, v in summary["stats"].items() if k not in ("time_s", "peak_mem_mb")}
    return core


def test_eval_image_two_processes_equal_one(tmp_path, fashion_test_images, capsys):
    # a 450-image reference folder: 3 feature chunks, so the reference extraction is sharded too
    write_pngs(tmp_path / "ref", fashion_test_images[:450])
    common = ["eval", "image", "--method", "sjd", "--param", "window=8", "--num-samples", "6", "--batch-size", "2",
              "--features", "domain", "--reference", str(tmp_path / "ref"), "--seed", "7", "--threads", "1"]
    run = torchrun(common + ["--out", str(tmp_path / "two")])
    assert run.returncode == 0, run.stderr[-3000:]
    two = json.loads(run.stdout)                            # rank 0 alone prints the summary
    assert two["processes"] == 2 and "3 batches: 3 generated, 0 resumed (2 processes)" in run.stderr
    assert main(common + ["--out", str(tmp_path / "one")]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["processes"] == 1
    assert _summary_core(two) == _summary_core(one)
    assert two["fid"]["fid"] == one["fid"]["fid"] and two["nfe"] == one["nfe"] and two["fid"]["reference"]["count"] == 450
    pngs = sorted(p.name for p in (tmp_path / "one" / "samples").iterdir())
    assert len(pngs) == 6 and pngs == sorted(p.name for p in (tmp_path / "two" / "samples").iterdir())
    for name in pngs:
        assert (tmp_path / "two" / "samples" / name).read_bytes() == (tmp_path / "one" / "samples" / name).read_bytes()
    for f in (tmp_path / "one" / "batches").glob("*.npy"):
        assert np.array_equal(np.load(f), np.load(tmp_path / "two" / "batches" / f.name))

    # a config change is refused on every rank (rank 0 checks, the others get its error)
    refused = torchrun(common[:-4] + ["--seed", "8", "--threads", "1", "--out", str(tmp_path / "two")])
    assert refused.returncode != 0 and refused.stdout == ""
    # count messages, not lines: each rank writes its line in one call (mmaccel.progress.say)
    assert refused.stderr.count("mmaccel: error:") == 2, refused.stderr[-3000:]
    assert refused.stderr.count("another config (differs in: seed)") == 2, refused.stderr[-3000:]


@pytest.mark.slow     # 23 s; two processes are checked on eval image
def test_eval_wer_two_processes_equal_one(tmp_path, short_clips_manifest, tiny_en_asr, capsys):
    common = ["eval", "wer", "--audio", str(short_clips_manifest), "--model", "builtin:tiny.en", "--method", "greedy",
              "--batch-size", "1", "--threads", "1"]
    run = torchrun(common + ["--out", str(tmp_path / "two")])           # tiny_en_asr: skipped when not installed
    assert run.returncode == 0, run.stderr[-3000:]
    two = json.loads(run.stdout)
    assert two["processes"] == 2 and "4 batches: 4 transcribed, 0 resumed (2 processes)" in run.stderr
    assert main(common + ["--out", str(tmp_path / "one")]) == 0
    one = json.loads(capsys.readouterr().out)
    assert _summary_core(two) == _summary_core(one) and one["wer"]["utterances"] == 4
    rows = {name: [json.loads(line) for line in (tmp_path / name / "utterances.jsonl").read_text().splitlines()]
            for name in ("one", "two")}
    keys = ("id", "audio_filepath", "reference", "hypothesis", "duration", "passes", "batch_passes", "tokens", "batch")
    assert [{k: r[k] for k in keys} for r in rows["two"]] == [{k: r[k] for k in keys} for r in rows["one"]]
