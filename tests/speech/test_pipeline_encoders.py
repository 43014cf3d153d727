"""The pipeline's cheaper encoders (engine precisions): built once, the fp32 model untouched, decoding lossless on top."""

import pytest

from mmaccel.errors import InputError
from mmaccel.metrics.wer import corpus_wer
from tests.speech.test_pipeline import files  # noqa: F401  (fixture)


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
    assert tiny_en_asr.encoder("auto") is tiny_en_asr.encoder("bf16" if cpu_bf16_units() else "fp32")
    assert tiny_en_asr.transcribe(clips, "greedy").texts == fp32.texts          # the fp32 model is unchanged
    with pytest.raises(InputError, match="unknown precision 'half'"):
        tiny_en_asr.transcribe(clips, "greedy", encoder="half")
