"""Many requests' audio decoded in one call whose rows take the next waiting window as they end: continuous
batching for speech (`mmaccel serve`'s transcriptions).

A `JoinedTranscription` is the decode loop's `RowFeed` (`mmaccel.core.speculative`): the call starts on the first
requests' windows; when a row ends, its window's result is made there and then (scores, words, the temperature
fallback's re-decodes of that window alone), the next window of a request decoded window after window (timestamp
mode) goes first in the queue, and the row starts over on the oldest waiting window, encoded a batch ahead
(`WhisperDecoderModel.admit`). When the queue is empty it asks its `AudioSource` for a waiting request. Each
request is answered as soon as its last window is final; one whose client went away frees its rows.

Every window is decoded as `transcribe` decodes it (same prompt, rules and fallback), and a row's tokens do not
depend on the rows beside it, so each request gets what it gets alone (greedy and the lossless methods that
join: greedy, speculative, early-exit, ngram).

>>> call = JoinedTranscription(asr, source, first, rows=8, method="greedy", language="en")
>>> call.run()          # answers every request through source.finish
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from mmaccel.core.sampling import Sampling
from mmaccel.core.stats import DecodeStats
from mmaccel.errors import check
from mmaccel.speech.audio import Audio
from mmaccel.speech.decoder_audio import EncodedAudio
from mmaccel.speech.fallback import TEMPERATURES, Fallback
from mmaccel.speech.pipeline import MAX_NEW_TOKENS
from mmaccel.speech.scoring import score_tokens
from mmaccel.speech.transcript import Transcript, WindowResult, join_windows, window_result
from mmaccel.speech.vad import VadParameters
from mmaccel.speech.windows import Window, audio_windows, next_window


class AudioSource(Protocol):
    """Where a joined call's requests come from and go to."""

    def take(self) -> tuple[Any, Audio] | None:
        """The next waiting request (a handle and its audio), or None (the call takes no more now)."""

    def finish(self, handle: Any, transcript: Transcript) -> None:
        """Request `handle` is done: its transcript."""

    def gone(self, handle: Any) -> bool:
        """Whether request `handle`'s client went away (its rows are then freed)."""

    def release(self, handle: Any) -> None:
        """Request `handle`'s rows are freed (its client went away): the call holds it no more."""


@dataclass
class _Request:
    handle: Any
    number: int
    transcript: Transcript
    open: int = 0                                   # its windows queued or decoding
    parts: dict[int, WindowResult] = field(default_factory=dict)


class JoinedTranscription:
    """One continuous-batching call of `pipe` over the requests of `source` (see the module doc). `first`: the
    requests it starts with; `rows`: the call's rows (spare rows beyond the first windows wait for requests to
    come); the options are `transcribe`'s (a method that joins, the fallback starting at temperature 0)."""

    def __init__(self, pipe, source: AudioSource, first: list[tuple[Any, Audio]], *, rows: int,
                 method: str = "greedy", language: str | None = "en", task: str = "transcribe",
                 timestamps: bool = False, word_timestamps: bool = False, vad_filter: bool = False,
                 temperature: float | tuple[float, ...] = TEMPERATURES, initial_prompt: str | None = None,
                 encoder: str | None = None, max_new_tokens: int = MAX_NEW_TOKENS, **method_params: Any):
        check(isinstance(rows, int) and rows >= 1, f"rows must be an int >= 1, got {rows!r}")
        d = Fallback()
        fallback = Fallback.of(temperature, d.compression_ratio_threshold, d.log_prob_threshold,
                               d.no_speech_threshold, d.best_of, d.seed)
        check(fallback.temperatures[0] == 0.0, "a joined call decodes greedily first (temperature 0)")
        self.pipe, self.source, self.rows, self.language = pipe, source, rows, language
        self.job = pipe._job(method, method_params, language=language, task=task,
                             max_new_tokens=max_new_tokens,
                             encoder=encoder, timestamps=timestamps, word_timestamps=word_timestamps,
                             fallback=fallback, adaptive=False, initial_prompt=initial_prompt)
        check(self.job.spec.joins(self.job.resources),
              f"method {self.job.spec.name!r} cannot take requests in the middle of a call")
        self.vad = VadParameters() if vad_filter else None
        self.stats = DecodeStats()
        self.requests: dict[int, _Request] = {}    # open requests (answered and abandoned ones leave)
        self.numbers = itertools.count()
        self.queue: list[Window] = []               # windows waiting for a row, oldest first
        self.table: dict[int, tuple[Window, EncodedAudio]] = {}      # row -> its window and that window's audio
        for handle, audio in first:
            self._add(handle, audio)

    # ---- requests -------------------------------------------------------------------------------

    def _add(self, handle: Any, audio: Audio) -> None:
        """A request's windows join the queue (its language detected first, where it is not given)."""
        number = next(self.numbers)
        [transcript], windows = audio_windows([audio], None, self.vad, follow=self.job.rules is not None)
        windows = [dataclasses.replace(w, input=number) for w in windows]
        request = self.requests[number] = _Request(handle, number, transcript, len(windows))
        if transcript.error is None and self.language is None and self.pipe.bundle.tokens.multilingual:
            with self.stats.timed("language"):
                self.pipe._detect_languages({number: transcript}, windows, self.job, len(windows))
        transcript.language = None if transcript.error is not None else transcript.language or self.language or "en"
        self.queue += windows
        if not windows:             # nothing to decode (unreadable, or no speech under VAD)
            self._answer(request)

    def _answer(self, request: _Request) -> None:
        del self.requests[request.number]
        join_windows({0: request.transcript}, {0: request.parts})
        self.source.finish(request.handle, request.transcript)

    def _take(self) -> bool:
        """Whether a waiting request's windows joined the queue."""
        taken = self.source.take()
        if taken is not None:
            self._add(*taken)
        return taken is not None

    # ---- the call -------------------------------------------------------------------------------

    def run(self) -> DecodeStats:
        """Decode until every request taken is answered and none waits; the call's statistics."""
        while self.queue or self._take():
            first = self._pop(self.rows)
            if not first:
                continue
            spare = self.rows - len(first)      # rows for requests to come: a copy of the first window's, ended at once
            self.inputs = inputs = EncodedAudio.concat([audio for _, audio in first] + [first[0][1]] * spare)
            self.table = dict(enumerate(first))
            self.limits = [self.job.max_new_tokens] * len(first) + [1] * spare
            prompts = inputs.prompt.tolist()
            eot = self.pipe.bundle.tokens.end_of_text
            gen = self.job.spec.run(self.job.resources, inputs, max_new_tokens=self.job.max_new_tokens,
                                    sampling=Sampling(0.0), eos_token_id=eot, prompt_tokens=prompts, feed=self)
            self.stats = self.stats + gen.stats
        return self.stats

    def _pop(self, n: int) -> list[tuple[Window, EncodedAudio]]:
        """Up to `n` queued windows of live requests, oldest first, with their audio (encoded a batch ahead)."""
        self.queue = [w for w in self.queue if not self._drop(w)]
        batch, self.queue = self.queue[:n], self.queue[n:]
        if not batch:
            return []
        ahead = self.queue[: max(0, self.rows - len(batch))]       # encoded with them, for rows to come
        encoded = self.pipe._encode(self.job, batch + ahead, [self._prompt(w) for w in batch + ahead], self.stats)
        for row, w in enumerate(ahead, len(batch)):
            self.job.states[w.input, w.index] = encoded.select_rows(torch.tensor([row]), self.pipe.model.device)
        return [(w, encoded.select_rows(torch.tensor([row]), self.pipe.model.device)) for row, w in enumerate(batch)]

    def _prompt(self, window: Window) -> list[int]:
        owner = self.requests[window.input].transcript
        return self.pipe.bundle.prompt(owner.language, self.job.task, self.job.rules is not None, self.job.previous)

    def _drop(self, window: Window) -> bool:
        """Whether `window`'s request went away (it is then closed: no result is made for it)."""
        request = self.requests.get(window.input)
        if request is not None and not self.source.gone(request.handle):
            return False
        if request is not None:                     # its other windows find it gone
            del self.requests[window.input]
            self.source.release(request.handle)
        self.job.states.pop((window.input, window.index), None)
        return True

    # ---- RowFeed --------------------------------------------------------------------------------

    reserve = 0                 # a window's prompt is as long as every other's of the call

    def finished(self, row: int, tokens: list[int], passes: list[int]) -> None:
        if row not in self.table:                   # a spare row, or one whose request went away
            return
        window, audio = self.table.pop(row)
        request = self.requests[window.input]
        tried = [self._result(window, self.inputs.row_view(row), tokens)]      # the call's keys/values of the row
        request.transcript.passes += len(set(passes))
        fallback = self.job.fallback
        if len(fallback.temperatures) > 1:
            self.job.states[window.input, window.index] = audio
        while fallback.retry(tried[-1], window.attempt):       # decoded again, this window alone
            window = dataclasses.replace(window, attempt=window.attempt + 1)
            redecoded: dict[tuple[int, int], list[WindowResult]] = {}
            self.stats = self.stats + self.pipe._transcribe_batch(self.job, [window], [request.transcript], redecoded)
            tried += redecoded[window.input, window.index]
        self.job.states.pop((window.input, window.index), None)
        part = request.parts[window.index] = fallback.final(tried)
        following = next_window(window, part.complete) if window.clip is not None else None
        if following is not None:                   # goes first: its request has waited longest
            self.queue.insert(0, dataclasses.replace(following, attempt=0))
            return
        request.open -= 1
        if request.open == 0:
            self._answer(request)

    def next(self, row: int, max_prompt: int):
        if not self.queue:
            self._take()
        taken = self._pop(1)
        if not taken:
            return None
        self.table[row] = taken[0]
        window, audio = taken[0]
        return audio.prompt[0].tolist(), self.job.max_new_tokens, audio

    def dropped(self) -> list[int]:
        gone = [row for row, (w, _) in self.table.items() if self._drop(w)]
        for row in gone:
            del self.table[row]
        return gone

    # ---- a window's result ----------------------------------------------------------------------

    def _result(self, window: Window, audio: EncodedAudio, tokens: list[int]) -> WindowResult:
        """`window`'s result from its greedy `tokens`: scores and words as `transcribe` makes them."""
        job, pipe = self.job, self.pipe
        scores = None
        if job.rules is not None or job.fallback.scored:
            with self.stats.timed("scores"):
                scores = score_tokens(pipe.model, audio, [tokens], pipe.bundle.tokens.no_speech, len(job.previous))[0]
        part = window_result(pipe.bundle.tokenizer, tokens, window, job.rules, scores, 0.0)
        if job.heads is not None:
            with self.stats.timed("words"):
                pipe._add_words(job, audio, 0, part, self.requests[window.input].transcript)
        return part
