"""Corpus WER: parity with jiwer, the Whisper English normaliser, and clear errors."""

import jiwer
import pytest

from mmaccel.errors import InputError
from mmaccel.metrics.rtf import rtfx
from mmaccel.metrics.wer import corpus_wer, normalize, normalizer_version

REFS = ["the cat sat on the mat", "he was not an ill disposed young man", "ten of clubs", "go forward ten meters"]
HYPS = ["the cat sat on a mat today", "he was not an old sposed young man", "10 of clubs", "forward ten metres"]


def test_unnormalised_wer_equals_jiwer():
    ours = corpus_wer(REFS, HYPS, normalized=False)
    assert ours.wer == pytest.approx(jiwer.wer(REFS, HYPS), abs=1e-6)
    assert (ours.words, ours.utterances) == (sum(len(r.split()) for r in REFS), 4)


def test_normalised_wer_equals_jiwer_on_normalised_text():
    ours = corpus_wer(REFS, HYPS)
    assert ours.wer == pytest.approx(jiwer.wer([normalize(r) for r in REFS], [normalize(h) for h in HYPS]), abs=1e-6)
    assert ours.errors == 5      # "a"/"the" + "today" inserted; "old"/"ill" + "sposed"/"disposed"; "go" deleted


def test_whisper_normaliser_numbers_spelling_and_fillers():
    assert normalize("Ten of clubs") == normalize("10 of clubs") == "10 of clubs"
    assert normalize("Um, the colour, Mr. Smith!") == "the color mister smith"
    assert "EnglishTextNormalizer" in normalizer_version() and "english.json" in normalizer_version()


def test_bad_wer_input_is_refused():
    with pytest.raises(InputError, match="2 references but 1 hypotheses"):
        corpus_wer(["a", "b"], ["a"])
    with pytest.raises(InputError, match="no utterances"):
        corpus_wer([], [])
    with pytest.raises(InputError, match="references have no words"):
        corpus_wer(["um"], ["hello"])
    with pytest.raises(InputError, match="wall time must be > 0"):
        rtfx(10.0, 0.0)
    assert rtfx(10.0, 2.0) == 5.0
