"""The model worker: requests with equal keys share a call (oldest first, up to max_rows rows), others wait for a
later one; a request whose client left before its call is dropped; a full queue refuses; a failed call fails its
own requests only; closing finishes what waits and takes nothing new. The worker's first call is held on an
event until the test has queued what it needs, so every batch below is decided, not raced."""

import threading

import pytest

from mmaccel.serve.batching import ClientGone, Job, JoinedRows, Joining, ModelWorker, QueueFull, ShuttingDown

WAIT_S = 30


class Recorder:
    """A pipeline stand-in: records each call's (key, payloads); the first call waits for `release`."""

    def __init__(self, fail_key=None):
        self.calls, self.release, self.started = [], threading.Event(), threading.Event()
        self.fail_key = fail_key

    def __call__(self, key, payloads):
        self.calls.append((key, list(payloads)))
        if len(self.calls) == 1:
            self.started.set()
            assert self.release.wait(WAIT_S)
        if key == self.fail_key:
            raise ValueError(f"bad batch {payloads}")
        return [f"{key}:{p}" for p in payloads]


def _held(recorder, **kw):
    worker = ModelWorker("m", recorder, **kw)
    first = worker.submit("a", 0)
    assert recorder.started.wait(WAIT_S)            # the first call runs (and waits); what follows queues
    return worker, first


def test_jobs_of_one_key_share_the_next_call_up_to_max_rows():
    rec = Recorder()
    worker, first = _held(rec, max_rows=4)
    futures = [worker.submit(key, i, rows) for i, (key, rows) in
               enumerate([("a", 1), ("b", 1), ("a", 2), ("a", 2), ("a", 1)], start=1)]
    assert worker.depth == 5
    rec.release.set()
    assert [f.result(WAIT_S) for f in [first, *futures]] == ["a:0", "a:1", "b:2", "a:3", "a:4", "a:5"]
    worker.close(WAIT_S)
    # after the held call: the oldest (a:1) with the a-jobs that fit 4 rows (1 + 2, then 2 would make 5: skipped,
    # 1 more fits), then b:2 (now the oldest), then a:4
    assert rec.calls == [("a", [0]), ("a", [1, 3, 5]), ("b", [2]), ("a", [4])]


def test_a_job_whose_client_left_is_dropped_and_a_full_queue_refuses():
    rec = Recorder()
    worker, first = _held(rec, max_queue=2)
    gone, kept = worker.submit("a", 1), worker.submit("a", 2)
    with pytest.raises(QueueFull, match="2 requests waiting"):
        worker.submit("a", 3)
    assert gone.cancel()
    rec.release.set()
    assert kept.result(WAIT_S) == "a:2" and first.result(WAIT_S) == "a:0"
    worker.close(WAIT_S)
    assert rec.calls == [("a", [0]), ("a", [2])]


def test_a_failed_call_fails_its_own_jobs_and_the_worker_goes_on():
    rec = Recorder(fail_key="b")
    worker, first = _held(rec)
    bad, good = worker.submit("b", 1), worker.submit("a", 2)
    rec.release.set()
    with pytest.raises(ValueError, match="bad batch"):
        bad.result(WAIT_S)
    assert good.result(WAIT_S) == "a:2" and first.result(WAIT_S) == "a:0"
    worker.close(WAIT_S)


def test_closing_finishes_what_waits_and_takes_nothing_new():
    rec = Recorder()
    worker, first = _held(rec)
    waiting = worker.submit("a", 1)
    closer = threading.Thread(target=worker.close, args=(WAIT_S,))
    closer.start()
    while not worker.closing:                       # close() has taken the lock and set the flag
        closer.join(0.01)
    with pytest.raises(ShuttingDown):
        worker.submit("a", 2)
    rec.release.set()
    closer.join(WAIT_S)
    assert not closer.is_alive() and waiting.result(0) == "a:1" and first.result(0) == "a:0"


class Joiner:
    """A stand-in joining call for key "j": answers its first jobs, then (after `go`) takes waiting jobs one by
    one, answering each before taking the next; records each call's jobs and whether it was opened busy."""

    def __init__(self, most_waiting=None):
        self.calls, self.go, self.taking = [], threading.Event(), threading.Event()
        self.most_waiting, self.answered_early = most_waiting, []

    def __call__(self, key, joining):
        jobs = list(joining.jobs)
        self.calls.append(([j.payload for j in jobs], joining.busy))
        for job in jobs:
            joining.finish(job, f"{key}:{job.payload}")
        self.taking.set()
        assert self.go.wait(WAIT_S)
        while (job := joining.take(lambda payload: payload != "too big", self.most_waiting)) is not None:
            if job.gone:
                continue
            joining.finish(job, f"{key}:{job.payload}")
            self.answered_early.append(job.future.done())
            self.calls[-1][0].append(job.payload)


def _joining(joiner, **kw):
    rec = Recorder()
    rec.release.set()                                           # calls of other keys run through
    worker = ModelWorker("m", rec, joins=lambda key: key == "j", run_joining=joiner, **kw)
    return worker, rec


def test_a_joining_call_takes_waiting_jobs_of_its_key_and_answers_each_at_once():
    joiner = Joiner()
    worker, rec = _joining(joiner)
    first = worker.submit("j", 0)
    assert joiner.taking.wait(WAIT_S) and first.result(WAIT_S) == "j:0"     # answered while its call goes on
    later = [worker.submit("j", 1), worker.submit("j", 2), worker.submit("j", "too big"), worker.submit("j", 3)]
    joiner.go.set()
    assert [f.result(WAIT_S) for f in later] == ["j:1", "j:2", "j:too big", "j:3"]
    worker.close(WAIT_S)
    # the call took 1 and 2 as they came; "too big" did not fit it and went to a call of its own, with 3 behind it
    assert joiner.calls[0] == ([0, 1, 2], False) and joiner.calls[1] == (["too big", 3], True)
    assert all(joiner.answered_early) and rec.calls == []


def test_a_joining_call_leaves_older_jobs_of_other_keys_and_crowds_to_wider_calls():
    joiner = Joiner(most_waiting=1)
    worker, rec = _joining(joiner)
    worker.submit("j", 0)
    assert joiner.taking.wait(WAIT_S)
    jobs = [worker.submit("x", 1), worker.submit("j", 2), worker.submit("j", 3)]
    joiner.go.set()
    assert [f.result(WAIT_S) for f in jobs] == ["x:1", "j:2", "j:3"]
    worker.close(WAIT_S)
    # x waited longest: the first call took no more; then three waited, more than the narrow call takes: the
    # two j jobs got a call of their own, opened busy
    assert joiner.calls == [([0], False), ([2, 3], True)] and rec.calls == [("x", [1])]


def test_abandoning_a_job_in_a_joining_call_marks_it_gone_and_an_answered_job_leaves_the_call():
    started, go, seen = threading.Event(), threading.Event(), {}

    def run_joining(key, joining):
        job = joining.jobs[0]
        started.set()
        assert go.wait(WAIT_S)
        seen["gone"] = job.gone
        joining.finish(job, "done")
        seen["open"] = list(joining.jobs)               # the call holds no answered job

    worker = ModelWorker("m", Recorder(), joins=lambda key: key == "j", run_joining=run_joining)
    running = worker.submit("j", 0)
    assert started.wait(WAIT_S)
    waiting = worker.submit("x", 1)
    worker.abandon(waiting)                             # still queued: it just leaves
    assert waiting.cancelled()
    worker.abandon(running)                             # in the call: marked, its rows to be freed
    go.set()
    worker.close(WAIT_S)
    assert seen == {"gone": True, "open": []} and running.result(WAIT_S) == "done"

class Rows(JoinedRows):
    """A joined call whose jobs take `payload` rows each; records the jobs it forgot."""

    def __init__(self, joining):
        self.forgot = []
        super().__init__(joining, max_rows=4)

    def units(self, job):
        return job.payload

    def opened(self, job):
        pass

    def closed(self, job):
        self.forgot.append(job.payload)

    def joiner(self, job, unit):
        return job.payload, unit


def test_a_job_whose_client_went_away_leaves_its_call_at_the_next_step():
    worker = ModelWorker("m", Recorder())
    first, two, three = Job("j", 1), Job("j", 2), Job("j", 3)
    joining = Joining(worker, "j", [first, two], busy=False)
    rows = Rows(joining)
    rows.waiting = [(three, 0), (three, 1)]           # taken, its rows not placed yet
    joining.jobs.append(three)
    joining.started[id(three)] = 0.0
    assert rows.dropped() == [] and len(joining.jobs) == 3
    two.gone = three.gone = True
    assert rows.dropped() == [1, 2]                     # two's rows end now; three is never placed
    assert joining.jobs == [first] and list(joining.started) == [id(first)] and rows.waiting == []
    assert rows.forgot == [2, 3] and list(rows.table) == [0]
    for job in (two, three):
        with pytest.raises(ClientGone):
            job.future.result(0)
    assert rows.dropped() == []
    worker.close(WAIT_S)


def test_a_joining_call_reports_every_max_rows_requests_it_answers():
    go, calls = threading.Event(), []

    def run_joining(key, joining):
        assert go.wait(WAIT_S)
        for job in list(joining.jobs):
            joining.finish(job, job.payload)
        while (job := joining.take(lambda payload: True)) is not None:
            joining.finish(job, job.payload)

    worker = ModelWorker("m", Recorder(), max_rows=2, joins=lambda key: True, run_joining=run_joining,
                         on_call=calls.append)
    futures = [worker.submit("j", i) for i in range(5)]
    go.set()
    assert [f.result(WAIT_S) for f in futures] == [0, 1, 2, 3, 4]
    worker.close(WAIT_S)
    assert [c.result for c in calls] == [[0, 1], [2, 3], [4]] and [c.jobs for c in calls] == [2, 2, 1]
