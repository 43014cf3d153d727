"""Cheaper encoders: bf16 / int8 copies stay close to fp32, leave the model alone, and decode losslessly on top."""

import pytest
import torch

from mmaccel.errors import InputError
from mmaccel.metrics.wer import corpus_wer
from mmaccel.speech.encoder_precision import encoder_variant, input_dtype
from tests.speech.conftest import features, tiny_whisper
from tests.speech.test_pipeline import files  # noqa: F401  (fixture)


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("precision, bound", [("bf16", 0.03), ("int8", 0.15)])
def test_variants_are_close_copies_and_the_fp32_encoder_is_untouched(precision, bound):
    encoder = tiny_whisper().model.encoder
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    x = features(2)
    with torch.no_grad():
        want = encoder(x).last_hidden_state
        variant = encoder_variant(encoder, precision)
        got = variant(x.to(input_dtype(variant))).last_hidden_state
    assert variant is not encoder and 0 < _relative_error(got, want) < bound
    assert all(torch.equal(v, encoder.state_dict()[k]) for k, v in before.items())
    assert input_dtype(encoder) == torch.float32
    assert input_dtype(variant) == (torch.bfloat16 if precision == "bf16" else torch.float32)
    assert encoder_variant(encoder, "fp32") is encoder


def test_unknown_precisions_are_refused():
    with pytest.raises(InputError, match="unknown encoder precision 'fp8'"):
        encoder_variant(tiny_whisper().model.encoder, "fp8")


def test_the_pipeline_decodes_cheaper_encoders_losslessly(tiny_en_asr, files):  # noqa: F811
    clips = files[:1]              # one clip: a CPU without native bf16 runs the bf16 encoder slowly
    fp32 = tiny_en_asr.transcribe(clips, "greedy")
    for precision in ("bf16", "int8"):
        greedy = tiny_en_asr.transcribe(clips, "greedy", encoder=precision)
        assert tiny_en_asr.transcribe(clips, "ngram", k=3, encoder=precision).texts == greedy.texts
        assert corpus_wer(fp32.texts, greedy.texts).wer < 0.3, precision
        assert {"features", "encoder", "decode"} <= set(greedy.stats.time_s)
    assert tiny_en_asr.encoder("bf16") is tiny_en_asr.encoder("bf16")           # built once
    assert tiny_en_asr.transcribe(clips, "greedy").texts == fp32.texts          # the fp32 model is unchanged
    with pytest.raises(InputError, match="unknown encoder precision"):
        tiny_en_asr.transcribe(clips, "greedy", encoder="half")
