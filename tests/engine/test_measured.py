"""Measurements kept on disk: keyed by the machine and the work, the fastest candidate chosen without rebuilding."""

import pytest
import torch

from mmaccel.engine.measured import fastest, fingerprint, measured


def test_a_measurement_is_read_back_for_its_key_only(tmp_path):
    calls = []

    def measure():
        calls.append(1)
        return {"x": len(calls)}
    assert measured("k", {"a": 1}, measure, cache_dir=tmp_path) == ({"x": 1}, "measured")
    assert measured("k", {"a": 1}, measure, cache_dir=tmp_path) == ({"x": 1}, "cache")
    assert measured("k", {"a": 2}, measure, cache_dir=tmp_path) == ({"x": 2}, "measured")
    assert measured("k", {"a": 1}, measure, valid=lambda v: v["x"] > 1, cache_dir=tmp_path) == ({"x": 3}, "measured")


def test_the_fastest_candidate_is_kept_and_the_others_not_rebuilt(tmp_path, monkeypatch):
    from mmaccel.engine import measured as module

    built = []
    monkeypatch.setattr(module, "time_ms", lambda run, repeats: (run(), run()))     # a call "takes" what it returns

    def candidate(name, ms):
        def build():
            built.append(name)
            return lambda: ms
        return build
    candidates = {"small": candidate("small", 1.0), "large": candidate("large", 40.0)}
    name, ms, source = fastest("choice", {"part": "test"}, candidates, cache_dir=tmp_path)
    assert (name, source, sorted(built)) == ("small", "measured", ["large", "small"])
    assert ms == {"small": 1.0, "large": 40.0}
    built.clear()
    assert fastest("choice", {"part": "test"}, candidates, cache_dir=tmp_path)[::2] == ("small", "cache") and not built


def test_the_fingerprint_follows_the_weights():
    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    assert fingerprint(a) == fingerprint(a) and fingerprint(a) != fingerprint(b)
    with torch.no_grad():
        b.load_state_dict(a.state_dict())
    assert fingerprint(a) == fingerprint(b)


@pytest.mark.parametrize("bad", ["{", "[]", '{"key": 1, "value": 2}'])
def test_a_bad_file_is_measured_again(tmp_path, bad):
    measured("k", {"a": 1}, lambda: {"x": 1}, cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.json")
    path.write_text(bad)
    assert measured("k", {"a": 1}, lambda: {"x": 2}, cache_dir=tmp_path) == ({"x": 2}, "measured")
