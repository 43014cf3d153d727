"""`initial_prompt`: Whisper's previous-text prompt conditions every window (a spelling it names is taken up),
decodes as Hugging Face's Whisper does under the same decoder prefix, and keeps the lossless methods lossless."""

import pytest
import torch

from mmaccel.errors import InputError
from mmaccel.speech.audio import load_audio
from tests.conftest import installed
from tests.speech.test_pipeline import FILES

HINT = "Dashwood, Norland, ill-disposed."      # the clip says "ill-disposed"; tiny.en hears "old-sposed" unprompted


def test_a_prompt_conditions_the_decoding_as_hugging_face_does(tiny_en_asr):
    plain = tiny_en_asr.transcribe(FILES[1], temperature=0).transcripts[0]
    prompted = tiny_en_asr.transcribe(FILES[1], temperature=0, initial_prompt=HINT).transcripts[0]
    assert "old-sposed" in plain.text and "ill-disposed" in prompted.text
    previous = tiny_en_asr._previous_text(HINT, 224)
    tokens = tiny_en_asr.bundle.tokens
    assert previous[0] == tokens.start_of_prev
    assert tiny_en_asr.bundle.tokenizer.decode(previous[1:]) == " " + HINT
    prefix = tiny_en_asr.bundle.prompt("en", "transcribe", False, previous)
    features = tiny_en_asr.bundle.feature_extractor(load_audio(FILES[1]).samples, sampling_rate=16000,
                                                    return_tensors="pt").input_features
    with torch.no_grad():
        hf = tiny_en_asr.bundle.model.generate(input_features=features, decoder_input_ids=torch.tensor([prefix]),
                                               max_new_tokens=100, do_sample=False, num_beams=1)
    assert prompted.tokens == hf.tolist()[0] + [tokens.end_of_text]


def test_a_prompt_in_timestamp_mode_and_its_limits(tiny_en_asr):
    out = tiny_en_asr.transcribe(FILES[1], temperature=0, initial_prompt=HINT, word_timestamps=True).transcripts[0]
    assert "ill-disposed" in out.text and out.segments[0].no_speech_prob < 0.1
    long = tiny_en_asr._previous_text("word " * 2000, 224)
    assert len(long) - 1 <= tiny_en_asr.model.max_positions - 224 - 72        # the last tokens, room left to decode
    assert tiny_en_asr._previous_text("  ", 224) == [] and tiny_en_asr._previous_text(None, 224) == []
    with pytest.raises(InputError, match="initial_prompt must be text"):
        tiny_en_asr.transcribe(FILES[1], initial_prompt=5)


@pytest.fixture(scope="module")
def base_asr():
    from mmaccel.speech.pipeline import ASRPipeline

    return installed(lambda: ASRPipeline.from_pretrained("builtin:base"), "Whisper base")


@pytest.mark.parametrize("method", ["speculative", "eagle"])
def test_lossless_methods_stay_lossless_under_a_prompt(base_asr, method):
    greedy = base_asr.transcribe(FILES[:2], temperature=0, initial_prompt=HINT).transcripts
    fast = base_asr.transcribe(FILES[:2], method, temperature=0, initial_prompt=HINT).transcripts
    assert [t.tokens for t in fast] == [t.tokens for t in greedy]
