"""The pass by width: measured once per machine and key, read back from disk, remeasured when the file is bad."""

import json

import pytest
import torch

from mmaccel.engine.pass_costs import WidthCosts, width_costs


def counting():
    calls = []

    def run(width):
        calls.append(width)
        torch.ones(64 * width).sum()
    return run, calls


def test_measured_once_then_read_from_the_cache(tmp_path):
    run, calls = counting()
    first = width_costs(run, {"pass": "test"}, widths=(1, 2, 4), repeats=2, cache_dir=tmp_path)
    assert first.source == "measured" and sorted(first.ms) == [1, 2, 4] and set(calls) == {1, 2, 4}
    assert first.ms[1] <= first.ms[2] <= first.ms[4]                # never cheaper for more tokens
    calls.clear()
    again = width_costs(run, {"pass": "test"}, widths=(1, 2, 4), repeats=2, cache_dir=tmp_path)
    assert again.source == "cache" and again.ms == first.ms and not calls
    other = width_costs(run, {"pass": "test", "rows": 8}, widths=(1, 2, 4), repeats=2, cache_dir=tmp_path)
    assert other.source == "measured" and calls                     # another key is another measurement


@pytest.mark.parametrize("damage", ["not json", json.dumps({"key": {}, "value": {"ms": {"1": 1.0}}}),
                                    json.dumps({"value": {"ms": {"1": "x"}}}), "", "[]"])
def test_a_bad_cache_file_is_measured_again_and_rewritten(tmp_path, damage):
    run, _ = counting()
    width_costs(run, {"pass": "test"}, widths=(1, 2), repeats=1, cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.json")
    path.write_text(damage)
    assert width_costs(run, {"pass": "test"}, widths=(1, 2), repeats=1, cache_dir=tmp_path).source == "measured"
    assert width_costs(run, {"pass": "test"}, widths=(1, 2), repeats=1, cache_dir=tmp_path).source == "cache"


def test_an_unwritable_cache_warns_in_one_line_and_still_measures(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    run, _ = counting()
    with pytest.warns(UserWarning, match="not cached"):
        costs = width_costs(run, {"pass": "test"}, widths=(1, 2), repeats=1, cache_dir=blocker / "sub")
    assert costs.source == "measured"


def test_widths_between_and_beyond_the_measured_are_interpolated():
    costs = WidthCosts({1: 10.0, 2: 12.0, 4: 14.0, 8: 22.0}, "cache")
    assert costs(0) == 1.0 and costs(2) == pytest.approx(1.3) and costs(5) == pytest.approx(1.8)
    assert costs.at(16) == pytest.approx(38.0)                      # past the widest: along the last segment
