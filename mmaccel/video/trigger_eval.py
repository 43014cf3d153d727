"""How well proactive requests fire: precision, recall and delay against `mmaccel.video.data` ground truth.

A "when" request (`data.ask(stream, frame, "when", subject)`) has `trigger_frame`, the first frame at or
after the request where an object of its subject comes into view (None if none does). A fire at frame F is

- a hit when trigger_frame <= F <= trigger_frame + tolerance (its delay is F - trigger_frame);
- a false fire when F < trigger_frame, or when the subject never appears (trigger_frame is None);
- late when F > trigger_frame + tolerance.

precision = hits / fires, recall = hits / events (requests whose subject appears), F1 their harmonic
mean; delays are over hits. Frames are judged on the stream as fed, so an event in the last frames of a
stream can be missed for lack of frames to see it in (choose requests early in long streams).

    python -m mmaccel.video.trigger_eval --model mmaccel/assets/video_qwen --streams 40 --frames 300 \\
        --out benchmarks/video_trigger.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from mmaccel.errors import check
from mmaccel.video.data import CLASSES, Question, Stream, ask, make_stream
from mmaccel.video.trigger import TriggerMonitor

TOLERANCE = 16          # frames after trigger_frame within which a fire counts
TEST_SEED0 = 30_000_000  # held-out test-split streams (the training script uses 10M+ and 20M+ train-split seeds)


def trigger_metrics(outcomes: Sequence[tuple[int | None, int | None]], tolerance: int = TOLERANCE) -> dict:
    """outcomes: per request (trigger_frame or None, frame it fired at or None) -> the metrics dict."""
    check(isinstance(tolerance, int) and tolerance >= 0, f"tolerance must be an int >= 0, got {tolerance!r}")
    hits, delays, early, never, late, misses, silent = 0, [], 0, 0, 0, 0, 0
    for trigger, fired in outcomes:
        if trigger is None:
            never += fired is not None
            silent += fired is None
        elif fired is None:
            misses += 1
        elif fired < trigger:
            early += 1
        elif fired > trigger + tolerance:
            late += 1
        else:
            hits += 1
            delays.append(fired - trigger)
    events = sum(t is not None for t, _ in outcomes)
    fires = sum(f is not None for _, f in outcomes)
    precision = hits / fires if fires else 0.0
    recall = hits / events if events else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"requests": len(outcomes), "events": events, "fires": fires, "hits": hits,
            "precision": precision, "recall": recall, "f1": f1,
            "mean_delay": statistics.fmean(delays) if delays else None,
            "median_delay": statistics.median(delays) if delays else None,
            "false_fires": early + never, "early_fires": early, "fires_without_event": never, "late_fires": late,
            "misses": misses, "silent_without_event": silent, "tolerance": tolerance}


def _per_stream(streams: Sequence[Stream], requests) -> list[list[Question]]:
    check(len(streams) == len(requests), f"one request list per stream: {len(streams)} streams, "
          f"{len(requests)} request lists")
    out = []
    for qs in requests:
        qs = [qs] if isinstance(qs, Question) else list(qs)
        for q in qs:
            check(isinstance(q, Question) and q.kind == "when",
                  f"requests must be 'when' Questions (mmaccel.video.data.ask), got {q!r}")
        out.append(qs)
    return out


def evaluate_triggers(pipe, streams: Sequence[Stream], requests, *, tolerance: int = TOLERANCE) -> dict:
    """Run each stream through `pipe` (a `VideoStreamPipeline` with a trigger head; reset per stream),
    registering each "when" request right after its frame, and score the fires (`trigger_metrics`).
    `requests`: per stream a `Question` or a list of them."""
    outcomes = []
    for stream, qs in zip(streams, _per_stream(streams, requests)):
        pipe.reset()
        at: dict[int, list[Question]] = {}
        for q in qs:
            at.setdefault(q.frame, []).append(q)
        asked, fired = {}, {}
        for t in range(stream.num_frames):
            for event in pipe.feed(stream.frame(t)).events:
                fired[event.request_id] = event.frame
            for q in at.get(t, []):
                asked[pipe.request(q.answer).request_id] = q
        outcomes += [(q.trigger_frame, fired.get(i)) for i, q in asked.items()]
    return trigger_metrics(outcomes, tolerance)


def replay_requests(probabilities: Tensor, frames: Sequence[int], classes: Sequence[str], threshold: float,
                    requests: Sequence[tuple[str, int]]) -> list[int | None]:
    """The frame each request fires at (None: never) for recorded per-segment probabilities [S, C] of
    segments ending at `frames` [S], through the pipeline's rule (`TriggerMonitor`): a request
    (subject, made after frame f) sees the segments ending after f. Threshold selection uses this
    instead of streaming again per threshold."""
    check(probabilities.dim() == 2 and probabilities.shape[0] == len(frames),
          f"probabilities must be [S={len(frames)}, C], got {tuple(probabilities.shape)}")
    monitor = TriggerMonitor(classes, threshold)
    order = sorted(range(len(requests)), key=lambda i: requests[i][1])
    ids, fired, k = {}, {}, 0
    for probs, frame in zip(probabilities, frames):
        while k < len(order) and requests[order[k]][1] < frame:
            subject, at = requests[order[k]]
            ids[monitor.request(subject, at).request_id] = order[k]
            k += 1
        for event in monitor.observe(probs, frame):
            fired[ids[event.request_id]] = event.frame
    return [fired.get(i) for i in range(len(requests))]


def early_requests(stream: Stream, rng: np.random.Generator, within: int = 60, subjects: int = 1) -> list[Question]:
    """`subjects` "when" requests (distinct classes, all made at one random frame of the first `within`
    frames) about classes not on screen there; fewer if fewer are off screen."""
    frame = int(rng.integers(0, min(within, stream.num_frames)))
    shown = {tr.class_name for tr in stream.on_screen(frame)}
    candidates = [c for c in CLASSES if c not in shown]
    chosen = rng.permutation(len(candidates))[:subjects]
    return [ask(stream, frame, "when", candidates[int(i)]) for i in sorted(chosen)]


def main(argv: list[str] | None = None) -> None:
    from mmaccel.video.reduce import TemporalDrop
    from mmaccel.video.stream import VideoStreamPipeline

    ap = argparse.ArgumentParser(description="Proactive trigger precision / recall / delay on test-split streams.")
    ap.add_argument("--model", default="builtin:moving-fashion", help="model directory with trigger.* (or builtin)")
    ap.add_argument("--streams", type=int, default=40)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--within", type=int, default=60, help="requests are made in the first WITHIN frames")
    ap.add_argument("--subjects", type=int, default=1, help="requests per stream (distinct classes, one frame)")
    ap.add_argument("--tolerance", type=int, default=TOLERANCE)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="write the results here as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    streams, requests = [], []
    for i in range(args.streams):
        stream = make_stream(TEST_SEED0 + args.seed * 100_000 + i, args.frames, "test")
        streams.append(stream)
        requests.append(early_requests(stream, rng, args.within, args.subjects))
    results = {"model": args.model, "streams": args.streams, "frames": args.frames, "split": "test",
               "within": args.within, "subjects": args.subjects, "seed": args.seed}
    for name, reduction in (("full", None), ("temporal_drop", TemporalDrop("pixel"))):
        pipe = VideoStreamPipeline.from_pretrained(args.model, reduction=reduction)
        check(pipe.trigger is not None, f"{args.model} has no trigger head (python -m mmaccel.video.train_trigger)")
        t0 = time.perf_counter()
        results[name] = {**evaluate_triggers(pipe, streams, requests, tolerance=args.tolerance),
                         "threshold": pipe.trigger.threshold, "seconds": time.perf_counter() - t0}
        print(name, json.dumps(results[name]))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
