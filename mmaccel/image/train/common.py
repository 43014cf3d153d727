"""What the image trainers share: run set-up, seeded batches, the learning-rate schedule and
resumable checkpoints (`<out>/ckpt.pt`, written atomically)."""

from __future__ import annotations

import argparse
import logging
import math
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mmaccel.image.data import load_fashion_mnist
from mmaccel.progress import LogAboveBars

logger = logging.getLogger("mmaccel.image.train")


def start_run(out: Path, threads: int, module: str, argv: list[str] | None) -> str:
    """Create `out`, log to `<out>/train.log` and stderr (above the progress bar), set the torch threads;
    returns the command line."""
    out.mkdir(parents=True, exist_ok=True)
    handlers = [logging.FileHandler(out / "train.log"), LogAboveBars(sys.stderr)]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", handlers=handlers, force=True)
    torch.set_num_threads(threads)
    command = shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])
    logger.info("command: %s", command)
    return command


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> Tensor:
    """The training examples of `step`: a function of (seed, step) only, so a resumed run sees the same batches."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, n, (batch_size,), generator=g)


def dropped_labels(labels: Tensor, rate: float, null: int, seed: int, step: int) -> Tensor:
    """A copy of a batch's `labels` with a seeded fraction `rate` set to the null class `null` (label
    dropout, which trains classifier-free guidance); a function of (seed, step) like the batch itself."""
    g = torch.Generator().manual_seed(seed * 7919 + step)
    out = labels.clone()
    out[torch.rand(len(out), generator=g) < rate] = null
    return out


def cosine_lr(step: int, *, lr: float, warmup: int, steps: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to 10 % of `lr` at `steps`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, t))))


def optimizer_step(opt: torch.optim.Optimizer, loss: Tensor, module: torch.nn.Module, max_norm: float) -> None:
    """One update: backpropagate `loss`, clip `module`'s gradient norm to `max_norm`, step `opt`."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm)
    opt.step()


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def read_checkpoint(path: Path) -> dict[str, Any] | None:
    """The checkpoint at `path` ({"model", "optimizer", "step", "config"}), or None if there is none yet."""
    return torch.load(path, weights_only=True) if path.exists() else None


def restore(ckpt: dict[str, Any], model: torch.nn.Module, opt: torch.optim.Optimizer, path: Path) -> int:
    """Load `ckpt` into `model` and `opt`; returns the step to continue from."""
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    logger.info("resumed from %s at step %d", path, ckpt["step"])
    return ckpt["step"]


def save_checkpoint(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int,
                    config: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "config": config}, tmp)
    tmp.replace(path)  # atomic: an interrupted write never corrupts the last checkpoint


def cached_codes(split: str, cache: Path, source: Path, encode: Callable[[Tensor], Tensor],
                 data_root: Path | None) -> tuple[Tensor, Tensor]:
    """(codes int16 [N, L], labels int64 [N]) of Fashion-MNIST `split`: `encode` (uint8 images [N, 28, 28]
    -> codes) runs once, by the tokenizer at `source`, and the result is cached at `cache`."""
    if cache.exists():
        data = torch.load(cache, weights_only=True)
        return data["tokens"], data["labels"]
    images, labels = load_fashion_mnist(split, data_root)
    t0 = time.perf_counter()
    tokens = encode(images)
    logger.info("tokenised %d %s images in %.0f s -> %s", len(images), split, time.perf_counter() - t0, cache)
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"tokens": tokens, "labels": labels, "vq": str(source)}, cache)
    return tokens, labels


def run_arguments(description: str, *, steps: int, batch_size: int, lr: float, warmup: int, ckpt_every: int,
                  export_help: str) -> argparse.ArgumentParser:
    """A trainer's parser with the options every image trainer shares: --out, --export, --steps,
    --batch-size, --lr, --warmup, --seed, --threads, --ckpt-every, --data-root."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="work directory (ckpt.pt, train.log, eval.json)")
    p.add_argument("--export", type=Path, default=None, help=export_help)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--warmup", type=int, default=warmup)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ckpt-every", type=int, default=ckpt_every)
    p.add_argument("--data-root", type=Path, default=None, help="Fashion-MNIST directory (default: Debian package)")
    return p
