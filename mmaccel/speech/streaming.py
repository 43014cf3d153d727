"""Live transcription: audio arrives in chunks, words come out as soon as two consecutive hypotheses agree on them.

The policy is local agreement (as whisper_streaming's LocalAgreement-2): the audio received since the last
cut is transcribed again, with word times, each time at least `min_chunk_s` more has arrived; a word is
committed once two consecutive hypotheses agree on it and on every word before it, and a committed word is
never retracted. When the buffer grows past `trim_s`, it is cut at the end of a segment whose words are all
committed (or, near Whisper's 30 s, at the last committed word), so every decode sees at most one window.

Each committed word reports its emission delay: the wall time of its commit minus the wall time at which its
end was spoken, taking the stream's first chunk to have arrived when it was fully spoken (so on audio played
at real time, the delay is what a listener waits for the word). Any method of `ASRPipeline.transcribe` runs;
a lossless one decodes the same hypotheses as greedy, only sooner, which shortens the delay.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from mmaccel.errors import check
from mmaccel.speech.alignment import Word
from mmaccel.speech.audio import SAMPLE_RATE, WINDOW_S, Audio, Resampler, check_finite, is_silent

TOLERANCE_S = 0.5        # a hypothesis word that starts up to this much before the last committed end may be new
MAX_REPEAT = 5           # ... unless it repeats the committed words' tail (up to this many words)


@dataclass
class CommittedWord:
    """A word committed by a stream: its times in the stream (s), and its emission delay (s)."""

    start: float
    end: float
    word: str
    probability: float
    delay: float


@dataclass
class StreamUpdate:
    """What one decode of a stream gives: the words committed now, and the rest of the hypothesis (which a
    later decode may still change)."""

    committed: list[CommittedWord]
    tentative: list[Word]
    received_s: float                 # seconds of audio received so far


def _key(word: str) -> str:
    return re.sub(r"[^\w']", "", word.lower())


@dataclass
class LocalAgreement:
    """Commits the words two consecutive hypotheses agree on, in order; never takes one back."""

    committed: list[Word] = field(default_factory=list)
    pending: list[Word] = field(default_factory=list)       # the last hypothesis after the committed words

    @property
    def committed_end(self) -> float:
        return self.committed[-1].end if self.committed else 0.0

    def update(self, hypothesis: list[Word]) -> list[Word]:
        """Take a new hypothesis (words with stream times); return the words it commits. Word times move a
        little between decodes, so the words from just before the committed end on are taken as new, less any
        that repeat the committed words' tail."""
        fresh = [w for w in hypothesis if w.start > self.committed_end - TOLERANCE_S]
        if fresh and self.committed and fresh[0].start < self.committed_end + 1.0:
            for n in range(min(MAX_REPEAT, len(fresh), len(self.committed)), 0, -1):
                if [_key(w.word) for w in self.committed[-n:]] == [_key(w.word) for w in fresh[:n]]:
                    fresh = fresh[n:]
                    break
        agreed = 0
        while agreed < min(len(fresh), len(self.pending)) and _key(fresh[agreed].word) == _key(self.pending[agreed].word):
            agreed += 1
        self.committed += fresh[:agreed]
        self.pending = fresh[agreed:]
        return fresh[:agreed]

    def finish(self) -> list[Word]:
        """Commit what the last hypothesis still holds (the stream has ended)."""
        rest, self.pending = self.pending, []
        self.committed += rest
        return rest


class Streamer:
    """Feeds one stream's chunks to `transcribe` (an `ASRPipeline.transcribe` with its method and options
    bound) and applies local agreement. `clock`: the wall clock the delays are measured with."""

    def __init__(self, transcribe: Callable[[Audio], Any], *, sample_rate: int = SAMPLE_RATE, min_chunk_s: float = 1.0,
                 trim_s: float = 15.0, clock: Callable[[], float] = time.perf_counter):
        check(0.0 < min_chunk_s <= 10.0, f"min_chunk_s must be in (0, 10], got {min_chunk_s!r}")
        check(min_chunk_s < trim_s <= WINDOW_S - min_chunk_s,
              f"trim_s must be in ({min_chunk_s}, {WINDOW_S - min_chunk_s}], got {trim_s!r}")
        self.transcribe, self.min_chunk_s, self.trim_s, self.clock = transcribe, min_chunk_s, trim_s, clock
        self.resample = Resampler(sample_rate, "stream")
        self.buffer = np.zeros(0, np.float32)
        self.buffer_start = 0.0          # stream time of the buffer's first sample
        self.received = 0                # samples received (16 kHz)
        self.decoded_to = 0              # ... of which the last decode saw
        self.t0: float | None = None     # wall time at which stream time 0 was spoken
        self.agreement = LocalAgreement()

    def feed(self, chunk: np.ndarray) -> StreamUpdate | None:
        """Add a chunk of samples (mono, the stream's sample rate); decode when `min_chunk_s` has gathered."""
        chunk = np.asarray(chunk, dtype=np.float32)
        check(chunk.ndim == 1, f"a stream's chunks are mono sample arrays, got shape {chunk.shape}")
        check_finite(chunk, "a stream chunk")
        samples = self.resample(chunk)
        if self.t0 is None:
            self.t0 = self.clock() - len(samples) / SAMPLE_RATE
        self.buffer = np.concatenate([self.buffer, samples])
        self.received += len(samples)
        if (self.received - self.decoded_to) / SAMPLE_RATE < self.min_chunk_s:
            return None
        return self._decode(final=False)

    def finish(self) -> StreamUpdate:
        """The stream has ended: decode what is left and commit all of it."""
        tail = self.resample.flush()
        self.buffer, self.received = np.concatenate([self.buffer, tail]), self.received + len(tail)
        return self._decode(final=True)

    def _decode(self, final: bool) -> StreamUpdate:
        self.decoded_to = self.received
        hypothesis: list[Word] = []
        ends: list[float] = []
        if len(self.buffer) and not is_silent(Audio(self.buffer)):
            transcript = self.transcribe(Audio(self.buffer, "stream")).transcripts[0]
            for s in transcript.segments:
                hypothesis += [Word(w.start + self.buffer_start, w.end + self.buffer_start, w.word, w.probability)
                               for w in s.words or []]
                ends.append(s.end + self.buffer_start)
        words = self.agreement.update(hypothesis)
        if final:
            words += self.agreement.finish()
        now = self.clock()
        committed = [CommittedWord(w.start, w.end, w.word, w.probability, now - (self.t0 + w.end)) for w in words]
        self._trim(ends)
        return StreamUpdate(committed, list(self.agreement.pending), self.received / SAMPLE_RATE)

    def _trim(self, segment_ends: list[float]) -> None:
        """Cut the buffer at the last segment end (but the last segment's) that every committed word reaches,
        once it is longer than `trim_s`; at the last committed word when it nears 30 s."""
        length = len(self.buffer) / SAMPLE_RATE
        if length <= self.trim_s:
            return
        done = self.agreement.committed_end
        cuts = [e for e in segment_ends[:-1] if self.buffer_start < e <= done + 1e-6]
        if not cuts and length > WINDOW_S - self.min_chunk_s and done > self.buffer_start:
            cuts = [done]
        if cuts:
            cut = int(round((cuts[-1] - self.buffer_start) * SAMPLE_RATE))
            self.buffer, self.buffer_start = self.buffer[cut:], self.buffer_start + cut / SAMPLE_RATE


def stream_updates(streamer: Streamer, chunks: Iterable[np.ndarray]) -> Iterator[StreamUpdate]:
    """Every update of `streamer` over `chunks`, the final one last."""
    for chunk in chunks:
        update = streamer.feed(chunk)
        if update is not None:
            yield update
    yield streamer.finish()


def realtime_chunks(samples: np.ndarray, sample_rate: int, chunk_s: float = 0.1,
                    clock: Callable[[], float] = time.perf_counter,
                    sleep: Callable[[float], None] = time.sleep) -> Iterator[np.ndarray]:
    """`samples` as a live source gives them, playback starting at the first request: each time it is asked,
    all the audio spoken since it was last asked, waiting until at least `chunk_s` of it has been."""
    step, start, sent = max(1, int(chunk_s * sample_rate)), clock(), 0
    while sent < len(samples):
        due = min(len(samples), int((clock() - start) * sample_rate))
        if due - sent < step and due < len(samples):
            sleep((min(len(samples), sent + step) - due) / sample_rate)
            continue
        yield samples[sent:due]
        sent = due


def pcm_chunks(stream: BinaryIO, sample_rate: int, chunk_s: float = 0.1) -> Iterator[np.ndarray]:
    """Raw 16-bit little-endian mono PCM read from `stream` (e.g. stdin) as float chunks of about `chunk_s`."""
    size = 2 * max(1, int(chunk_s * sample_rate))
    left = b""
    while block := stream.read(size):
        block, left = left + block, b""
        if len(block) % 2:
            block, left = block[:-1], block[-1:]
        yield np.frombuffer(block, dtype="<i2").astype(np.float32) / 32768.0
