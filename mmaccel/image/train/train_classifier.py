"""Train the small Fashion-MNIST classifier behind the domain FID (`mmaccel.metrics.domain`).

    python -m mmaccel.image.train.train_classifier --out runs/classifier \
        --export mmaccel/assets/fashion_classifier.safetensors

Data: Fashion-MNIST train split (Debian `dataset-fashion-mnist`). Each image in a batch takes one of two
paths, chosen at random. With probability `--roundtrip` it takes the path generated images take at
evaluation time: 28x28 upsampled to 64x64 in [-1, 1] (`to_model_images`), quantised to uint8, then
downsampled back to 28x28 with antialiasing (`domain.to_classifier_input`). Otherwise the 28x28
image is used as it is. Images are also flipped horizontally at random. Loss: cross-entropy with
label smoothing `--label-smoothing`.

Resumable: `<out>/ckpt.pt` is written every `--ckpt-every` steps and at the end, and rerunning the
same command continues from it (the batch of step s depends only on `--seed` and s). Logs go to
`<out>/train.log` and test-split accuracy to `<out>/eval.json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from mmaccel.image.data import load_fashion_mnist, to_model_images
from mmaccel.image.train.common import batch_indices, cosine_lr, read_checkpoint, restore, save_checkpoint, set_lr, start_run
from mmaccel.metrics.domain import ClassifierConfig, FashionClassifier, load_classifier, save_classifier, to_classifier_input
from mmaccel.progress import progress

logger = logging.getLogger("mmaccel.image.train.train_classifier")


def training_batch(images: Tensor, *, roundtrip: float, seed: int, step: int) -> Tensor:
    """uint8 [B, 28, 28] -> classifier input [B, 1, 28, 28], augmented as described in the module docstring."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step + 500_000_009)
    via_model = torch.rand(len(images), generator=g) < roundtrip
    flip = torch.rand(len(images), generator=g) < 0.5
    x = to_classifier_input(images)  # [B, 1, 28, 28]
    if via_model.any():
        x[via_model] = to_classifier_input(to_model_images(images[via_model], 64))
    x[flip] = x[flip].flip(-1)
    return x


@torch.no_grad()
def accuracy(model: FashionClassifier, images: Tensor, labels: Tensor, *, size: int | None,
             batch_size: int = 1000) -> float:
    """Top-1 accuracy on uint8 `images` [N, 28, 28]; `size` routes them through `to_model_images(., size)` first."""
    model.eval()
    correct = 0
    for start in range(0, len(images), batch_size):
        batch = images[start:start + batch_size]
        x = to_classifier_input(batch if size is None else to_model_images(batch, size))
        correct += int((model(x).argmax(-1) == labels[start:start + batch_size]).sum())
    return correct / len(images)


def train(args) -> FashionClassifier:
    out: Path = args.out
    ckpt_path = out / "ckpt.pt"
    config = ClassifierConfig(channels=tuple(args.channels), feature_dim=args.feature_dim, dropout=args.dropout)
    torch.manual_seed(args.seed)
    model = FashionClassifier(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    step = 0
    ckpt = read_checkpoint(ckpt_path)
    if ckpt is not None:
        if ckpt["config"] != asdict(config):
            logger.warning("checkpoint config %s differs from the arguments; using the checkpoint's", ckpt["config"])
            stored = ckpt["config"]
            model = FashionClassifier(ClassifierConfig(**{**stored, "channels": tuple(stored["channels"])}))
            opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        step = restore(ckpt, model, opt, ckpt_path)
    logger.info("config %s, %.3f M parameters", model.config, sum(p.numel() for p in model.parameters()) / 1e6)
    lr_at = partial(cosine_lr, lr=args.lr, warmup=args.warmup, steps=args.steps)

    if step >= args.steps:
        logger.info("already trained for %d steps (>= --steps %d)", step, args.steps)
        return model.eval()
    images, labels = load_fashion_mnist("train", args.data_root)
    if args.train_limit:
        images, labels = images[:args.train_limit], labels[:args.train_limit]
    logger.info("training on %d Fashion-MNIST images, batch %d, steps %d -> %d (%.2f epochs in all)",
                len(images), args.batch_size, step, args.steps, args.steps * args.batch_size / len(images))
    model.train()
    losses, hits, t0 = [], [], time.perf_counter()
    bar = progress(desc="train classifier", total=args.steps, initial=step, unit="step")
    while step < args.steps:
        idx = batch_indices(len(images), args.batch_size, args.seed, step)
        x = training_batch(images[idx], roundtrip=args.roundtrip, seed=args.seed, step=step)
        y = labels[idx]
        set_lr(opt, lr_at(step))
        logits = model(x)
        loss = F.cross_entropy(logits, y, label_smoothing=args.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        bar.update()
        losses.append(loss.item())
        hits.append((logits.argmax(-1) == y).float().mean().item())
        if step % args.log_every == 0 or step == args.steps:
            logger.info("step %d/%d lr %.2e loss %.4f train acc %.3f | %.3f s/step", step, args.steps, lr_at(step - 1),
                        sum(losses) / len(losses), sum(hits) / len(hits), (time.perf_counter() - t0) / len(losses))
            losses, hits, t0 = [], [], time.perf_counter()
        if step % args.ckpt_every == 0 or step == args.steps:
            save_checkpoint(ckpt_path, model, opt, step, asdict(model.config))
    bar.close()
    return model.eval()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="work directory (ckpt.pt, train.log, eval.json)")
    p.add_argument("--export", type=Path, default=None, help="write the trained classifier here (.safetensors)")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--label-smoothing", type=float, default=0.05)
    p.add_argument("--roundtrip", type=float, default=0.5,
                   help="fraction of training images routed 28 -> 64 -> 28 like generated samples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ckpt-every", type=int, default=250)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--data-root", type=Path, default=None, help="Fashion-MNIST directory (default: Debian package)")
    p.add_argument("--train-limit", type=int, default=0, help="use only the first N training images (0 = all)")
    p.add_argument("--eval-limit", type=int, default=0, help="evaluate on the first N test images (0 = all)")
    p.add_argument("--no-eval", action="store_true")
    g = p.add_argument_group("classifier size (ClassifierConfig)")
    g.add_argument("--channels", type=int, nargs=2, default=[32, 64])
    g.add_argument("--feature-dim", type=int, default=128)
    g.add_argument("--dropout", type=float, default=0.3)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    command = start_run(args.out, args.threads, "mmaccel.image.train.train_classifier", argv)
    t_start = time.perf_counter()
    model = train(args)
    train_minutes = (time.perf_counter() - t_start) / 60
    logger.info("training done in %.1f min this run", train_minutes)
    if args.export is not None:
        save_classifier(model, args.export)
        x = to_classifier_input(load_fashion_mnist("test", args.data_root)[0][:8])
        with torch.no_grad():
            same = torch.equal(load_classifier(args.export)(x), model(x))
        logger.info("exported %s (%.2f MB); reloaded logits identical: %s", args.export,
                    args.export.stat().st_size / 1e6, same)
    if not args.no_eval:
        test, labels = load_fashion_mnist("test", args.data_root)
        if args.eval_limit:
            test, labels = test[:args.eval_limit], labels[:args.eval_limit]
        t0 = time.perf_counter()
        result = {"images": len(test), "accuracy_28px": accuracy(model, test, labels, size=None),
                  "accuracy_via_64px": accuracy(model, test, labels, size=64)}
        result.update(command=command, steps=args.steps, seed=args.seed, config=asdict(model.config),
                      train_minutes_this_run=round(train_minutes, 2))
        (args.out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
        logger.info("test split (%d images, %.0f s): accuracy %.4f at 28x28, %.4f via 64x64",
                    result["images"], time.perf_counter() - t0, result["accuracy_28px"], result["accuracy_via_64px"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
