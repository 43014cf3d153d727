"""`bench asr-nar` plumbing on the builtin tiny.en with a Whisfusion decoder as initialised from Whisper's:
short and long sets in their own batches, per-set WER and speed-up, long clips built as documented."""

import numpy as np
import pytest

from mmaccel.bench.asr_nar_suite import build_asr_nar_suite, long_clips
from mmaccel.bench.harness import MethodSpec, markdown_table, run_suite, validate_document
from mmaccel.errors import InputError
from mmaccel.speech.audio import Audio, load_audio
from mmaccel.speech.whisfusion.model import WhisfusionDecoder
from mmaccel.speech.whisfusion.pipeline import WhisfusionPipeline
from tests.speech.test_pipeline import files  # noqa: F401  (fixture)


def clip(seconds: float, i: int) -> tuple[str, Audio, str]:
    return f"u{i}", Audio(np.full(int(seconds * 16000), 0.01 * (i + 1), dtype=np.float32)), f"word{i}"


def test_long_clips_join_the_next_utterances_into_the_window():
    items = [clip(6.0, i) for i in range(12)]
    out = long_clips(items, 2)
    assert [c[0] for c in out] == ["u0+u1+u2+u3", "u4+u5+u6+u7"]
    assert all(20 <= c[1].duration <= 30 for c in out) and out[0][2] == "word0 word1 word2 word3"
    with pytest.raises(InputError, match="only 2 long clips"):
        long_clips(items, 5)


@pytest.mark.slow     # 62 s; whisfusion itself: tests/speech/whisfusion
def test_quick_suite_compares_whisfusion_with_greedy_on_both_sets(tiny_en_asr, files, monkeypatch):  # noqa: F811
    import mmaccel.bench.asr_suite as asr_suite

    audio = [load_audio(f) for f in files]
    corpus = [(f"c{i}", a, "reference words") for i, a in enumerate(audio)]
    corpus += [(f"l{i}", Audio(np.concatenate([audio[i % len(audio)].samples] * 3)), "more words") for i in range(12)]
    monkeypatch.setattr(asr_suite, "load_corpus", lambda n: corpus[:len(audio)] + corpus[len(audio):len(audio) + n - 2])
    pipe = WhisfusionPipeline(tiny_en_asr.bundle, WhisfusionDecoder(tiny_en_asr.bundle.model, tokens_per_second=4.0))
    methods = [MethodSpec("greedy"), MethodSpec("whisfusion", {"candidates": 2, "steps": 2, "select": "rover"}, label="wf")]
    suite = build_asr_nar_suite(methods=methods, tts_utterances=2, long_count=1, pipeline=pipe)
    suite.batches = {1: suite.batches[1]}
    doc = run_suite(suite, log=lambda m: None)
    validate_document(doc)
    rows = {r["method"]: r for r in doc["results"]}
    wf, greedy = rows["wf"], rows["greedy"]
    assert not wf["lossless"] and greedy["quality"]["speedup_long"] == 1.0
    assert {"wer_short", "wer_long", "speedup_short", "speedup_long", "rtfx_long"} <= set(wf["quality"])
    assert wf["nfe"] == 2 * len(suite.batches[1])                           # two steps per batch
    assert "| wf |" in markdown_table(doc)
    with pytest.raises(InputError, match="unknown method 'eagle'"):
        build_asr_nar_suite(methods=[MethodSpec("greedy"), MethodSpec("eagle")], pipeline=pipe)
