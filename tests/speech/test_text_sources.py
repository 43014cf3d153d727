"""The extra text sources: roff to text, the plain-sentence filter, and what is kept out."""

import pytest

from mmaccel.errors import ModelNotFoundError
from mmaccel.speech.text_sources import _clean, is_plain, man_sentences, plain_sentences, roff_text


def test_roff_text_keeps_the_words_and_drops_requests_and_escapes():
    source = (".TH OPEN 2\n.SH DESCRIPTION\nThe \\fBopen\\fP() system call opens the file\n"
              ".I pathname\nin the \\fIgiven\\fR mode\\(emif it can.\n.PP\nA second paragraph starts here and runs on.\n")
    text = roff_text(source)
    assert "\\" not in text and "TH" not in text
    assert "The open() system call opens the file pathname in the given mode - if it can." in text
    sentences = [s for p in text.split("\n\n") for s in plain_sentences(p)]
    assert sentences == ["A second paragraph starts here and runs on."]     # "open()" is not plain prose


def test_plain_sentences_are_readable_prose():
    assert is_plain("The kernel returns an error to the caller.")
    for bad in ("too short to keep.", "The FILE is opened by the kernel.", "Call open(2) with the flags given.",
                "lowercase start is not a sentence here.", "No final stop in this one at all"):
        assert not is_plain(bad), bad
    assert plain_sentences("It works well on most systems.  It  never fails in a bad way!") == [
        "It works well on most systems.", "It never fails in a bad way!"]


def test_legal_text_and_identifiers_are_kept_out():
    kept = _clean(["You may redistribute copies of this program freely.", "The MandatoryRelease field names it.",
                   "The buffer is flushed when the stream is closed.", "The buffer is flushed when the stream is closed."])
    assert kept == ["The buffer is flushed when the stream is closed."]


def test_a_missing_man_page_package_is_named():
    with pytest.raises(ModelNotFoundError, match="not-a-package"):
        man_sentences("not-a-package")
