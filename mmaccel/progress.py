"""Progress bars for the long commands (eval, bench, training scripts).

tqdm on stderr with `disable=None`: a bar is drawn only when stderr is a terminal, so logs, CI and
piped runs see exactly the lines they saw before. Lines printed while a bar is up go above it:
`bars_cleared()` around a print, `LogAboveBars` as the console handler of `logging`.

`say` writes a whole line in one call: under `torchrun` several ranks share one stderr pipe, and a
line written in two pieces (`print` writes the text, then the newline; unbuffered under
PYTHONUNBUFFERED) can be cut by another rank's line.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def progress(iterable: Iterable[T] | None = None, *, desc: str, total: int | None = None, initial: int = 0,
             unit: str = "it", enabled: bool = True) -> tqdm:
    """A tqdm bar over `iterable` (or a manual one: `.update(n)`, `.close()`), on stderr when it is a
    terminal and `enabled` (e.g. only on rank 0)."""
    return tqdm(iterable, desc=desc, total=total, initial=initial, unit=unit, file=sys.stderr, dynamic_ncols=True,
                disable=None if enabled else True)


def say(message: str) -> None:
    """`message` as one line on stderr, in a single write (atomic on a pipe up to PIPE_BUF bytes)."""
    with bars_cleared():
        sys.stderr.write(message.rstrip("\n") + "\n")
        sys.stderr.flush()


@contextmanager
def bars_cleared() -> Iterator[None]:
    """Clear the active bars while the block prints to stdout/stderr, then redraw them."""
    with tqdm.external_write_mode(file=sys.stderr):
        yield


class LogAboveBars(logging.StreamHandler):
    """A console `logging` handler whose lines go above any active progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        with bars_cleared():
            super().emit(record)
