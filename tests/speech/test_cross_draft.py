"""Cross-tokenizer drafting: Whisper tiny.en (GPT-2 English vocabulary) drafts for Whisper base
(multilingual vocabulary) through text; transcripts stay greedy's, drafts are accepted."""

import pytest

from mmaccel.errors import InputError, ModelNotFoundError
from mmaccel.speech.cross_draft import new_assistant
from mmaccel.speech.pipeline import ASRPipeline
from mmaccel.speech.whisper import WhisperBundle
from tests.speech.conftest import encode_each_clip_once, tiny_whisper
from tests.speech.test_pipeline import FILES, LIBRIVOX


@pytest.fixture(scope="module")
def base_with_tiny():
    if not LIBRIVOX.is_dir():
        pytest.skip("apt-get install pocketsphinx-testdata")
    try:
        asr = ASRPipeline.from_pretrained("builtin:base", heads=None, draft=None, assistant="builtin:tiny.en")
    except ModelNotFoundError as err:
        pytest.skip(f"Whisper base / tiny.en not installed: {err}")
    encode_each_clip_once(asr)                   # greedy and cross-drafting decode the same encoder states
    return asr


@pytest.mark.slow     # 17 s on base and tiny.en; cross-drafting on tiny models: the conformance benches
def test_tiny_en_drafts_for_base_losslessly(base_with_tiny):
    assert base_with_tiny.assistant.tokenizer is not base_with_tiny.bundle.tokenizer
    # three clips in batches of two: a batch of rows, then a row alone after it
    greedy = base_with_tiny.transcribe(FILES[:3], "greedy", batch_size=2)
    out = base_with_tiny.transcribe(FILES[:3], "speculative-cross", batch_size=2, k=4, adaptive=False)
    assert out.texts == greedy.texts
    assert out.stats.mean_accepted > 1.3 and out.stats.nfe < greedy.stats.nfe


def test_cross_drafting_needs_an_assistant_that_reads_the_same_features(base_with_tiny):
    plain = ASRPipeline(base_with_tiny.bundle)
    with pytest.raises(InputError, match="needs an assistant model"):
        plain.transcribe(FILES[:1], "speculative-cross")
    other = WhisperBundle("tiny", tiny_whisper(), base_with_tiny.bundle.tokenizer, base_with_tiny.bundle.feature_extractor,
                          base_with_tiny.bundle.tokens, base_with_tiny.bundle.path)
    with pytest.raises(InputError, match="the assistant takes 8 mel bins but the target 80"):
        new_assistant(other, base_with_tiny.bundle)
