"""Train the class-conditional LlamaGen-layout GPT (and its small drafter) on Fashion-MNIST token grids.

    python -m mmaccel.image.train.train_gpt --out runs/gpt --preset GPT-micro --steps 4000 \
        --export mmaccel/assets/fashion_gpt.safetensors

Data: the Fashion-MNIST train split (60 000 images, Debian `dataset-fashion-mnist`) encoded once by
the shipped tokenizer (`mmaccel/assets/fashion_vq.safetensors`) into 16x16 grids of codes, cached in
`<out>/../tokens_train.pt` (shared by the target and the drafter runs). Objective: the official c2i
one — next-token cross-entropy over the 256 raster-ordered codes given the class token, with label
dropout `--class-dropout` (the CFG null class). Dropouts inside the network are off: these small
models train for about two epochs and underfit rather than overfit.

Resumable: `<out>/ckpt.pt` every `--ckpt-every` steps and at the end; rerunning the same command
continues from it (the batch of step s depends only on `--seed` and s). Logs go to `<out>/train.log`,
the held-out loss (test split) to `<out>/eval.json`.
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

from mmaccel.image.data import to_model_images
from mmaccel.image.models.gpt import GPTConfig, LlamaGenGPT, gpt_config, load_gpt, save_gpt
from mmaccel.image.tokenizers.vq import VQModel, load_vq
from mmaccel.image.train.common import (
    batch_indices,
    cached_codes,
    cosine_lr,
    optimizer_step,
    read_checkpoint,
    restore,
    save_checkpoint,
    set_lr,
    start_run,
)
from mmaccel.paths import assets_dir
from mmaccel.progress import progress

logger = logging.getLogger("mmaccel.image.train.train_gpt")

DEFAULT_VQ = assets_dir() / "fashion_vq.safetensors"


@torch.no_grad()
def tokenize(vq: VQModel, images: Tensor, *, size: int = 64, batch_size: int = 500) -> Tensor:
    """uint8 images [N, 28, 28] -> code grids flattened in raster order, int16 [N, h*w]."""
    vq.eval()
    out = []
    for start in range(0, len(images), batch_size):
        out.append(vq.encode(to_model_images(images[start:start + batch_size], size)).flatten(1).to(torch.int16))
    return torch.cat(out)


def load_tokens(split: str, cache: Path, vq_path: Path, data_root: Path | None) -> tuple[Tensor, Tensor]:
    """(codes int16 [N, 256], labels int64 [N]) of `split`, tokenised once and cached at `cache`."""
    return cached_codes(split, cache, vq_path, lambda images: tokenize(load_vq(vq_path), images), data_root)


def lm_loss(model: LlamaGenGPT, labels: Tensor, tokens: Tensor) -> Tensor:
    """Mean next-token cross-entropy of the image codes `tokens` [B, N] given the class token."""
    logits = model(labels, tokens[:, :-1])  # [B, N, V]: row j predicts code j
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1))


@torch.no_grad()
def held_out_loss(model: LlamaGenGPT, tokens: Tensor, labels: Tensor, batch_size: int = 250) -> float:
    model.eval()
    total = 0.0
    for start in range(0, len(tokens), batch_size):
        x = tokens[start:start + batch_size].long()
        total += lm_loss(model, labels[start:start + batch_size], x).item() * len(x)
    return total / len(tokens)


def config_from_args(args) -> GPTConfig:
    return gpt_config(args.preset, vocab_size=args.vocab_size, num_classes=10, block_size=256,
                      class_dropout_prob=args.class_dropout, token_dropout_p=0.0, resid_dropout_p=0.0,
                      ffn_dropout_p=0.0, attn_dropout_p=0.0)


def train(args, tokens: Tensor, labels: Tensor) -> LlamaGenGPT:
    ckpt_path = args.out / "ckpt.pt"
    config = config_from_args(args)
    torch.manual_seed(args.seed)
    model = LlamaGenGPT(config)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    step = 0
    ckpt = read_checkpoint(ckpt_path)
    if ckpt is not None:
        if ckpt["config"] != asdict(config):
            raise SystemExit(f"{ckpt_path} was trained with config {ckpt['config']}, not {asdict(config)}; "
                             "use another --out or the original arguments")
        step = restore(ckpt, model, opt, ckpt_path)
    logger.info("config %s, %.3f M parameters", config, sum(p.numel() for p in model.parameters()) / 1e6)
    lr_at = partial(cosine_lr, lr=args.lr, warmup=args.warmup, steps=args.steps)

    model.train()
    window, t0 = [], time.perf_counter()
    bar = progress(desc="train GPT", total=args.steps, initial=step, unit="step")
    while step < args.steps:
        idx = batch_indices(len(tokens), args.batch_size, args.seed, step)
        set_lr(opt, lr_at(step))
        loss = lm_loss(model, labels[idx], tokens[idx].long())
        optimizer_step(opt, loss, model, 1.0)
        step += 1
        bar.update()
        window.append(loss.item())
        if step % args.log_every == 0 or step == args.steps:
            logger.info("step %d/%d lr %.2e loss %.4f | %.3f s/step (epoch %.2f)", step, args.steps, lr_at(step - 1),
                        sum(window) / len(window), (time.perf_counter() - t0) / len(window),
                        step * args.batch_size / len(tokens))
            window, t0 = [], time.perf_counter()
        if step % args.ckpt_every == 0 or step == args.steps:
            save_checkpoint(ckpt_path, model, opt, step, asdict(config))
    bar.close()
    return model.eval()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="work directory (ckpt.pt, train.log, eval.json)")
    p.add_argument("--export", type=Path, default=None, help="write the trained model here (.safetensors)")
    p.add_argument("--vq", type=Path, default=DEFAULT_VQ, help="tokenizer that encodes the training images")
    p.add_argument("--preset", default="GPT-micro", help="GPT size preset (mmaccel.image.models.gpt.GPT_PRESETS)")
    p.add_argument("--vocab-size", type=int, default=1024)
    p.add_argument("--class-dropout", type=float, default=0.1, help="label dropout (trains the CFG null class)")
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ckpt-every", type=int, default=200)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--data-root", type=Path, default=None, help="Fashion-MNIST directory (default: Debian package)")
    p.add_argument("--eval-limit", type=int, default=2000, help="held-out loss on the first N test images")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    command = start_run(args.out, args.threads, "mmaccel.image.train.train_gpt", argv)
    cache_dir = args.out.parent
    tokens, labels = load_tokens("train", cache_dir / "tokens_train.pt", args.vq, args.data_root)
    t_start = time.perf_counter()
    model = train(args, tokens, labels)
    logger.info("training done in %.1f min this run", (time.perf_counter() - t_start) / 60)
    test_tokens, test_labels = load_tokens("test", cache_dir / "tokens_test.pt", args.vq, args.data_root)
    n = args.eval_limit or len(test_tokens)
    result = {"held_out_loss": held_out_loss(model, test_tokens[:n], test_labels[:n]), "held_out_images": n,
              "steps": args.steps, "seed": args.seed, "command": command, "config": asdict(model.config),
              "params_m": sum(p.numel() for p in model.parameters()) / 1e6}
    (args.out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    logger.info("held-out loss %.4f nats/token on %d test images", result["held_out_loss"], n)
    if args.export is not None:
        save_gpt(model, args.export, metadata={"command": command, "held_out_loss": f"{result['held_out_loss']:.4f}"})
        reloaded = load_gpt(args.export)
        x = test_tokens[:4].long()
        same = torch.equal(reloaded(test_labels[:4], x[:, :-1]), model(test_labels[:4], x[:, :-1]))
        logger.info("exported %s (%.2f MB); reloaded logits identical: %s", args.export,
                    args.export.stat().st_size / 1e6, same)
    return 0


if __name__ == "__main__":
    sys.exit(main())
