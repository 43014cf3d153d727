"""Whisper's vocabulary: the special-token ids, looked up by string, and the tokenizer with the timestamp
tokens CTranslate2 packages leave out."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mmaccel.errors import InputError, check

LANGUAGE_TOKEN = re.compile(r"^<\|([a-z]{2,3})\|>$")  # <|en|>, <|haw|>; not <|transcribe|>, <|0.00|>
TIME_PRECISION = 0.02  # seconds per timestamp token = one encoder position (1500 per 30 s)


@dataclass(frozen=True)
class WhisperTokens:
    """Ids of Whisper's special tokens, looked up by string in the tokenizer's vocabulary."""

    start_of_transcript: int  # <|startoftranscript|>, the decoder start token
    end_of_text: int  # <|endoftext|>: eos, pad and bos
    no_timestamps: int  # <|notimestamps|>
    transcribe: int  # <|transcribe|>
    translate: int  # <|translate|>
    start_of_prev: int | None  # <|startofprev|>, begins a text prompt (previous context)
    languages: dict[str, int] = field(default_factory=dict)  # "en" -> id of <|en|>; empty if English-only
    no_speech: int | None = None  # <|nospeech|> (<|nocaptions|> in older vocabularies)

    @property
    def multilingual(self) -> bool:
        return bool(self.languages)

    def prompt(self, language: str | None = "en", task: str = "transcribe", timestamps: bool = False,
               previous: Sequence[int] = ()) -> list[int]:
        """Decoder prompt: [`previous`] <|startoftranscript|> [<|lang|> <|task|>] [<|notimestamps|>].

        The language and task tokens exist only for multilingual models; English-only models take
        `language` "en" or None and `task` "transcribe". `previous`: a text prompt, <|startofprev|> and its
        tokens (`ASRPipeline.transcribe`'s `initial_prompt`).
        """
        check(task in ("transcribe", "translate"), f"task must be 'transcribe' or 'translate', got {task!r}")
        ids = [*previous, self.start_of_transcript]
        if self.multilingual:
            if language not in self.languages:
                raise InputError(f"unknown language {language!r}; this model knows {', '.join(sorted(self.languages))}")
            ids += [self.languages[language], self.transcribe if task == "transcribe" else self.translate]
        else:
            check(language in ("en", None), f"this is an English-only Whisper; language must be 'en' or None, got {language!r}")
            check(task == "transcribe", "this is an English-only Whisper; it can only transcribe")
        if not timestamps:
            ids.append(self.no_timestamps)
        return ids


def whisper_tokens(vocab: Mapping[str, int], multilingual: bool, what: str = "tokenizer") -> WhisperTokens:
    """Find Whisper's special tokens in `vocab` (token string -> id, added tokens included)."""

    def lookup(token: str) -> int:
        if token not in vocab:
            raise InputError(f"{what} has no {token} token; it is not a Whisper tokenizer")
        return int(vocab[token])

    languages = {}
    if multilingual:
        languages = {m.group(1): int(i) for tok, i in vocab.items() if (m := LANGUAGE_TOKEN.match(tok))}
        check("en" in languages, f"{what} has no language tokens (<|en|>, ...) but the model is multilingual")
    return WhisperTokens(
        start_of_transcript=lookup("<|startoftranscript|>"),
        end_of_text=lookup("<|endoftext|>"),
        no_timestamps=lookup("<|notimestamps|>"),
        transcribe=lookup("<|transcribe|>"),
        translate=lookup("<|translate|>"),
        start_of_prev=vocab.get("<|startofprev|>"),
        languages=languages,
        no_speech=vocab.get("<|nospeech|>", vocab.get("<|nocaptions|>")),
    )


def whisper_tokenizer(path: Path, vocab_size: int, max_source_positions: int = 1500):
    """A fast tokenizer from a `tokenizer.json`, with Whisper's timestamp tokens added if missing.

    CTranslate2 packages ship tokenizer.json without the timestamp tokens <|0.00|> ... <|30.00|>
    (one per encoder position, ids after <|notimestamps|>); adding them makes `len(tokenizer)`
    equal the model's vocabulary, so every id the model can emit decodes.
    """
    from transformers import PreTrainedTokenizerFast

    eot = "<|endoftext|>"
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token=eot, pad_token=eot, bos_token=eot, unk_token=eot)
    missing = vocab_size - len(tokenizer)
    first = tokenizer.convert_tokens_to_ids("<|notimestamps|>") + 1
    if missing == max_source_positions + 1 and first == len(tokenizer):
        tokenizer.add_tokens([f"<|{i * TIME_PRECISION:.2f}|>" for i in range(missing)])
    return tokenizer
