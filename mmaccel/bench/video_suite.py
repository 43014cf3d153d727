"""`mmaccel bench video`: the streaming video model on long held-out streams.

Three studies in one run, on the moving Fashion-MNIST task (`mmaccel.video.data`; evaluation streams
use the held-out test split, settings are tuned on a development set of train-split streams with
seeds training never draws):

1. Answer decoding (the harness's rows): every method answers the same questions on the same streams,
   each in its own pipeline fed the same frames; greedy, so lossless methods must give the AR answers
   token for token. Quality is exact-match accuracy against the ground truth. The self-draft rows (the
   model's own first layers draft, `StreamDecoder.early_exit`) use the chain setting that decoded the
   dev streams fastest; the Markdown adds the decode time without the question prefill, per method.
2. Ingest (`doc["ingest"]`): vision token reduction settings against the full stream, at ingest
   (`mmaccel.video.reduce`) and at each question in the cache (`mmaccel.video.kv_reduce`): vision tokens
   and KV entries per frame, ingest latency, answer accuracy. The feature-cosine threshold of TemporalDrop is
   picked on the development streams (the fewest tokens within 1 point of the full stream's accuracy);
   the pixel threshold is the default.
3. Long streams (`doc["long_stream"]`): one stream and one 10x longer stream through the bounded cache:
   KV entries and ingest latency per frame over time (plotted), the cache's fixed size, the process's
   resident memory at the start and the end, the latency of the last tenth against the first, and the
   accuracy of questions about the present in the last tenth.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from mmaccel.bench.harness import MethodSpec, Suite
from mmaccel.bench.video_report import (  # noqa: F401  (answer_decoding_table, extra_markdown: re-exported, they lived here)
    answer_decoding_table,
    append_markdown,
    decode_seconds,
    extra_markdown,
    plot_long_stream,
)
from mmaccel.video.data import make_stream, questions
from mmaccel.video.kv_reduce import QuestionPrune, RoundDecay
from mmaccel.video.methods import build_video_method
from mmaccel.video.reduce import SpatialMerge, TemporalDrop
from mmaccel.video.train import TRAIN_KINDS

# Pipeline parameters in a method's params (the rest go to the core method): `draft_keep`, the share of
# vision tokens the draft sees (SpecVLM; the draft is the target itself unless `draft_exit` names its
# early-exit layer count). These settings are fixed; the self-drafts' chains are picked on the dev streams.
PIPELINE_PARAMS = ("draft_keep", "draft_exit")
DEFAULT_METHODS = [
    MethodSpec("ar"),
    MethodSpec("speculative", {"k": 2, "draft_keep": 0.1}, label="specvlm-10%"),
    MethodSpec("speculative", {"k": 2, "draft_keep": 0.0}, label="specvlm-text"),
    MethodSpec("ngram", {"k": 2, "max_ngram": 2}),
]
SELF_DRAFT_EXITS = (1, 2)                        # early-exit drafts (layers) of the self-draft rows
SELF_DRAFT_GRID = tuple({"k": k, "stop_below": stop} for k in (2, 3, 4) for stop in (0.0, 0.5))
LOCAL_KINDS = ("now", "direction", "describe")   # answerable from the recent frames a bounded cache keeps
LATE_QUESTIONS = 20                              # about this many in the last tenth of a long stream
MAX_ANSWER = 12                                  # tokens an answer may take (the longest "describe" answer: 9)
DEV_SEED, TEST_SEED = 2_000_000_000, 0           # dev: train-split seeds beyond any training draw
FEATURE_THRESHOLDS = (0.05, 0.1, 0.2)      # TemporalDrop("feature") thresholds tried on the dev streams
MAX_LOSS = 0.01                                  # accuracy a setting may lose against the full stream


def _settings(feature_threshold: float) -> dict:
    """Reduction settings: name -> (ingest reducers, question-time KV reducers) factories (fresh per stream)."""
    none = lambda: None                                                     # noqa: E731
    return {
        "full": (none, none),
        "dtd-pixel": (lambda: [TemporalDrop("pixel")], none),
        "dtd-feature": (lambda: [TemporalDrop("feature", threshold=feature_threshold)], none),
        "dtd-pixel+merge": (lambda: [TemporalDrop("pixel"), SpatialMerge(0.9)], none),
        "dtd-pixel-keep25%": (lambda: [TemporalDrop("pixel", keep_ratio=0.25)], none),
        "question-prune-25%": (none, lambda: [QuestionPrune(0.25)]),
        "round-decay-50%": (none, lambda: [RoundDecay(0.5)]),
        "dtd-pixel+round-decay": (lambda: [TemporalDrop("pixel")], lambda: [RoundDecay(0.5)]),
        "dtd-pixel+merge+round-decay": (lambda: [TemporalDrop("pixel"), SpatialMerge(0.9)], lambda: [RoundDecay(0.5)]),
    }


def method_params(spec: MethodSpec) -> dict:
    """The core method's own parameters of `spec` (without the pipeline's)."""
    return {k: v for k, v in spec.params.items() if k not in PIPELINE_PARAMS}


def _rss_mb() -> float | None:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return round(pages * 4096 / 2**20, 1)


def play(pipe, stream, qs, method: str = "ar", params: dict | None = None, log_frames: list | None = None):
    """Feed `stream` through `pipe`, asking `qs` at their frames; returns [(answer, question)]; the
    per-frame reports go into `log_frames` when it is a list."""
    at = {}
    for q in qs:
        at.setdefault(q.frame, []).append(q)
    answers = []
    last = max((q.frame for q in qs), default=stream.num_frames - 1) if log_frames is None else stream.num_frames - 1
    for t in range(last + 1):
        report = pipe.feed(stream.frame(t))
        if log_frames is not None:
            log_frames.append(report)
        for q in at.get(t, []):
            answers.append((pipe.ask(q.text, method, max_new_tokens=MAX_ANSWER, **(params or {})), q))
    return answers


def build_video_suite(quick: bool = False, methods: list[MethodSpec] | None = None, model: str | None = None,
                      device: str | None = None) -> Suite:
    from mmaccel.video.stream import VideoStreamPipeline

    name = model or "builtin:moving-fashion"
    base = VideoStreamPipeline.from_pretrained(name, device=device)
    target, tokenizer, budget = base.model, base.tokenizer, base.budget
    if quick:
        n_test, n_dev, frames, per_stream, long_frames = 2, 1, 48, 3, 40
    else:
        n_test, n_dev, frames, per_stream, long_frames = 16, 4, 300, 24, 500
    streams = [make_stream(TEST_SEED + i, frames, "test") for i in range(n_test)]
    asked = [questions(s, TEST_SEED + i, per_stream, kinds=TRAIN_KINDS) for i, s in enumerate(streams)]
    dev = [make_stream(DEV_SEED + i, frames, "train") for i in range(n_dev)]
    dev_asked = [questions(s, DEV_SEED + i, per_stream, kinds=TRAIN_KINDS) for i, s in enumerate(dev)]
    for spec in methods or []:
        build_video_method(spec.name, **method_params(spec))

    def pipeline(spec: MethodSpec, reduction=None):
        keep, exit_layer = spec.params.get("draft_keep"), spec.params.get("draft_exit")
        draft = None if keep is None else target if exit_layer is None else target.early_exit(exit_layer)
        return VideoStreamPipeline(target, tokenizer, budget=budget, reduction=reduction, draft=draft,
                                   draft_keep=0.1 if keep is None else keep, max_answer_tokens=MAX_ANSWER)

    picked = None
    if methods is None:
        exits = [e for e in SELF_DRAFT_EXITS if e < target.num_layers]
        picked = pick_self_drafts(pipeline, dev, dev_asked, exits, SELF_DRAFT_GRID[:2] if quick else SELF_DRAFT_GRID)
        methods = [*DEFAULT_METHODS[:-1], *(MethodSpec("speculative", {**p["params"], "draft_keep": 1.0,
                                                                       "draft_exit": e}, label=f"self-draft-{e}L")
                                            for e, p in picked.items()), DEFAULT_METHODS[-1]]

    def run_batch(spec: MethodSpec, inputs, seed: int):
        stream, qs = inputs
        frames: list = []
        answers = play(pipeline(spec), stream, qs, spec.name, method_params(spec), log_frames=frames)
        stats = answers[0][0].stats
        for a, _ in answers[1:]:
            stats = stats + a.stats
        stats.time_s["stream_ingest"] = sum(r.ingest_s for r in frames)    # not in the answer latency
        return [(a.tokens, a.text == q.answer, q.kind) for a, q in answers], stats

    def quality(spec, outputs, baseline) -> dict:
        same = sum(a[0] == b[0] for a, b in zip(outputs, baseline))
        return {"identical_to_ar": round(same / len(baseline), 4),
                "accuracy": round(sum(o[1] for o in outputs) / len(outputs), 4), "questions": len(outputs)}

    def finish(doc: dict) -> None:
        doc["ingest"] = ingest_study(target, tokenizer, budget, streams, asked, dev, dev_asked)
        doc["long_stream"] = long_study(target, tokenizer, budget, long_frames)
        if base.trigger is not None:
            doc["triggers"] = trigger_study(target, tokenizer, budget, base.trigger, n_test, frames)

    config = {"model": name, "task": "moving Fashion-MNIST streams (mmaccel.video.data), test split held out",
              "test_streams": n_test, "frames_per_stream": frames, "questions_per_stream": per_stream,
              "question_kinds": list(TRAIN_KINDS), "dev_streams": n_dev, "dev_split": f"train, seeds from {DEV_SEED}",
              "budget": vars(budget), "sampling": "greedy", "quick": quick, "threads": torch.get_num_threads(),
              **({"self_draft_dev": picked} if picked is not None else {})}
    return Suite("video", config, methods, {1: list(zip(streams, asked))}, run_batch, quality,
                 claims_lossless=lambda spec: build_video_method(spec.name, **method_params(spec)).lossless,
                 primary_quality="accuracy",
                 warmup=lambda spec: play(pipeline(spec), streams[0], asked[0][:1], spec.name, method_params(spec)),
                 artifacts=lambda out: [append_markdown(out), *plot_long_stream(out)], finish=finish)


def _run_setting(target, tokenizer, budget, reducers, streams, asked, kv_reducers=lambda: None) -> dict:
    from mmaccel.video.stream import VideoStreamPipeline

    kept = encoded = entries = frames = 0
    ingest, correct, total, by_kind, hits = [], 0, 0, {}, []
    for stream, qs in zip(streams, asked):
        pipe = VideoStreamPipeline(target, tokenizer, budget=budget, reduction=reducers(), kv_reduction=kv_reducers())
        reports = []
        answers = play(pipe, stream, qs, log_frames=reports)
        for r in reports:
            kept, encoded, entries = kept + r.vision_tokens, encoded + r.tokens_in, entries + r.kv_entries
            ingest.append(r.ingest_s)
        frames += len(reports)
        for a, q in answers:
            ok = a.text == q.answer
            correct, total = correct + ok, total + 1
            hits.append(ok)
            k = by_kind.setdefault(q.kind, [0, 0])
            k[0], k[1] = k[0] + ok, k[1] + 1
    acc = correct / max(1, total)
    return {"vision_tokens_per_frame": round(kept / frames, 3), "encoded_tokens_per_frame": round(encoded / frames, 3),
            "keep_ratio": round(kept / max(1, encoded), 4), "kv_entries_mean": round(entries / frames, 1),
            "ingest_ms_mean": round(1e3 * statistics.fmean(ingest), 3),
            "ingest_ms_p95": round(1e3 * float(np.percentile(ingest, 95)), 3),
            "accuracy": round(acc, 4), "accuracy_ci95": round(1.96 * math.sqrt(acc * (1 - acc) / max(1, total)), 4),
            "questions": total, "accuracy_by_kind": {k: round(v[0] / v[1], 4) for k, v in sorted(by_kind.items())},
            "hits": hits}


def paired_ci95(hits: list[bool], base: list[bool]) -> float:
    """Half-width of the normal 95% interval of the accuracy change on the same questions (paired: a
    setting that answers like the full stream has a narrow interval however few questions there are)."""
    diff = np.asarray(hits, float) - np.asarray(base, float)
    return 1.96 * float(diff.std(ddof=1)) / math.sqrt(len(diff)) if len(diff) > 1 else float("nan")


def pick_self_drafts(pipeline, dev, dev_asked, exits, grid) -> dict:
    """Per early exit: the chain setting of `grid` whose answers decode fastest on the dev streams (decode
    seconds summed; greedy, so every setting gives the same answers) -> {exit: {params, decode_s}}."""
    picked = {}
    for exit_layer in exits:
        seconds = {}
        for params in grid:
            spec = MethodSpec("speculative", {**params, "draft_keep": 1.0, "draft_exit": exit_layer})
            total = 0.0
            for stream, qs in zip(dev, dev_asked):
                for answer, _ in play(pipeline(spec), stream, qs, spec.name, params):
                    total += decode_seconds(answer.stats.time_s)
            seconds[", ".join(f"{k}={v}" for k, v in params.items())] = round(total, 4)
        best = min(seconds, key=seconds.get)
        picked[exit_layer] = {"params": grid[list(seconds).index(best)], "decode_s": seconds}
    return picked


def constant_answers(dev_asked, asked) -> dict:
    """The chance reference: per kind the answer most common on the dev questions, given to every test
    question of that kind -> its accuracy overall and per kind."""
    from collections import Counter

    common = {}
    for q in (q for qs in dev_asked for q in qs):
        common.setdefault(q.kind, Counter())[q.answer] += 1
    hits = {}
    for q in (q for qs in asked for q in qs):
        guess = common[q.kind].most_common(1)[0][0] if q.kind in common else None
        hits.setdefault(q.kind, []).append(guess == q.answer)
    every = [h for kind in hits.values() for h in kind]
    return {"accuracy": round(sum(every) / max(1, len(every)), 4),
            "by_kind": {k: round(sum(v) / len(v), 4) for k, v in sorted(hits.items())},
            "answers": {k: c.most_common(1)[0][0] for k, c in sorted(common.items())}}


def ingest_study(target, tokenizer, budget, streams, asked, dev, dev_q) -> dict:
    full = _run_setting(target, tokenizer, budget, lambda: None, dev, dev_q)
    tried, chosen = {}, FEATURE_THRESHOLDS[0]
    for threshold in FEATURE_THRESHOLDS:
        row = _run_setting(target, tokenizer, budget, lambda threshold=threshold: [TemporalDrop("feature", threshold=threshold)],
                           dev, dev_q)
        tried[str(threshold)] = {k: row[k] for k in ("keep_ratio", "accuracy")}
        if row["accuracy"] >= full["accuracy"] - MAX_LOSS:
            chosen = threshold                          # thresholds rise: the last within the loss drops the most
    rows = {name: _run_setting(target, tokenizer, budget, make, streams, asked, make_kv)
            for name, (make, make_kv) in _settings(chosen).items()}
    base = rows["full"]
    for row in rows.values():
        row["token_reduction"] = round(base["vision_tokens_per_frame"] / max(1e-9, row["vision_tokens_per_frame"]), 3)
        row["kv_reduction"] = round(base["kv_entries_mean"] / max(1e-9, row["kv_entries_mean"]), 3)
        row["accuracy_change"] = round(row["accuracy"] - base["accuracy"], 4)
        row["accuracy_change_ci95"] = round(paired_ci95(row["hits"], base["hits"]), 4)
    for row in rows.values():
        row.pop("hits")
    return {"dev": {"full_accuracy": full["accuracy"], "feature_thresholds": tried, "chosen_feature_threshold": chosen},
            "settings": rows, "constant_answers": constant_answers(dev_q, asked)}


def trigger_study(target, tokenizer, budget, head, n: int, frames: int) -> dict:
    """Proactive requests on held-out streams: one "when" request early in each stream, with and without
    TemporalDrop; precision, recall and delay against the frames the subject comes into view."""
    from mmaccel.video.stream import VideoStreamPipeline
    from mmaccel.video.trigger_eval import TEST_SEED0, early_requests, evaluate_triggers

    streams = [make_stream(TEST_SEED0 + i, frames, "test") for i in range(n)]
    requests = [early_requests(s, np.random.default_rng(TEST_SEED0 + i)) for i, s in enumerate(streams)]
    out = {}
    for name, reducers in (("full", lambda: None), ("dtd-pixel", lambda: [TemporalDrop("pixel")])):
        pipe = VideoStreamPipeline(target, tokenizer, budget=budget, reduction=reducers(), trigger=head)
        out[name] = evaluate_triggers(pipe, streams, requests)
    return out


def long_study(target, tokenizer, budget, frames: int) -> dict:
    """A stream of `frames` and one of 10x as many through the same bounded cache, with questions about
    the present (LOCAL_KINDS) in their last tenth: does eviction keep the model answering?"""
    from mmaccel.video.stream import VideoStreamPipeline

    out = {}
    for name, reducers in (("full", None), ("dtd-pixel", lambda: [TemporalDrop("pixel")])):
        for n in (frames, 10 * frames):
            pipe = VideoStreamPipeline(target, tokenizer, budget=budget, reduction=reducers and reducers())
            stream = make_stream(TEST_SEED + 7, n, "test")
            tenth = max(1, n // 10)
            late = [q for q in questions(stream, TEST_SEED + 7, LATE_QUESTIONS * 10, kinds=LOCAL_KINDS)
                    if q.frame >= n - tenth]
            rss0, t0, reports = _rss_mb(), time.perf_counter(), []
            answers = play(pipe, stream, late, log_frames=reports)
            every, window = max(1, n // 500), max(4, n // 500)
            cache = pipe.state.cache
            out[f"{name}/{n}"] = {
                "frames": n, "wall_s": round(time.perf_counter() - t0, 2),
                "kv_entries_max": max(r.kv_entries for r in reports), "cache_capacity": cache.capacity,
                "cache_mb": round(sum(k.numel() * k.element_size() * 2 for k in cache.k) / 2**20, 3),
                "rss_mb_start": rss0, "rss_mb_end": _rss_mb(),
                "late_questions": len(answers),
                "late_accuracy": round(sum(a.text == q.answer for a, q in answers) / max(1, len(answers)), 4),
                "ingest_ms_first_tenth": _append_ms(reports[:tenth]),
                "ingest_ms_last_tenth": _append_ms(reports[-tenth:]),
                "ingest_ms_p99_last_tenth": _append_ms(reports[-tenth:], 99.0),
                "kv_entries": [r.kv_entries for r in reports[::every]], "sample_every": every,
                "ingest_ms": [_append_ms(reports[i:i + window]) for i in range(0, n, window)],
                "ingest_every": window}
    return out


def _append_ms(reports, percentile: float = 50.0) -> float | None:
    """A percentile (default the median) of the ingest latency (ms) of the frames that appended a segment
    (the others only wait for their temporal patch's partner, or were appended by a question), None if
    none did."""
    appended = [r.ingest_s for r in reports if r.appended]
    return round(1e3 * float(np.percentile(appended, percentile)), 3) if appended else None
