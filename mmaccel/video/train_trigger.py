"""Train the proactive trigger head (`mmaccel.video.trigger.TriggerHead`) on a frozen streaming model.

Train-split streams (`mmaccel.video.data`) go through the frozen pipeline frame by frame; every
appended segment gives the final hidden states of its vision tokens (`state.hidden` without the two
markers) and its target: the classes visible at the segment's last frame. The head is fit with binary
cross-entropy on its max-pooled logits. The decision threshold is then chosen on development streams
(train split, other seeds) with "when" requests spread over them: every threshold of a grid is replayed
through the pipeline's firing rule (`trigger_eval.replay_requests`) and the one with the best trigger F1
(`trigger_eval.trigger_metrics`) is kept. Head, classes and threshold are written next to the model.

With `--min-visible 0.5`, a class whose objects show less than half of their box at that frame (entering
or leaving) is left out of the loss rather than called in view: the head is not asked to name a sliver.

By default half of the streams go through `TemporalDrop("pixel")` (the pipeline's `reduction`), so the
head also reads streams whose static tokens were dropped; `--reduction none|dtd` uses one kind only.

    python -m mmaccel.video.train_trigger --model mmaccel/assets/video_qwen       # writes trigger.* there
    python -m mmaccel.video.train_trigger --model DIR --reduction dtd --out runs/trigger_dtd

About 5 ms per segment on one CPU core for the built-in model; the defaults stream 240 + 40 streams.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from mmaccel.errors import check
from mmaccel.video.data import CLASSES, OBJECT_SIZE, make_stream, questions
from mmaccel.video.reduce import TemporalDrop
from mmaccel.video.trigger import TriggerHead
from mmaccel.video.trigger_eval import TOLERANCE, replay_requests, trigger_metrics

REDUCTIONS = ("mix", "none", "dtd")
TRAIN_SEED0, DEV_SEED0 = 10_000_000, 20_000_000   # train-split stream seeds of the training and development sets
THRESHOLDS = tuple(float(t) for t in np.round(np.arange(0.05, 0.951, 0.025), 3))


@dataclass
class Recording:
    """One stream through the frozen pipeline: per appended segment the vision-token hidden states
    [n_s, d] (float32, host; n_s may be 0 after token dropping), the last frame, and the visible
    classes at that frame as a multi-hot [C]."""

    stream: object
    reduced: bool
    hidden: list[Tensor]
    frames: list[int]
    labels: Tensor          # [S, C] float
    weights: Tensor | None = None   # [S, C]: 0 where a class is in view only in part (`min_visible`), else 1


def visible_share(track, t: int) -> float:
    """The share of the object's 28x28 box on the canvas at frame `t`."""
    x, y = track.position(t)
    c, s = track.canvas, OBJECT_SIZE
    return max(0, min(x + s, c) - max(x, 0)) * max(0, min(y + s, c) - max(y, 0)) / (s * s)


def record(pipe, stream, classes: tuple[str, ...] = CLASSES, min_visible: float = 0.0) -> Recording:
    """Feed `stream` through `pipe` (reset first) and keep what each appended segment left in `state.hidden`.
    A class counts as in view at the segment's last frame; with `min_visible` > 0, a class whose objects
    show less than that share of their box there is left out of the loss (weight 0): neither in view nor not."""
    pipe.reset()
    hidden, frames, labels, weights = [], [], [], []
    for t in range(stream.num_frames):
        if pipe.feed(stream.frame(t)).appended:
            hidden.append(pipe.state.hidden[0, 1:-1].to("cpu", torch.float32).clone())   # markers excluded
            frames.append(t)
            share = {}
            for tr in stream.on_screen(t):
                share[tr.class_name] = max(share.get(tr.class_name, 0.0), visible_share(tr, t))
            labels.append([float(c in share) for c in classes])
            weights.append([float(c not in share or share[c] >= min_visible) for c in classes])
    shape = (-1, len(classes))
    return Recording(stream, bool(pipe.reduction), hidden, frames, torch.tensor(labels).reshape(shape),
                     torch.tensor(weights).reshape(shape))


def record_streams(pipes: dict[bool, object], seeds: list[int], num_frames: int, reduction: str,
                   log=print, min_visible: float = 0.0) -> list[Recording]:
    """Record train-split streams `seeds`; `pipes[reduced]` is the pipeline without / with TemporalDrop,
    chosen per stream by `reduction` ("mix": alternate)."""
    check(reduction in REDUCTIONS, f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    out, t0 = [], time.perf_counter()
    for i, seed in enumerate(seeds):
        reduced = {"mix": i % 2 == 1, "none": False, "dtd": True}[reduction]
        out.append(record(pipes[reduced], make_stream(seed, num_frames, "train"), min_visible=min_visible))
        if (i + 1) % 20 == 0:
            log(f"recorded {i + 1}/{len(seeds)} streams {time.perf_counter() - t0:.0f}s")
    return out


def pad(hidden: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Segments' hidden states [n_s, d] -> padded [N, n_max, d] (float32) and mask [N, n_max] (True = token)."""
    n_max, d = max(max(h.shape[0] for h in hidden), 1), hidden[0].shape[-1]
    x = torch.zeros(len(hidden), n_max, d)
    mask = torch.zeros(len(hidden), n_max, dtype=torch.bool)
    for i, h in enumerate(hidden):
        x[i, :h.shape[0]] = h.float()
        mask[i, :h.shape[0]] = True
    return x, mask


def train_head(head: TriggerHead, recordings: list[Recording], *, steps: int = 1500, batch: int = 256,
               lr: float = 2e-3, seed: int = 0, log=print) -> list[float]:
    """Fit `head` with BCE on its max-pooled logits over the recorded segments (those with no vision token
    are left out: the head gives them probability 0 by construction). Returns the loss per step."""
    hidden = [h for r in recordings for h in r.hidden]
    labels = torch.cat([r.labels for r in recordings])
    weights = torch.cat([torch.ones_like(r.labels) if r.weights is None else r.weights for r in recordings])
    x, mask = pad(hidden)
    rows = mask.any(1)
    x, mask, labels, weights = x[rows], mask[rows], labels[rows], weights[rows]
    check(len(x) > 0, "no recorded segment has a vision token to train on")
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    g = torch.Generator().manual_seed(seed)
    losses, t0 = [], time.perf_counter()
    head.train()
    for step in range(steps):
        idx = torch.randint(0, len(x), (min(batch, len(x)),), generator=g)
        logits = head(x[idx], mask[idx])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels[idx], weights[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if (step + 1) % 100 == 0 or step + 1 == steps:
            log(f"step {step + 1} loss {np.mean(losses[-100:]):.4f} {time.perf_counter() - t0:.0f}s")
    return losses


@torch.no_grad()
def segment_probabilities(head: TriggerHead, recording: Recording) -> Tensor:
    """[S, C] probabilities of the recorded segments, as the pipeline computes them."""
    head.eval()
    if not recording.hidden:
        return torch.zeros(0, len(head.classes))
    return torch.stack([head.probabilities(h.float()) for h in recording.hidden])


def dev_requests(recordings: list[Recording], per_stream: int, seed: int) -> list[list]:
    """"when" requests spread over each development stream (`data.questions`)."""
    rng = np.random.default_rng([seed, 7])
    return [questions(r.stream, rng, per_stream, kinds=("when",)) for r in recordings]


def pick_threshold(head: TriggerHead, recordings: list[Recording], requests: list[list], *,
                   tolerance: int = TOLERANCE, grid: tuple[float, ...] = THRESHOLDS) -> tuple[float, dict]:
    """The threshold of `grid` with the best trigger F1 over the development requests (ties: the
    smaller median delay, then the lower threshold), and its metrics."""
    probs = [segment_probabilities(head, r) for r in recordings]
    best = None
    for threshold in grid:
        outcomes = []
        for r, p, qs in zip(recordings, probs, requests):
            fired = replay_requests(p, r.frames, head.classes, threshold, [(q.answer, q.frame) for q in qs])
            outcomes += [(q.trigger_frame, f) for q, f in zip(qs, fired)]
        metrics = trigger_metrics(outcomes, tolerance)
        key = (metrics["f1"], -(metrics["median_delay"] if metrics["median_delay"] is not None else 1e9))
        if best is None or key > best[0]:
            best = (key, threshold, metrics)
    return best[1], best[2]


def main(argv: list[str] | None = None) -> None:
    from mmaccel.video.qwen_vl import QwenVLStream, load_qwen_vl
    from mmaccel.video.stream import VideoStreamPipeline, load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="the frozen stream model's directory")
    ap.add_argument("--out", type=Path, default=None, help="where trigger.safetensors + trigger.json go "
                    "(default: the model directory)")
    ap.add_argument("--log", type=Path, default=Path("runs/trigger/train.log"))
    ap.add_argument("--reduction", choices=REDUCTIONS, default="mix", help="train on full streams, TemporalDrop "
                    "(dtd) streams, or alternate (mix)")
    ap.add_argument("--train-streams", type=int, default=240)
    ap.add_argument("--dev-streams", type=int, default=40)
    ap.add_argument("--frames", type=int, default=200, help="frames per training stream")
    ap.add_argument("--dev-frames", type=int, default=300)
    ap.add_argument("--dev-requests", type=int, default=6, help="'when' requests per development stream")
    ap.add_argument("--min-visible", type=float, default=0.0, help="leave a class out of the loss where its "
                    "objects show less than this share of their box (0: any pixel counts as in view)")
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--tolerance", type=int, default=TOLERANCE)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = args.out or args.model
    args.log.parent.mkdir(parents=True, exist_ok=True)
    log_file = open(args.log, "a")

    def log(line: str) -> None:
        print(line, flush=True)
        print(line, file=log_file, flush=True)

    log(f"train_trigger {vars(args)}")
    model = QwenVLStream(load_qwen_vl(args.model, torch.float32))
    tok = load_tokenizer(args.model)
    pipes = {False: VideoStreamPipeline(model, tok),
             True: VideoStreamPipeline(model, tok, reduction=TemporalDrop("pixel"))}
    base = args.seed * 100_000
    train = record_streams(pipes, [TRAIN_SEED0 + base + i for i in range(args.train_streams)], args.frames,
                           args.reduction, log, args.min_visible)
    dev = record_streams(pipes, [DEV_SEED0 + base + i for i in range(args.dev_streams)], args.dev_frames,
                         args.reduction, log)
    head = TriggerHead(model.text.config.hidden_size, CLASSES, width=args.width)
    losses = train_head(head, train, steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed, log=log)
    requests = dev_requests(dev, args.dev_requests, args.seed)
    threshold, dev_metrics = pick_threshold(head, dev, requests, tolerance=args.tolerance)
    head.threshold = threshold
    by_kind = {}
    for reduced in sorted({r.reduced for r in dev}):
        part = [i for i, r in enumerate(dev) if r.reduced == reduced]
        by_kind["temporal_drop" if reduced else "full"] = pick_threshold(
            head, [dev[i] for i in part], [requests[i] for i in part], tolerance=args.tolerance, grid=(threshold,))[1]
    log(f"threshold {threshold} dev {json.dumps(dev_metrics)}")
    for kind, metrics in by_kind.items():
        log(f"dev {kind}: precision {metrics['precision']:.3f} recall {metrics['recall']:.3f} "
            f"median delay {metrics['median_delay']}")
    head.save(out, trained={"command": "python -m mmaccel.video.train_trigger", "args": {
        k: str(v) for k, v in vars(args).items()}, "final_loss": float(np.mean(losses[-100:])),
        "dev": dev_metrics, "dev_by_reduction": by_kind})
    log(f"saved {out}")


if __name__ == "__main__":
    main()
