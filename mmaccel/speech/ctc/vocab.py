"""A CTC model's output vocabulary and how its label sequences become text, words and timestamps.

Two spellings of word boundaries are common: character models emit a delimiter token between words
(wav2vec2's `|`), sentencepiece models mark a word's first piece with `▁`. `CTCVocabulary` reads
both, so a transcript is `tokens -> words`, each word with the frames of its first and last token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mmaccel.errors import check

WORD_START = "\u2581"          # sentencepiece's word-start mark


@dataclass(frozen=True)
class Word:
    """One word of a transcript: its text and its span in seconds (first token's frame to one past the last's)."""

    text: str
    start: float
    end: float


@dataclass
class CTCHypothesis:
    """A decoded utterance: label ids (blanks and repeats removed), the frame each label was emitted at,
    the words with their times, and the hypothesis score (natural log: acoustic + weighted fusion scores)."""

    tokens: list[int]
    frames: list[int]
    text: str
    words: list[Word] = field(default_factory=list)
    score: float = 0.0


class CTCVocabulary:
    """Labels of a CTC model: `tokens[i]` is the string of label i, `blank` the blank label; `delimiter`
    (default `|`) is the word-boundary token of character models (None: words start at `▁` pieces or,
    failing that, a token that is a plain space)."""

    def __init__(self, tokens: Sequence[str], blank: int = 0, delimiter: str | None = "|"):
        tokens = list(tokens)
        check(len(tokens) >= 2 and all(isinstance(t, str) for t in tokens),
              f"a CTC vocabulary needs at least a blank and one label, all strings, got {tokens[:5]!r}")
        check(isinstance(blank, int) and 0 <= blank < len(tokens), f"blank must be a label id in [0, {len(tokens)}), "
              f"got {blank!r}")
        check(len(set(tokens)) == len(tokens), "CTC vocabulary tokens must be distinct")
        self.tokens, self.blank, self.delimiter = tokens, blank, delimiter
        self.index = {t: i for i, t in enumerate(tokens)}
        self.space = self.index.get(delimiter) if delimiter is not None else self.index.get(" ")

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        """Character-level label ids of `text` (spaces -> the delimiter); unknown characters are an error."""
        check(self.space is not None or " " not in text.strip(), "this vocabulary has no word delimiter to spell a space")
        ids = []
        for word_index, word in enumerate(text.split()):
            if word_index and self.space is not None:
                ids.append(self.space)
            for ch in word:
                check(ch in self.index, f"{ch!r} (in {word!r}) is not a token of this vocabulary")
                ids.append(self.index[ch])
        return ids

    def words(self, tokens: Sequence[int], frames: Sequence[int], frame_seconds: float) -> list[Word]:
        """Group labels into words; a word spans from its first label's frame to one past its last label's."""
        out: list[Word] = []
        text, first, last = "", None, None

        def close():
            if text:
                out.append(Word(text, round(first * frame_seconds, 3), round((last + 1) * frame_seconds, 3)))

        for token, frame in zip(tokens, frames):
            piece = self.tokens[token]
            if token == self.space:
                close()
                text, first = "", None
                continue
            if piece.startswith(WORD_START) and text:
                close()
                text, first = "", None
            piece = piece.lstrip(WORD_START)
            if not piece:
                continue
            text, first, last = text + piece, frame if first is None else first, frame
        close()
        return out

    def hypothesis(self, tokens: list[int], frames: list[int], score: float, frame_seconds: float) -> CTCHypothesis:
        words = self.words(tokens, frames, frame_seconds)
        return CTCHypothesis(tokens, frames, " ".join(w.text for w in words), words, score)
