"""The development sweeps: every setting is timed against AR on the same batches and seeds."""

from mmaccel.bench.image_tune import sweep, tune_speed
from tests.bench.test_image_suite import _tiny_pipe


def test_tune_speed_compares_each_setting_with_ar_on_the_same_batches():
    pipe = _tiny_pipe()
    grid = [{"method": "sjd-coupled", "window": 3, "init": "above"}, {"method": "zipar", "s": 2}]
    logged = []
    rows = tune_speed(pipe, grid, {1: 2, 2: 4}, log=logged.append)
    assert [(r["batch"], r["method"]) for r in rows] == [(1, "sjd-coupled"), (1, "zipar"), (2, "sjd-coupled"), (2, "zipar")]
    for r in rows:
        assert r["nfe"] > 0 and r["nfe_ratio"] > 1 and r["s_per_image"] > 0 and r["speedup"] > 0
    assert rows[1]["nfe"] == 2 * 4 + 2 * 2        # ZipAR's wavefront on a 4x4 grid, prefill included
    assert len(logged) == 4


def test_named_sweeps():
    model, grid = sweep("jacobi", [8, 16], [])
    assert model == "builtin:fashion-mnist" and {g["init"] for g in grid} == {"repeat", "above"} and len(grid) == 4
    model, grid = sweep("zipar", [2, 4], [])
    assert grid == [{"method": "zipar", "s": 2}, {"method": "zipar", "s": 4}]
    model, grid = sweep("sjd2", [16], [1, 2])
    assert model == "builtin:fashion-mnist-sjd2" and len(grid) == 4
