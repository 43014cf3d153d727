"""`bench asr-stream` plumbing on tiny.en, the stream fed as fast as it is read (the real-time pace is
`realtime_chunks`, tested in tests/speech/test_streaming.py)."""

import pytest

from mmaccel.bench import stream_suite
from mmaccel.bench.harness import MethodSpec
from mmaccel.speech.data import SPHINX_DATA


@pytest.mark.slow
def test_the_stream_bench_reports_delays_and_both_wers(tiny_en_asr, monkeypatch):
    if not (SPHINX_DATA / "librivox").is_dir():
        pytest.skip("apt-get install pocketsphinx-testdata")
    monkeypatch.setattr(stream_suite, "QUICK_CLIPS", 2)
    monkeypatch.setattr("mmaccel.speech.streaming.realtime_chunks",
                        lambda samples, rate, chunk_s: (samples[a : a + rate] for a in range(0, len(samples), rate)))
    doc = stream_suite.run_stream_bench(methods=[MethodSpec("ar"), MethodSpec("ngram", {"k": 3})], quick=True, min_chunk_s=3.0,
                                        pipeline=tiny_en_asr, log=lambda m: None)
    greedy, ngram = doc["results"]
    assert (greedy["method"], ngram["method"]) == ("greedy", "ngram") and greedy["words"] > 10
    assert greedy["wer_offline"] < 15 and abs(greedy["wer_stream"] - greedy["wer_offline"]) < 10
    assert ngram["transcript"] == greedy["transcript"]              # lossless: greedy's words
    assert doc["config"]["audio_s"] > 5 and "| ngram |" in stream_suite.markdown(doc)
