"""Language and task: detection from the first window on the multilingual base, one-line refusals on an
English-only model and for unknown codes, and per-row prompts in one batch."""

import pytest

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.speech.pipeline import ASRPipeline
from tests.speech.test_pipeline import FILES, LIBRIVOX


@pytest.fixture(scope="module")
def base():
    if not LIBRIVOX.is_dir():
        pytest.skip("apt-get install pocketsphinx-testdata")
    try:
        return ASRPipeline.from_pretrained("builtin:base", heads=None, draft=None)
    except ModelNotFoundError as err:
        pytest.skip(f"Whisper base not installed: {err}")


def test_the_language_of_each_input_is_detected_from_its_audio(base):
    out = base.transcribe(FILES[:2], language=None, timestamps=True)
    assert [t.language for t in out.transcripts] == ["en", "en"]
    assert all(t.language_probability > 0.9 for t in out.transcripts)
    given = base.transcribe(FILES[:2], language="en", timestamps=True)
    assert [t.tokens for t in out.transcripts] == [t.tokens for t in given.transcripts]
    assert given.transcripts[0].language_probability is None         # given, not detected


@pytest.mark.slow     # 29 s on Whisper base
def test_rows_of_one_batch_decode_with_their_own_languages(base, monkeypatch):
    """Detection says French for the second clip (monkeypatched): in one batch, each row decodes with its own
    prompt and gives what it gives alone with that language."""
    import mmaccel.speech.pipeline as pipeline

    def detected(model, audio, tokens):
        return [{"en": 0.9}, {"fr": 0.8}] if audio.batch_size == 2 else [{"en": 0.9}]

    english = base.transcribe(FILES[0], language="en").transcripts[0].tokens
    french = base.transcribe(FILES[1], language="fr").transcripts[0].tokens
    monkeypatch.setattr(pipeline, "language_probabilities", detected)
    out = base.transcribe(FILES[:2], language=None, batch_size=2)
    assert [t.language for t in out.transcripts] == ["en", "fr"]
    assert [t.tokens for t in out.transcripts] == [english, french]


def test_bad_language_or_task_is_one_line(tiny_en_asr, base):
    with pytest.raises(InputError, match="English-only Whisper; language must be 'en'"):
        tiny_en_asr.transcribe(FILES[:1], language="fr")
    with pytest.raises(InputError, match="English-only Whisper; it can only transcribe"):
        tiny_en_asr.transcribe(FILES[:1], task="translate")
    with pytest.raises(InputError, match="unknown language 'xx'"):
        base.transcribe(FILES[:1], language="xx")
    with pytest.raises(InputError, match="task must be 'transcribe' or 'translate'"):
        base.transcribe(FILES[:1], task="summarise")
    assert tiny_en_asr.transcribe(FILES[:1], language=None).transcripts[0].language == "en"
