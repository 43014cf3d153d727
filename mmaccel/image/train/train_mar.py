"""Train a class-conditional MAR-style continuous-token generator (target or CSpD drafter) on Fashion-MNIST.

    python -m mmaccel.image.train.train_mar --out runs/mar_target --export mmaccel/assets/fashion_mar.safetensors
    python -m mmaccel.image.train.train_mar --out runs/mar_draft --width 96 --depth 3 --heads 4 --head-width 128 \
        --head-depth 2 --export mmaccel/assets/fashion_mar_draft.safetensors

Data: the train split encoded once by the KL tokenizer (`--kl`, default the shipped
`fashion_kl.safetensors`); the posterior moments are cached in `<out>/../kl_moments_<split>.pt` and
every batch draws fresh posterior samples (MAR's cached-latent training). Objective: MAR's diffusion
loss on the masked tokens, `--diffusion-repeats` noise draws per token. The masked fraction of a row is
cos(pi/2 u), u ~ U(0, 1) (MaskGIT's schedule, which the cosine decoding schedule walks), at least one
token; labels are dropped to the null class at `--class-dropout` (classifier-free guidance).

Resumable: `<out>/ckpt.pt` every `--ckpt-every` steps; the held-out loss (2 000 test images, fixed
masks and noise) goes to `<out>/eval.json`.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch
from torch import Tensor

from mmaccel.image.data import to_model_images
from mmaccel.image.models.mar import MAR, MARConfig, save_mar
from mmaccel.image.tokenizers.kl import KLTokenizer, load_kl
from mmaccel.image.train.common import (
    batch_indices,
    cached_codes,
    cosine_lr,
    dropped_labels,
    optimizer_step,
    read_checkpoint,
    restore,
    run_arguments,
    save_checkpoint,
    set_lr,
    start_run,
)
from mmaccel.paths import assets_dir
from mmaccel.progress import progress

logger = logging.getLogger("mmaccel.image.train.train_mar")

DEFAULT_KL = assets_dir() / "fashion_kl.safetensors"


@torch.no_grad()
def moments(kl: KLTokenizer, images: Tensor, *, batch_size: int = 500) -> Tensor:
    """uint8 images [N, 28, 28] -> scaled posterior (mean, std) tokens, float16 [N, 2, L, C]."""
    out = []
    for s in range(0, len(images), batch_size):
        dist = kl.posterior(to_model_images(images[s:s + batch_size], kl.config.image_size))
        out.append(torch.stack([kl.to_tokens(dist.mean), kl.to_tokens(dist.std)], 1).half())
    return torch.cat(out)


def load_moments(split: str, cache: Path, kl_path: Path, data_root: Path | None) -> tuple[Tensor, Tensor]:
    return cached_codes(split, cache, kl_path, lambda images: moments(load_kl(kl_path), images), data_root)


def random_known(batch: int, seq_len: int, generator: torch.Generator) -> Tensor:
    """[B, L] bool: per row, a cos(pi/2 u) fraction of the positions (at least one) is unknown."""
    masked = torch.cos(math.pi / 2 * torch.rand(batch, generator=generator)).mul(seq_len).ceil().clamp(1, seq_len)
    rank = torch.rand(batch, seq_len, generator=generator).argsort(1).argsort(1)
    return rank >= masked[:, None]


def sample_tokens(mom: Tensor, generator: torch.Generator) -> Tensor:
    """Posterior samples from moments [B, 2, L, C]."""
    mean, std = mom.float().unbind(1)
    return mean + std * torch.randn(mean.shape, generator=generator)


@torch.no_grad()
def held_out_loss(model: MAR, mom: Tensor, labels: Tensor, *, repeats: int, batch_size: int = 250) -> float:
    """Mean diffusion loss on (`mom`, `labels`) with masks and noise fixed by seed 0 (comparable across runs)."""
    model.eval()
    gen, total, n = torch.Generator().manual_seed(0), 0.0, 0
    for s in range(0, len(mom), batch_size):
        m, y = mom[s:s + batch_size], labels[s:s + batch_size]
        known = random_known(len(m), model.config.seq_len, gen)
        total += model.loss(sample_tokens(m, gen), known, y, gen, repeats).item() * len(m)
        n += len(m)
    model.train()
    return total / n


def train(args) -> MAR:
    ckpt_path = args.out / "ckpt.pt"
    kl = load_kl(args.kl)
    config = MARConfig(seq_len=kl.seq_len, token_dim=kl.token_dim, num_classes=10, width=args.width, depth=args.depth,
                       heads=args.heads, buffer=args.buffer, head_width=args.head_width, head_depth=args.head_depth)
    torch.manual_seed(args.seed)
    model = MAR(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.02)
    step = 0
    ckpt = read_checkpoint(ckpt_path)
    if ckpt is not None:
        step = restore(ckpt, model, opt, ckpt_path)
    logger.info("config %s, %.3f M parameters (head %.3f M)", config, sum(p.numel() for p in model.parameters()) / 1e6,
                sum(p.numel() for p in model.head.parameters()) / 1e6)
    cache = args.out.parent
    train_mom, train_y = load_moments("train", cache / "kl_moments_train.pt", args.kl, args.data_root)
    test_mom, test_y = load_moments("test", cache / "kl_moments_test.pt", args.kl, args.data_root)
    test_mom, test_y = test_mom[:args.eval_images], test_y[:args.eval_images]
    if step < args.steps:
        lr_at = partial(cosine_lr, lr=args.lr, warmup=args.warmup, steps=args.steps)
        model.train()
        window, t0 = [], time.perf_counter()
        bar = progress(desc="train MAR", total=args.steps, initial=step, unit="step")
        while step < args.steps:
            idx = batch_indices(len(train_mom), args.batch_size, args.seed, step)
            gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step + 1)
            labels = dropped_labels(train_y[idx], args.class_dropout, model.null_class, args.seed, step)
            known = random_known(len(idx), config.seq_len, gen)
            set_lr(opt, lr_at(step))
            loss = model.loss(sample_tokens(train_mom[idx], gen), known, labels, gen, args.diffusion_repeats)
            optimizer_step(opt, loss, model, 1.0)
            step += 1
            bar.update()
            window.append(loss.item())
            if step % args.log_every == 0:
                logger.info("step %d/%d lr %.2e loss %.4f | %.3f s/step", step, args.steps, lr_at(step - 1),
                            sum(window) / len(window), (time.perf_counter() - t0) / len(window))
                window, t0 = [], time.perf_counter()
            if step % args.eval_every == 0:
                logger.info("step %d held-out loss %.4f", step,
                            held_out_loss(model, test_mom, test_y, repeats=args.diffusion_repeats))
            if step % args.ckpt_every == 0 or step == args.steps:
                save_checkpoint(ckpt_path, model, opt, step, asdict(config))
        bar.close()
    model.eval()
    model.held_out = held_out_loss(model, test_mom, test_y, repeats=args.diffusion_repeats)
    return model


def parse_args(argv=None):
    p = run_arguments(__doc__.split("\n\n")[0], steps=6000, batch_size=64, lr=1e-3, warmup=200,
                      ckpt_every=250, export_help="write the trained model here (.safetensors, fp16)")
    p.add_argument("--kl", type=Path, default=DEFAULT_KL, help="the KL tokenizer")
    p.add_argument("--class-dropout", type=float, default=0.1)
    p.add_argument("--diffusion-repeats", type=int, default=4, help="noise draws per token (MAR: 4)")
    p.add_argument("--eval-images", type=int, default=2000)
    p.add_argument("--eval-every", type=int, default=1000)
    p.add_argument("--log-every", type=int, default=50)
    g = p.add_argument_group("model size (MARConfig)")
    g.add_argument("--width", type=int, default=192)
    g.add_argument("--depth", type=int, default=6)
    g.add_argument("--heads", type=int, default=6)
    g.add_argument("--buffer", type=int, default=4)
    g.add_argument("--head-width", type=int, default=256)
    g.add_argument("--head-depth", type=int, default=3)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    command = start_run(args.out, args.threads, "mmaccel.image.train.train_mar", argv)
    model = train(args)
    if args.export is not None:
        save_mar(model, args.export, dtype=torch.float16)
        logger.info("exported %s (%.2f MB, fp16)", args.export, args.export.stat().st_size / 1e6)
    result = {"held_out_loss": model.held_out, "eval_images": args.eval_images, "command": command,
              "steps": args.steps, "seed": args.seed, "config": asdict(model.config)}
    (args.out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    logger.info("held-out diffusion loss (%d test images): %.4f", args.eval_images, model.held_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
