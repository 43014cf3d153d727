"""`bench ctc` plumbing on a tiny random Wav2Vec2ForCTC: every decoder on the same log-probs, settings from dev."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from mmaccel.bench.ctc_suite import DEFAULT_METHODS, boost_list, boosted_recall, build_ctc_suite
from mmaccel.bench.harness import markdown_table, run_suite, validate_document
from mmaccel.speech.audio import Audio
from mmaccel.speech.ctc.vocab import CTCVocabulary
from tests.speech.ctc.test_wav2vec2 import checkpoint  # noqa: F401  (fixture)

pytest.importorskip("pyctcdecode")
pytest.importorskip("flashlight.lib.text.decoder")


def test_boost_lists_hold_unknown_spellable_words_and_recall_counts_them():
    vocab = CTCVocabulary(["_", "|", "a", "b", "c", "t"])
    assert boost_list(["a cab tab", "abba bat"], known={"tab"}, vocab=vocab) == ["abba", "bat", "cab"]
    assert boosted_recall(["a cab tab", "bat bat"], ["a cab tap", "bat"], ["cab", "bat"]) == pytest.approx(2 / 3, abs=1e-4)
    assert boosted_recall(["a tab"], ["a tab"], ["cab"]) is None


def test_quick_ctc_suite_runs_every_decoder(checkpoint, monkeypatch, tmp_path):  # noqa: F811
    import mmaccel.bench.asr_suite as asr_suite
    import mmaccel.bench.ctc_suite as ctc_suite
    import mmaccel.speech.data as data

    rng = np.random.default_rng(0)
    clips = [(f"u{i}", Audio((0.1 * rng.standard_normal(6000 + 1000 * i)).astype(np.float32)), text)
             for i, text in enumerate(["a cat", "a bat", "tab cab", "cat at a bat", "a cab", "bat tab"])]
    monkeypatch.setattr(asr_suite, "load_corpus", lambda n: clips[:2 + 2 * n])       # 2 "real" + n test + n dev
    monkeypatch.setattr(data, "sentences", lambda split="train": ["A cat sat.", "A bat at a tab.", "Cat at bat."] * 5)
    monkeypatch.setattr(ctc_suite, "default_cache_dir", lambda: tmp_path)
    suite = build_ctc_suite(quick=True, model=str(checkpoint), tts_utterances=2, order=3)
    doc = run_suite(suite, log=lambda m: None)
    validate_document(doc)
    rows = {(r["method"], r["batch"]): r for r in doc["results"]}
    assert {m.key for m in DEFAULT_METHODS} == {k for k, _ in rows} and doc["baseline"] == "greedy"
    for (name, _batch), row in rows.items():
        assert row["quality"]["wer"] >= 0 and row["quality"]["utt_per_s"] > 0, name
        assert row["quality"]["vs_pyctcdecode_16"] > 0
    assert set(doc["settings"]) >= {"lm_weight", "insertion_bonus", "boost_weight", "dev_lm_wer", "boosted_words"}
    assert doc["model_rtfx"] > 0 and "| beam-16+lm |" in markdown_table(doc)


def test_ctc_suite_reports_early_exit_for_a_whisper_ctc(monkeypatch, tmp_path):
    import mmaccel.bench.asr_suite as asr_suite
    import mmaccel.bench.ctc_suite as ctc_suite
    import mmaccel.speech.data as data
    from mmaccel.bench.report import suite_pages
    from mmaccel.speech.ctc.pipeline import CTCPipeline
    from tests.speech.ctc.test_whisper_ctc import bundle, clips, ctc

    model = ctc.__wrapped__(bundle.__wrapped__(), SimpleNamespace(param=2))          # 40-ms frames
    audio = clips()
    items = [(f"u{i}", a, text) for i, (a, text) in enumerate(zip(audio, ["a cat", "a bat", "tab cab", "cat at a bat",
                                                                          "a cab", "bat tab"]))]
    monkeypatch.setattr(asr_suite, "load_corpus", lambda n: items[:2 + 2 * n])
    monkeypatch.setattr(data, "sentences", lambda split="train": ["The quick brown fox jumps over the lazy dog.",
                                                                  "A bat at a tab.", "Cat at bat."] * 5)
    monkeypatch.setattr(ctc_suite, "default_cache_dir", lambda: tmp_path)
    monkeypatch.setattr(CTCPipeline, "from_pretrained", classmethod(lambda cls, source: cls(model)))
    suite = build_ctc_suite(quick=True, model="tiny", tts_utterances=2, order=3,
                            methods=[ctc_suite.MethodSpec("greedy"), ctc_suite.MethodSpec("beam", {"beam": 4})])
    doc = run_suite(suite, log=lambda m: None)
    exits = doc["early_exit"]
    assert exits["full"]["encoder_cost"] == 1.0 and {"budget 0.5", "budget 0.75"} <= set(exits)
    assert all(0 < row["encoder_cost"] <= 1.0 and row["wer"] >= 0 for row in exits.values())
    out = tmp_path / "bench" / "ctc.json"
    out.parent.mkdir()
    out.write_text(json.dumps(doc))
    text = suite_pages(out.parent)["ctc.md"]
    assert "Encoder early exit" in text and "| budget 0.5 |" in text and "LM weight" in text
