"""Requests of many clients decoded together: one worker thread owns each served model.

A request becomes a `Job`: its key (requests with equal keys can share one pipeline call: same method,
parameters and options), its payload (an audio, a class label, a prompt) and its size in rows. The worker
takes the oldest waiting job and every other waiting job with its key, up to `max_rows` rows, and runs them as
one call of the model's pipeline (`run(key, payloads) -> results`, one per payload); a request that arrives
while a call decodes waits for the next call. A job whose client went away before its call started is
dropped; the queue is bounded (`QueueFull`, which the server answers with 429).

>>> worker = ModelWorker("whisper-base", lambda key, audios: asr.transcribe(audios, key).transcripts, max_rows=8)
>>> future = worker.submit("greedy", audio)          # a concurrent.futures.Future of the transcript
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from mmaccel.errors import MMAccelError


class QueueFull(MMAccelError):
    """The model's queue holds `max_queue` jobs already."""


class ShuttingDown(MMAccelError):
    """The worker takes no new jobs: the server is stopping."""


@dataclass
class Job:
    key: Hashable
    payload: Any
    rows: int = 1
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    enqueued: float = field(default_factory=time.perf_counter)


@dataclass
class Call:
    """What one pipeline call decoded, for the metrics: its jobs, rows and the seconds they waited and ran."""

    model: str
    jobs: int
    rows: int
    waited_s: list[float]
    run_s: float
    result: Any = None


class ModelWorker:
    """One thread that runs `run(key, payloads)` over batches of waiting jobs, oldest first (see the module doc).
    `on_call(call)` is told of every call (the server's metrics), from the worker's thread."""

    def __init__(self, name: str, run: Callable[[Hashable, list[Any]], list[Any]], *, max_rows: int = 8,
                 max_queue: int = 64, on_call: Callable[[Call], None] | None = None):
        self.name, self.run, self.max_rows, self.max_queue = name, run, max_rows, max_queue
        self.on_call = on_call
        self._jobs: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name=f"mmaccel-serve-{name}", daemon=True)
        self._thread.start()

    @property
    def closing(self) -> bool:
        """It takes no new jobs (`close` was called)."""
        return self._closing

    @property
    def depth(self) -> int:
        """Jobs waiting (not the call in progress)."""
        return len(self._jobs)

    def submit(self, key: Hashable, payload: Any, rows: int = 1) -> concurrent.futures.Future:
        """Queue one job; its future gets the result (or the exception of its call)."""
        job = Job(key, payload, max(1, rows))
        with self._cond:
            if self._closing:
                raise ShuttingDown(f"the server is shutting down; {self.name} takes no new requests")
            if len(self._jobs) >= self.max_queue:
                raise QueueFull(f"{self.name} has {len(self._jobs)} requests waiting; try again shortly")
            self._jobs.append(job)
            self._cond.notify()
        return job.future

    def close(self, timeout: float | None = None) -> None:
        """Take no new jobs, finish the waiting ones and stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    def _next_batch(self) -> list[Job]:
        """The oldest live job and the other live jobs of its key, up to `max_rows` rows (the oldest always goes)."""
        batch: list[Job] = []
        rows = 0
        for job in list(self._jobs):
            if batch and (job.key != batch[0].key or rows + job.rows > self.max_rows):
                continue
            self._jobs.remove(job)
            if not job.future.set_running_or_notify_cancel():        # its client went away while it waited
                continue
            batch.append(job)
            rows += job.rows
        return batch

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closing:
                    self._cond.wait()
                if not self._jobs and self._closing:
                    return
                batch = self._next_batch()
            if not batch:
                continue
            start = time.perf_counter()
            try:
                results = self.run(batch[0].key, [job.payload for job in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"{self.name}: {len(results)} results for {len(batch)} requests")
            except Exception as err:               # the call's error goes to its requests; the worker goes on
                for job in batch:
                    job.future.set_exception(err)
                continue
            run_s = time.perf_counter() - start
            for job, result in zip(batch, results):
                job.future.set_result(result)
            if self.on_call is not None:
                self.on_call(Call(self.name, len(batch), sum(j.rows for j in batch),
                                  [start - j.enqueued for j in batch], run_s, results))
