"""N-gram language models in the ARPA back-off format: read, write and query.

The ARPA format (Doug Paul's, written by SRILM and KenLM `lmplz`) lists every stored n-gram with its
log10 probability and, below the highest order, a log10 back-off weight:

    \\data\\
    ngram 1=5
    ngram 2=4

    \\1-grams:
    -0.6    a    -0.3
    ...
    \\2-grams:
    -0.4    a b
    ...
    \\end\\

A query not stored falls back to the next shorter context (Katz 1987; the same rule KenLM applies):
log10 P(w | h) = log10 P(w | h) when `h w` is listed, else backoff(h) + log10 P(w | h[1:]), where
backoff(h) is 0 when `h` is not listed itself.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from mmaccel.errors import InputError, ModelNotFoundError

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
PROB_EPS = 1e-6          # log10 probabilities up to this far above 0 are float noise from the writer, not errors
SHOW_CHARS = 80          # an offending line is quoted up to this many characters in an error

ArpaSource = str | os.PathLike | IO[str] | IO[bytes]
NGramTable = dict[tuple[str, ...], tuple[float, float]]

_NGRAM_COUNT = re.compile(r"ngram\s+(\d+)\s*=\s*(\d+)")
_SECTION = re.compile(r"\\(\d+)-grams:")
_WORD = re.compile(r"\S+")


@dataclass
class NGramModel:
    """A back-off n-gram LM, as stored in an ARPA file.

    `ngrams[n - 1]` maps each stored n-gram (a tuple of n words) to `(log10_prob, log10_backoff)`;
    the backoff is 0.0 where the file gives none, and always 0.0 at the highest order. Words are any
    whitespace-free strings; `<s>`, `</s>` and `<unk>` are the usual specials (`<s>` is only ever a
    context, so its unigram usually has log10 prob -99).
    """

    order: int
    ngrams: list[NGramTable]

    def __post_init__(self) -> None:
        if isinstance(self.order, bool) or not isinstance(self.order, int) or self.order < 1:
            raise InputError(f"an n-gram model's order must be an integer >= 1, got {self.order!r}")
        if len(self.ngrams) != self.order:
            raise InputError(f"an order-{self.order} n-gram model needs {self.order} n-gram tables (unigrams first), "
                             f"got {len(self.ngrams)}")

    @property
    def vocabulary(self) -> list[str]:
        """The unigram words, in stored order (specials included)."""
        return [gram[0] for gram in self.ngrams[0]]

    def log10_prob(self, context: Sequence[str], word: str) -> float:
        """log10 P(word | context) by the back-off rule.

        Only the last `order - 1` words of `context` matter. A word without a unigram scores as
        `<unk>`; without an `<unk>` unigram that raises InputError.
        """
        context = tuple(context)[-(self.order - 1):] if self.order > 1 else ()
        backoff = 0.0
        while True:
            hit = self.ngrams[len(context)].get(context + (word,))
            if hit is not None:
                return backoff + hit[0]
            if not context:
                unk = self.ngrams[0].get((UNK,))
                if unk is None:
                    raise InputError(f"{word!r} is not in the n-gram model's vocabulary and the model has no <unk> "
                                     "unigram to score it with; map unknown words to <unk> or re-estimate the LM")
                return backoff + unk[0]
            # a context the model never stored carries no weight (log10 1 = 0)
            stored = self.ngrams[len(context) - 1].get(context)
            if stored is not None:
                backoff += stored[1]
            context = context[1:]

    def score_sentence(self, words: Sequence[str], bos: bool = True, eos: bool = True) -> float:
        """The log10 probability of `words` as one sentence: P(w1 | <s>) ... P(</s> | ... wn)."""
        context: tuple[str, ...] = (BOS,) if bos else ()
        total = 0.0
        keep = self.order - 1
        for word in [*words, EOS] if eos else words:
            total += self.log10_prob(context, word)
            context = (context + (word,))[-keep:] if keep else ()
        return total


def read_arpa(path_or_text: ArpaSource) -> NGramModel:
    """Read an ARPA file into an `NGramModel`.

    `path_or_text` is a path (str or PathLike; gzip files are recognised by their magic bytes, so
    `lm.arpa.gz` works), an open text or binary file object, or the ARPA text itself (a str that
    contains a newline). Lines may use tabs or spaces and CRLF endings; lines before `\\data\\` are
    skipped. Raises ModelNotFoundError for a missing file and InputError, naming the 1-based line,
    for anything that is not valid ARPA.
    """
    if hasattr(path_or_text, "read"):
        stream = path_or_text
        name = str(getattr(stream, "name", "ARPA stream"))
        if isinstance(stream, (io.RawIOBase, io.BufferedIOBase)) or "b" in str(getattr(stream, "mode", "")):
            stream = io.TextIOWrapper(stream, encoding="utf-8-sig")
        return _parse_decoded(stream, name)
    if isinstance(path_or_text, str) and "\n" in path_or_text:
        return _parse_decoded(io.StringIO(path_or_text), "ARPA text")
    path = Path(path_or_text).expanduser()
    if not path.is_file():
        what = "is a directory, not an ARPA file" if path.is_dir() else "not found"
        raise ModelNotFoundError(f"ARPA language model {path} {what}")
    with path.open("rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
    opened = gzip.open(path, "rt", encoding="utf-8-sig") if gzipped else path.open("r", encoding="utf-8-sig")
    with opened as stream:
        return _parse_decoded(stream, str(path))


def _parse_decoded(lines: Iterable[str], name: str) -> NGramModel:
    """`_parse`, with decoding and decompression failures turned into InputError."""
    try:
        return _parse(lines, name)
    except UnicodeDecodeError as err:
        raise InputError(f"{name} is not UTF-8 text ({err}); ARPA files are read as UTF-8") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise InputError(f"{name} is a damaged gzip file ({err})") from None


def _show(line: str) -> str:
    text = line.rstrip("\r\n")
    return f"'{text[:SHOW_CHARS - 3]}...'" if len(text) > SHOW_CHARS else f"'{text}'"


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def _parse(lines: Iterable[str], name: str) -> NGramModel:
    numbered: Iterator[tuple[int, str]] = enumerate(lines, 1)
    lineno = _skip_preamble(numbered, name)
    declared, lineno, raw = _read_header(numbered, name, lineno)
    return _read_sections(_chain_first((lineno, raw), numbered), name, declared)


def _error(name: str, lineno: int, message: str) -> InputError:
    return InputError(f"{name} line {lineno}: {message}")


def _skip_preamble(numbered: Iterator[tuple[int, str]], name: str) -> int:
    """Read up to the `\\data\\` header (SRILM and some toolkits write comments before it); its line number."""
    lineno, seen_text = 0, False
    for lineno, raw in numbered:
        line = raw.strip().lstrip("\ufeff")
        seen_text = seen_text or bool(line)
        if line == "\\data\\":
            return lineno
    if not seen_text:
        raise InputError(f"{name} is empty; an ARPA file starts with a '\\data\\' header")
    raise _error(name, lineno, "reached the end of the file without a '\\data\\' header; is this an ARPA file?")


def _read_header(numbered: Iterator[tuple[int, str]], name: str, lineno: int) -> tuple[list[int], int, str]:
    """The `ngram N=count` lines after `\\data\\` (at `lineno`) -> (declared[n - 1]: the count of n-grams,
    and the number and text of the line that ends the header, the first section's)."""
    declared: list[int] = []
    for lineno, raw in numbered:
        line = raw.strip()
        if not line:
            continue
        if line.startswith("\\"):
            break
        match = _NGRAM_COUNT.fullmatch(line)
        if match is None:
            raise _error(name, lineno, f"expected 'ngram N=count' in the \\data\\ header, got {_show(raw)}")
        if int(match[1]) != len(declared) + 1:
            raise _error(name, lineno, f"expected 'ngram {len(declared) + 1}=count' next (orders are listed 1, 2, 3, "
                                       f"...), got {_show(raw)}")
        declared.append(int(match[2]))
    else:
        raise _error(name, lineno, "the file ends inside the \\data\\ header, before any n-gram section and '\\end\\'")
    if not declared:
        raise _error(name, lineno, f"the \\data\\ header lists no 'ngram N=count' lines before {_show(raw)}")
    return declared, lineno, raw


def _read_sections(numbered: Iterator[tuple[int, str]], name: str, declared: list[int]) -> NGramModel:
    """The `\\N-grams:` sections up to `\\end\\`, checked against the header's counts `declared`."""
    order = len(declared)
    ngrams: list[NGramTable] = [{} for _ in range(order)]
    current = 0                              # the order of the section being read
    template = ""                            # its line layout, for errors
    sizes: tuple[int, ...] = ()              # its allowed numbers of fields

    def fail(lineno: int, message: str) -> InputError:
        return _error(name, lineno, message)

    def close_sections(upto: int, lineno: int) -> None:
        # Called at a section header or \end\: the sections up to `upto` are now complete.
        for n in range(current, upto + 1):
            if n and len(ngrams[n - 1]) != declared[n - 1]:
                where = f"the \\{n}-grams: section has {len(ngrams[n - 1])}" if n == current else \
                    f"the file has no \\{n}-grams: section"
                raise fail(lineno, f"the \\data\\ header declares {declared[n - 1]} {n}-grams (ngram {n}="
                                   f"{declared[n - 1]}) but {where}")

    for lineno, raw in numbered:
        line = raw.strip()
        if not line:
            continue
        if line.startswith("\\"):
            if line == "\\end\\":
                close_sections(order, lineno)
                return NGramModel(order, ngrams)
            match = _SECTION.fullmatch(line)
            if match is None:
                raise fail(lineno, f"expected a '\\N-grams:' section header or '\\end\\', got {_show(raw)}")
            n = int(match[1])
            if n > order:
                raise fail(lineno, f"section \\{n}-grams: is beyond the orders the \\data\\ header declares "
                                   f"(1..{order})")
            if n <= current:
                raise fail(lineno, f"section \\{n}-grams: comes after \\{current}-grams:; sections must be in "
                                   "increasing order, each once")
            close_sections(n - 1, lineno)
            current = n
            template = f"'log10prob {' '.join(f'w{i}' for i in range(1, n + 1))}{' [backoff]' if n < order else ''}'"
            sizes = (n + 1, n + 2) if n < order else (n + 1,)
            continue
        fields = line.split()
        n = current
        if n == order and len(fields) == n + 2 and _number(fields[-1]) is not None:
            raise fail(lineno, f"{_show(raw)} has a backoff weight, but {n}-grams are the highest order and have "
                               f"none; expected {template}")
        if len(fields) not in sizes:
            raise fail(lineno, f"expected {template} for a {n}-gram, got {_show(raw)}")
        prob = _number(fields[0])
        if prob is None:
            raise fail(lineno, f"expected {template} for a {n}-gram, got {_show(raw)}: "
                               f"the log10 probability {fields[0]!r} is not a number")
        if prob > PROB_EPS:
            raise fail(lineno, f"log10 probability {fields[0]} is above 0 (a probability above 1) in {_show(raw)}")
        backoff = 0.0
        if len(fields) == n + 2:
            value = _number(fields[-1])
            if value is None:
                raise fail(lineno, f"expected {template} for a {n}-gram, got {_show(raw)}: "
                                   f"the log10 backoff {fields[-1]!r} is not a number")
            backoff = value
        gram = tuple(fields[1:n + 1])
        if gram in ngrams[n - 1]:
            raise fail(lineno, f"duplicate {n}-gram {' '.join(gram)!r} (it is listed earlier in the section)")
        ngrams[n - 1][gram] = (prob, backoff)
    raise fail(lineno, "the file ends without '\\end\\' (is it truncated?)")


def _chain_first(first: tuple[int, str], rest: Iterator[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    yield first
    yield from rest


def write_arpa(model: NGramModel, path: str | os.PathLike) -> Path:
    """Write `model` as an ARPA file (gzip-compressed when the name ends in `.gz`) and return its path.

    Tab-separated, six decimals; a backoff is written only where it is non-zero and below the
    highest order. Raises InputError, before writing anything, for an n-gram of the wrong length,
    a word with whitespace, or a backoff on the highest order.
    """
    for n, table in enumerate(model.ngrams, 1):
        for gram, (_, backoff) in table.items():
            if len(gram) != n or not all(_WORD.fullmatch(word) for word in gram):
                raise InputError(f"cannot write {gram!r} as a {n}-gram: it needs {n} non-empty words without "
                                 "whitespace")
            if n == model.order and backoff != 0.0:
                raise InputError(f"{n}-gram {' '.join(gram)!r} has backoff {backoff}, but the highest order "
                                 f"({model.order}) has none in ARPA; drop it or add an order")
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    opened = gzip.open(path, "wt", encoding="utf-8", newline="\n") if path.suffix == ".gz" else \
        path.open("w", encoding="utf-8", newline="\n")
    with opened as out:
        out.write("\\data\\\n")
        for n, table in enumerate(model.ngrams, 1):
            out.write(f"ngram {n}={len(table)}\n")
        for n, table in enumerate(model.ngrams, 1):
            out.write(f"\n\\{n}-grams:\n")
            for gram, (prob, backoff) in table.items():
                tail = f"\t{backoff:.6f}" if backoff != 0.0 and n < model.order else ""
                out.write(f"{prob:.6f}\t{' '.join(gram)}{tail}\n")
        out.write("\n\\end\\\n")
    return path
