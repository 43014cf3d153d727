"""`mmaccel bench video --quick` on a small random model in the built-in's format: the published JSON
shape, lossless answer methods identical to AR, the ingest and long-stream studies and their plots."""

import json

import pytest

from mmaccel.bench.harness import validate_document
from mmaccel.cli import main


@pytest.fixture(scope="module")
def video_model_dir(tmp_path_factory):
    from mmaccel.video.data import VOCAB
    from mmaccel.video.train import build_model, export
    from mmaccel.video.words import WordTokenizer

    path = tmp_path_factory.mktemp("video_model")
    export(build_model(WordTokenizer(VOCAB)), WordTokenizer(VOCAB), path)
    return path


@pytest.mark.slow     # 44 s; the suite's statistics are tested below
def test_bench_video_quick_writes_valid_json(video_model_dir, tmp_path):
    out = tmp_path / "video.json"
    assert main(["bench", "video", "--quick", "--model", str(video_model_dir), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    validate_document(doc)
    assert {r["method"] for r in doc["results"]} == {"ar", "specvlm-10%", "specvlm-text", "self-draft-1L",
                                                     "self-draft-2L", "ngram"}
    for r in doc["results"]:
        assert r["lossless"] is True and r["quality"]["identical_to_ar"] == 1.0, r
        assert 0.0 <= r["quality"]["accuracy"] <= 1.0 and r["nfe"] > 0
    settings = doc["ingest"]["settings"]
    assert settings["full"]["keep_ratio"] == 1.0 and settings["dtd-pixel"]["keep_ratio"] < 1.0
    assert settings["dtd-pixel-keep25%"]["keep_ratio"] < 0.5      # the first segment enters whole
    long = doc["long_stream"]
    assert long["full/400"]["kv_entries_max"] <= long["full/400"]["cache_capacity"]
    assert long["full/400"]["cache_mb"] == long["full/40"]["cache_mb"]          # the cache does not grow
    markdown = out.with_suffix(".md").read_text()
    assert (tmp_path / "video_long.png").exists() and "Long streams" in markdown and "decode speed-up" in markdown
    assert all(r["time_s"]["stream_ingest"] > 0 for r in doc["results"])
    picked = doc["config"]["self_draft_dev"]                    # chains picked on the dev streams
    assert set(picked) == {"1", "2"} and all(len(p["decode_s"]) == 2 for p in picked.values())
    assert "Self-draft chains picked on the dev streams" in markdown
    assert 0.0 <= doc["ingest"]["constant_answers"]["accuracy"] <= 1.0 and "Chance reference" in markdown


def test_paired_interval_is_narrow_when_the_answers_agree():
    from mmaccel.bench.video_suite import paired_ci95

    base = [True, False] * 50
    assert paired_ci95(base, base) == 0.0                               # the same answers: no doubt
    one_flip = [not base[0], *base[1:]]
    assert 0 < paired_ci95(one_flip, base) < 0.03                       # one of 100 differs
    unrelated = [True, True, False, False] * 25
    assert paired_ci95(unrelated, base) > 0.1                           # half of them differ


def test_constant_answers_take_the_most_common_dev_answer_per_kind():
    from mmaccel.bench.video_suite import constant_answers
    from mmaccel.video.data import Question

    dev = [[Question(0, "count", "", "two"), Question(1, "count", "", "two"), Question(2, "count", "", "one"),
            Question(3, "now", "", "bag")]]
    test = [[Question(0, "count", "", "two"), Question(1, "count", "", "three"), Question(2, "now", "", "coat"),
             Question(3, "direction", "", "left")]]
    out = constant_answers(dev, test)
    assert out["answers"] == {"count": "two", "now": "bag"}
    assert out["by_kind"] == {"count": 0.5, "direction": 0.0, "now": 0.0} and out["accuracy"] == 0.25
