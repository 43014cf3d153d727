"""Train a class-conditional VAR (next-scale) model on Fashion-MNIST token pyramids.

    python -m mmaccel.image.train.train_var --out runs/var_large --depth 4 --width 128 --heads 4 \
        --export mmaccel/assets/fashion_var_large.safetensors

Data: the Fashion-MNIST train split encoded once by the multi-scale tokenizer (`--vq`, default the
shipped `fashion_msvq.safetensors`) into its 10-scale pyramid (680 codes an image), cached in
`<out>/../msvq_tokens_<split>.pt` and shared by every VAR run. Objective: VAR's — cross-entropy over
all L codes of the pyramid, teacher-forced with the tokenizer's next-scale inputs
(`MultiScaleQuantizer.scale_inputs`), block-causal attention, label dropout `--class-dropout` (the
null class for CFG). Initialisation: VAR's `init_weights`.

Resumable: `<out>/ckpt.pt` every `--ckpt-every` steps; the held-out loss (2 000 test images, per
scale too) goes to `<out>/eval.json`.
"""

from __future__ import annotations

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
from mmaccel.image.models.var import VAR, VARConfig, block_offsets, save_var
from mmaccel.image.tokenizers.msvq import MSVQModel, load_msvq
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

logger = logging.getLogger("mmaccel.image.train.train_var")

DEFAULT_MSVQ = assets_dir() / "fashion_msvq.safetensors"


@torch.no_grad()
def tokenize(vq: MSVQModel, images: Tensor, *, batch_size: int = 500) -> Tensor:
    """uint8 images [N, 28, 28] -> the code pyramid, scales concatenated coarse to fine, int16 [N, L]
    (images resized to the tokenizer's input side, last scale x downsample)."""
    size = vq.patch_nums[-1] * vq.config.downsample
    out = [torch.cat(vq.encode(to_model_images(images[s:s + batch_size], size)), 1).to(torch.int16)
           for s in range(0, len(images), batch_size)]
    return torch.cat(out)


def load_pyramids(split: str, cache: Path, vq_path: Path, data_root: Path | None) -> tuple[Tensor, Tensor]:
    """(codes int16 [N, L], labels int64 [N]) of `split`, tokenised once and cached at `cache`."""
    return cached_codes(split, cache, vq_path, lambda images: tokenize(load_msvq(vq_path), images), data_root)


def split_scales(tokens: Tensor, patch_nums) -> list[Tensor]:
    """[B, L] concatenated pyramid -> per-scale indices [B, pn^2] (int64)."""
    off = block_offsets(patch_nums)
    return [tokens[:, off[k]:off[k + 1]].long() for k in range(len(patch_nums))]


def var_loss(model: VAR, vq: MSVQModel, labels: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """(mean cross-entropy over the pyramid, per-token losses [B, L]) of codes `tokens` [B, L]."""
    with torch.no_grad():
        inputs = vq.quantize.scale_inputs(split_scales(tokens, model.patch_nums))
    logits = model(labels, inputs)
    per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.long().reshape(-1),
                                reduction="none").view(tokens.shape)
    return per_token.mean(), per_token


@torch.no_grad()
def held_out(model: VAR, vq: MSVQModel, tokens: Tensor, labels: Tensor, batch_size: int = 100) -> dict:
    """Mean loss over the test pyramids, overall and per scale."""
    model.eval()
    total = torch.zeros(tokens.shape[1])
    for s in range(0, len(tokens), batch_size):
        total += var_loss(model, vq, labels[s:s + batch_size], tokens[s:s + batch_size])[1].sum(0)
    per_pos = total / len(tokens)
    off = block_offsets(model.patch_nums)
    model.train()
    return {"loss": float(per_pos.mean()),
            "per_scale": {str(p): round(float(per_pos[off[k]:off[k + 1]].mean()), 4) for k, p in enumerate(model.patch_nums)}}


def train(args) -> VAR:
    vq = load_msvq(args.vq)
    cache_dir = args.out.parent
    tokens, labels = load_pyramids("train", cache_dir / "msvq_tokens_train.pt", args.vq, args.data_root)
    test_tokens, test_labels = load_pyramids("test", cache_dir / "msvq_tokens_test.pt", args.vq, args.data_root)
    test_tokens, test_labels = test_tokens[:args.eval_images], test_labels[:args.eval_images]
    config = VARConfig(vocab_size=vq.vocab_size, z_channels=vq.config.z_channels, num_classes=10, depth=args.depth,
                       embed_dim=args.width, num_heads=args.heads, patch_nums=vq.patch_nums,
                       cond_drop_rate=args.class_dropout)
    torch.manual_seed(args.seed)
    model = VAR(config)
    model.init_weights()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "emb" not in n and "pos_" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "emb" not in n and "pos_" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": rest, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    ckpt_path = args.out / "ckpt.pt"
    step = 0
    ckpt = read_checkpoint(ckpt_path)
    if ckpt is not None:
        step = restore(ckpt, model, opt, ckpt_path)
    logger.info("config %s, %.3f M parameters", config, sum(p.numel() for p in model.parameters()) / 1e6)
    lr_at = partial(cosine_lr, lr=args.lr, warmup=args.warmup, steps=args.steps)
    model.train()
    window, t0, result = [], time.perf_counter(), None
    bar = progress(desc="train VAR", total=args.steps, initial=step, unit="step")
    while step < args.steps:
        idx = batch_indices(len(tokens), args.batch_size, args.seed, step)
        y = dropped_labels(labels[idx], args.class_dropout, config.num_classes, args.seed, step)
        set_lr(opt, lr_at(step))
        loss, _ = var_loss(model, vq, y, tokens[idx])
        optimizer_step(opt, loss, model, 2.0)
        step += 1
        bar.update()
        window.append(loss.item())
        if step % args.log_every == 0 or step == args.steps:
            logger.info("step %d/%d lr %.2e loss %.4f | %.3f s/step", step, args.steps, lr_at(step - 1),
                        sum(window) / len(window), (time.perf_counter() - t0) / len(window))
            window, t0 = [], time.perf_counter()
        if step % args.ckpt_every == 0 or step == args.steps:
            save_checkpoint(ckpt_path, model, opt, step, asdict(config))
        if step % args.eval_every == 0 or step == args.steps:
            result = held_out(model, vq, test_tokens, test_labels)
            logger.info("held-out at step %d: %s", step, json.dumps(result))
    bar.close()
    model.eval()
    if result is None:            # nothing trained in this run
        result = held_out(model, vq, test_tokens, test_labels)
    result.update(steps=args.steps, config=asdict(config), images=len(test_tokens))
    (args.out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    return model.eval()


def parse_args(argv=None):
    p = run_arguments(__doc__.split("\n\n")[0], steps=3000, batch_size=32, lr=1e-3, warmup=100,
                      ckpt_every=100, export_help="write the trained model here (.safetensors, fp16)")
    p.add_argument("--vq", type=Path, default=DEFAULT_MSVQ, help="the multi-scale tokenizer")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--class-dropout", type=float, default=0.1)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-images", type=int, default=2000)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    start_run(args.out, args.threads, "mmaccel.image.train.train_var", argv)
    model = train(args)
    if args.export is not None:
        save_var(model, args.export, dtype=torch.float16)
        logger.info("exported %s (%.2f MB, fp16)", args.export, args.export.stat().st_size / 1e6)
    return 0


if __name__ == "__main__":
    sys.exit(main())
