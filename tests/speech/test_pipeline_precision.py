"""The pipeline's precisions (the engine's): cheaper encoders built once, an int8 pipeline close to fp32 and to its own
greedy, the fp32 model untouched."""

import pytest

from mmaccel.errors import InputError
from mmaccel.metrics.wer import corpus_wer
from tests.speech.test_pipeline import files  # noqa: F401  (fixture)


def _auto_encoder() -> str:
    from mmaccel.engine.compiled import available
    from mmaccel.engine.machine import cpu_bf16_units, cpu_int8_units

    return "int8" if available() and cpu_int8_units() else "bf16" if cpu_bf16_units() else "fp32"


AUTO_ENCODER = _auto_encoder()       # what precision="auto" runs the encoder in on this CPU


def test_the_pipeline_decodes_cheaper_encoders_losslessly(tiny_en_asr, files):  # noqa: F811
    from mmaccel.engine.machine import cpu_bf16_units

    clips = files[:1]
    fp32 = tiny_en_asr.transcribe(clips, "greedy")
    for precision in ("bf16", "int8") if cpu_bf16_units() else ("int8",):
        greedy = tiny_en_asr.transcribe(clips, "greedy", encoder=precision)
        assert tiny_en_asr.transcribe(clips, "ngram", k=3, encoder=precision).texts == greedy.texts
        assert corpus_wer(fp32.texts, greedy.texts).wer < 0.3, precision
        assert {"features", "encoder", "decode"} <= set(greedy.stats.time_s)
    assert tiny_en_asr.encoder("int8") is tiny_en_asr.encoder("int8")           # built once
    assert tiny_en_asr.encoder("auto") is tiny_en_asr.encoder(tiny_en_asr.auto_encoder_precision.name)
    assert tiny_en_asr.transcribe(clips, "greedy").texts == fp32.texts          # the fp32 model is unchanged
    with pytest.raises(InputError, match="unknown precision 'half'"):
        tiny_en_asr.transcribe(clips, "greedy", encoder="half")


def test_an_int8_pipeline_runs_encoder_and_decoder_in_int8_and_stays_close(tiny_en_asr, files):  # noqa: F811
    from mmaccel.engine.int8 import Int8Linear
    from mmaccel.speech.pipeline import ASRPipeline

    clips = files[:2]
    fp32 = tiny_en_asr.transcribe(clips, "greedy")
    int8 = ASRPipeline.from_pretrained("builtin:tiny.en", precision="int8")
    assert int8.precision == "int8" and int8.precision_reason == "encoder int8 (asked for); decoder int8 (asked for)"
    assert int8.model.quantized and int8.argmax_model is int8.model and int8.encoder() is int8.encoder("int8")
    assert isinstance(int8.model._int8_projection, Int8Linear)
    got = int8.transcribe(clips, "greedy")
    assert corpus_wer(fp32.texts, got.texts).wer < 0.2
    assert int8.model.fixed_shape                        # greedy-identical by construction at int8
    assert int8.transcribe(clips, "eagle").texts == got.texts
    assert tiny_en_asr.transcribe(clips, "greedy").texts == fp32.texts      # the fp32 pipeline is untouched
    assert not tiny_en_asr.model.quantized and tiny_en_asr.encoder_precision.name == "fp32"


def test_bf16_on_a_cpu_without_it_is_one_line(tiny_en_asr, monkeypatch):
    from mmaccel.engine import precision
    from mmaccel.speech.pipeline import ASRPipeline

    monkeypatch.setattr(precision, "fast_bf16_matmul", lambda device: False)
    monkeypatch.setattr(precision, "cpu_int8_units", lambda: [])
    with pytest.raises(InputError, match="needs native bf16 units"):
        ASRPipeline(tiny_en_asr.bundle, precision="bf16")
    auto = ASRPipeline(tiny_en_asr.bundle, precision="auto")
    assert (auto.encoder_precision.name, auto.decoder_precision.name) == ("fp32", "int8")
    assert "no native bf16" in auto.precision_reason and auto.model.quantized


@pytest.mark.skipif(AUTO_ENCODER == "fp32", reason="auto's encoder is compiled where int8 or bf16 units are")
def test_auto_runs_the_compiled_encoder_and_the_int8_decoder(tiny_en_asr, files):  # noqa: F811
    from mmaccel.engine.compiled import Compiled
    from mmaccel.engine.machine import cpu_bf16_units
    from mmaccel.speech.pipeline import ASRPipeline

    clips = files[:2]
    auto = ASRPipeline(tiny_en_asr.bundle, precision="auto")
    chosen = auto.encoder_precision.name        # where both int8 and bf16 run compiled: the faster here
    assert chosen == AUTO_ENCODER or (AUTO_ENCODER == "int8" and chosen == "bf16" and cpu_bf16_units())
    assert isinstance(auto.encoder(), Compiled) and auto.encoder() is auto.encoder(chosen)
    assert auto.model.quantized and auto.precision_reason.startswith(f"encoder auto: {chosen}")
    got = auto.transcribe(clips, "greedy", word_timestamps=True)
    assert corpus_wer(tiny_en_asr.transcribe(clips, "greedy").texts, got.texts).wer < 0.2
    assert all(w.end >= w.start for t in got.transcripts for s in t.segments for w in s.words)


def test_auto_runs_the_encoder_that_measured_faster_here(tiny_en_asr, monkeypatch):
    from mmaccel.engine.compiled import available
    from mmaccel.engine.machine import cpu_int8_units
    from mmaccel.speech import pipeline

    if not (available() and cpu_int8_units()):
        pytest.skip("auto measures int8 against bf16 only where the encoder compiles in int8")
    asked = []

    def fastest(kind, key, candidates):
        asked.append((kind, sorted(candidates)))
        return "bf16", {"int8": 300.0, "bf16": 250.0}, "cache"
    monkeypatch.setattr(pipeline, "fastest", fastest)
    monkeypatch.setattr(pipeline, "fast_bf16_matmul", lambda device: True)
    auto = pipeline.ASRPipeline(tiny_en_asr.bundle, precision="auto")
    assert auto.encoder_precision.name == "bf16" and "bf16 0.25 s, int8 0.30 s" in auto.precision_reason
    assert auto.encoder_precision is auto.encoder_precision and asked == [("encoder_choice", ["bf16", "int8"])]
    pipeline.ASRPipeline(tiny_en_asr.bundle, precision="int8").encoder()
    assert len(asked) == 1                                      # asked for by name: nothing measured
