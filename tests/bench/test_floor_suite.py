"""bench floor on a tiny LM: a row per precision, batch and width, each against its floor; the table and the plot."""

from types import SimpleNamespace

from mmaccel.bench import floor_suite
from mmaccel.bench.floor_suite import lm_subjects, markdown, pass_floor, plot
from mmaccel.engine.machine import measure_machine


def test_rows_time_each_width_against_the_floor_of_its_precision(target, tmp_path):
    pipe = SimpleNamespace(model=target)
    machine = measure_machine(repeats=1)
    rows = floor_suite._decoder_rows(lm_subjects(pipe, ["fp32", "int8"], name="tiny"), machine, 2, (1, 4), (1, 2),
                                     log=lambda m: None)
    assert [(r["precision"], r["batch"], r["width"]) for r in rows] == [
        (p, b, w) for p in ("fp32", "int8") for b in (1, 2) for w in (1, 4)]
    by = {(r["precision"], r["batch"], r["width"]): r for r in rows}
    for r in rows:
        assert r["ms"] > 0 and r["floor_ms"] > 0 and abs(r["x_floor"] - r["ms"] / r["floor_ms"]) < 0.01 + 0.01 * r["x_floor"]
        assert r["bound"] in ("memory", "compute") and r["kv_len"] == floor_suite.KV_LEN
    assert by[("fp32", 1, 1)]["x_width1"] == 1.0
    assert by[("int8", 1, 1)]["bytes"]["weights"] * 4 == by[("fp32", 1, 1)]["bytes"]["weights"]
    assert by[("fp32", 2, 1)]["bytes"]["kv"] == 2 * by[("fp32", 1, 1)]["bytes"]["kv"]
    assert target.prefill([[1]], 0).cache.lengths.tolist() == [1]          # the model is left as it was
    doc = {"suite": "floor", "device": "cpu", "torch": "x", "date": "d", "config": {}, "machine": machine.to_dict(),
           "results": rows}
    table = markdown(doc)
    assert table.startswith("Machine: read ") and table.count("| tiny |") == len(rows)
    plot(doc, tmp_path / "floor.png")
    assert (tmp_path / "floor.png").stat().st_size > 0
    one = pass_floor(lm_subjects(pipe, ["fp32"], name="tiny")[0], repeats=1)
    assert (one["batch"], one["width"]) == (1, 1) and one["floor_ms"] > 0
