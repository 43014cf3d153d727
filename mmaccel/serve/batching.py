"""Requests of many clients decoded together: one worker thread owns each served model.

A request becomes a `Job`: its key (requests with equal keys can share one pipeline call: same method,
parameters and options), its payload (an audio, a class label, a prompt) and its size in rows. The worker
takes the oldest waiting job and every other waiting job with its key, up to `max_rows` rows, and runs them as
one call of the model's pipeline (`run(key, payloads) -> results`, one per payload); a request that arrives
while a call decodes waits for the next call. Where `joins(key)` says the pipeline can, a call instead takes
waiting jobs of its key as its rows end (continuous batching: `run_joining(key, Joining)`, which hands each job
its result as soon as its rows are done). A job whose client went away before its call started is dropped; the
queue is bounded (`QueueFull`, which the server answers with 429). A joining call lets a job whose client went
away go at its next step (`Joining.release`).

>>> worker = ModelWorker("whisper-base", lambda key, audios: asr.transcribe(audios, key).transcripts, max_rows=8)
>>> future = worker.submit("greedy", audio)          # a concurrent.futures.Future of the transcript
"""

from __future__ import annotations

import abc
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


class ClientGone(MMAccelError):
    """The client closed the connection before its request was answered (a joining call lets its job go)."""


@dataclass(eq=False)             # a job is itself: equal only to itself (its payload may be an array)
class Job:
    """One request in a model's queue or call: its key (jobs with equal keys may share a call), its payload, the
    rows it takes, the future its result goes to, when it was queued (`time.perf_counter`) and whether its client
    went away."""

    key: Hashable
    payload: Any
    rows: int = 1
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    enqueued: float = field(default_factory=time.perf_counter)
    gone: bool = False              # its client went away while its call decodes (a joining call frees its rows)


@dataclass
class Call:
    """What one pipeline call decoded, for the metrics: its jobs, rows and the seconds they waited and ran."""

    model: str
    jobs: int
    rows: int
    waited_s: list[float]
    run_s: float
    result: Any = None


class Joining:
    """What a call that takes requests while it decodes is handed: its open jobs (`jobs`: the first ones taken
    with it, then those `take` takes; a job leaves when `finish` answers it), and `busy`: the queue was not empty
    when the model's previous call ended (a call may then open rows for requests to come). A call that runs on
    under load reports to `on_call` every `max_rows` requests it answers (a `Call` of those), so that it holds
    no answered request."""

    def __init__(self, worker: ModelWorker, key: Hashable, jobs: list[Job], busy: bool):
        self.worker, self.key, self.jobs, self.busy = worker, key, list(jobs), busy
        self.started = {id(job): time.perf_counter() for job in jobs}     # open job -> when its call took it
        self.answered: list[tuple[Job, float, Any]] = []                   # since the last report
        self.since = time.perf_counter()

    def take(self, fits: Callable[[Any], bool], most_waiting: int | None = None) -> Job | None:
        """The oldest waiting job of the call's key whose payload `fits`, taken out of the queue; None when the
        oldest waiting job is of another key (it goes first: the call takes no more), does not fit, or more than
        `most_waiting` jobs wait (a narrow call leaves a crowd to a wider call of its own)."""
        job = self.worker._take(self.key, fits, most_waiting)
        if job is not None:
            self.jobs.append(job)
            self.started[id(job)] = time.perf_counter()
        return job

    def release(self, job: Job) -> None:
        """`job`'s client went away and its rows are freed: the call holds it no more (its future ends with
        `ClientGone`, which no one reads)."""
        if job in self.jobs:
            self.jobs.remove(job)
            del self.started[id(job)]
            job.future.set_exception(ClientGone(f"{self.worker.name}: the client went away"))

    def finish(self, job: Job, result: Any) -> None:
        """Answer `job` with `result`: it leaves the open jobs, and every `max_rows` answers are reported (`report`)."""
        self.jobs.remove(job)
        self.answered.append((job, self.started.pop(id(job)), result))
        job.future.set_result(result)
        if len(self.answered) >= self.worker.max_rows:
            self.report()

    def report(self) -> None:
        """The requests answered since the last report, as one `Call`, to the worker's `on_call`."""
        if self.answered and self.worker.on_call is not None:
            now = time.perf_counter()
            self.worker.on_call(Call(self.worker.name, len(self.answered), sum(j.rows for j, _, _ in self.answered),
                                     [started - j.enqueued for j, started, _ in self.answered], now - self.since,
                                     [result for _, _, result in self.answered]))
        self.answered, self.since = [], time.perf_counter()


def call_rows(first: int, max_rows: int, busy: bool) -> int:
    """The rows of a joining call that starts with `first` rows: as many again for requests to come (up to
    `max_rows`) when requests were queueing, none on an idle server (on a CPU each step computes every row, an
    empty one too)."""
    return min(max_rows, 2 * first) if busy else first


def most_waiting(rows: int, max_rows: int) -> int | None:
    """The most waiting jobs at which a call of `rows` rows still takes one (`Joining.take`): a call narrower than
    `max_rows` leaves a crowd larger than itself to a wider call of its own, which it makes way for by ending once
    its rows are done; a call of `max_rows` rows takes jobs whatever the queue."""
    return rows if rows < max_rows else None


class JoinedRows(abc.ABC):
    """The rows of a joining call whose jobs take a row per unit (a completion choice, an image): which job and unit
    each row serves, the units of a taken job not placed yet, and the `next` and `dropped` halves of the decode
    loop's `RowFeed`. Its first rows are its jobs' units, then spare rows (`call_rows`); a subclass says how many
    units a job has (`units`), whether a waiting job fits (`fits`), what a placed unit starts its row with
    (`joiner`), and notes each job it takes (`opened`)."""

    def __init__(self, joining: Joining, max_rows: int):
        self.joining, self.max_rows = joining, max_rows
        self.first = [(job, i) for job in joining.jobs for i in range(self.units(job))]
        self.width = call_rows(len(self.first), max_rows, joining.busy)
        self.table: dict[int, tuple[Job, int]] = dict(enumerate(self.first))     # row -> (job, unit)
        self.waiting: list[tuple[Job, int]] = []            # units of a taken job not placed yet
        for job in joining.jobs:
            self.opened(job)

    @abc.abstractmethod
    def units(self, job: Job) -> int:
        """The rows `job` takes."""

    def fits(self, payload: Any, max_prompt: int) -> bool:
        """Whether a waiting job's `payload` may take a row whose prompt is at most `max_prompt` tokens (here: any)."""
        return True

    @abc.abstractmethod
    def opened(self, job: Job) -> None:
        """`job` is taken into the call (its rows are placed as rows end)."""

    @abc.abstractmethod
    def closed(self, job: Job) -> None:
        """`job`'s client went away before its rows were done: forget what was kept for it."""

    @abc.abstractmethod
    def joiner(self, job: Job, unit: int) -> Any:
        """What row `unit` of `job` starts with (a `Joiner`, or a prompt and its most new tokens)."""

    def next(self, row: int, max_prompt: int) -> Any:
        """`RowFeed.next`: what row `row` starts on (`joiner`): a taken job's unit, else a new job's; None for none."""
        if not self.waiting:
            job = self.joining.take(lambda payload: self.fits(payload, max_prompt),
                                    most_waiting(self.width, self.max_rows))
            if job is None:
                return None
            self.opened(job)
            self.waiting = [(job, i) for i in range(self.units(job))]
        job, i = self.table[row] = self.waiting.pop(0)
        return self.joiner(job, i)

    def dropped(self) -> list[int]:
        """`RowFeed.dropped`: the rows of jobs whose clients went away, which the call releases (`Joining.release`)."""
        rows = [row for row, (job, _) in self.table.items() if job.gone]
        gone = {id(job): job for job, _ in [*(self.table.pop(row) for row in rows), *self.waiting] if job.gone}
        self.waiting = [(job, i) for job, i in self.waiting if not job.gone]
        for job in gone.values():
            self.closed(job)
            self.joining.release(job)
        return rows


class ModelWorker:
    """One thread that runs `run(key, payloads)` over batches of waiting jobs, oldest first (see the module doc).
    `on_call(call)` is told of every call (the server's metrics), from the worker's thread."""

    def __init__(self, name: str, run: Callable[[Hashable, list[Any]], list[Any]], *, max_rows: int = 8,
                 max_queue: int = 64, on_call: Callable[[Call], None] | None = None,
                 joins: Callable[[Hashable], bool] | None = None,
                 run_joining: Callable[[Hashable, Joining], None] | None = None):
        self.name, self.run, self.max_rows, self.max_queue = name, run, max_rows, max_queue
        self.on_call, self.joins, self.run_joining = on_call, joins, run_joining
        self._busy = False                  # jobs waited when the last call ended
        self._joining: Joining | None = None    # the call in progress, where it takes joining jobs
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

    def abandon(self, future: concurrent.futures.Future) -> None:
        """The client of `future`'s job went away: a waiting job leaves the queue, one in a joining call frees its
        rows at the call's next step (a call of its own decodes on)."""
        if future.cancel():
            return
        joining = self._joining
        for job in [] if joining is None else list(joining.jobs):
            if job.future is future:
                job.gone = True

    def close(self, timeout: float | None = None) -> None:
        """Take no new jobs, finish the waiting ones and stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    def _take(self, key: Hashable, fits: Callable[[Any], bool], most_waiting: int | None) -> Job | None:
        with self._cond:
            if most_waiting is not None and len(self._jobs) > most_waiting:
                return None
            while self._jobs and self._jobs[0].key == key and not self._closing:
                job = self._jobs[0]
                if not fits(job.payload):
                    return None
                self._jobs.popleft()
                if job.future.set_running_or_notify_cancel():      # else its client went away while it waited
                    return job
            return None

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
                if self.joins is not None and self.run_joining is not None and self.joins(batch[0].key):
                    self._call_joining(batch)
                    continue
                results = self.run(batch[0].key, [job.payload for job in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"{self.name}: {len(results)} results for {len(batch)} requests")
            except Exception as err:               # the call's error goes to its requests; the worker goes on
                for job in batch:
                    job.future.set_exception(err)
                continue
            run_s = time.perf_counter() - start
            with self._cond:
                self._busy = bool(self._jobs)
            for job, result in zip(batch, results):
                job.future.set_result(result)
            if self.on_call is not None:
                self.on_call(Call(self.name, len(batch), sum(j.rows for j in batch),
                                  [start - j.enqueued for j in batch], run_s, results))

    def _call_joining(self, batch: list[Job]) -> None:
        """One call that takes waiting jobs of its key as its rows end; a job it did not answer gets its error."""
        joining = self._joining = Joining(self, batch[0].key, batch, self._busy)
        try:
            self.run_joining(batch[0].key, joining)
            error: Exception | None = None
        except Exception as err:                   # the call's error goes to its open requests; the worker goes on
            error = err
        self._joining = None
        for job in joining.jobs:
            if not job.future.done():
                job.future.set_exception(error or RuntimeError(f"{self.name}: the call ended without this request's result"))
        with self._cond:
            self._busy = bool(self._jobs)
        joining.report()
