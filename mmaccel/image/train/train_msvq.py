"""Train the small VAR-layout multi-scale tokenizer shipped as `mmaccel/assets/fashion_msvq.safetensors`.

    python -m mmaccel.image.train.train_msvq --out runs/msvq --export mmaccel/assets/fashion_msvq.safetensors

Data: Fashion-MNIST train split at 64x64 (`mmaccel.image.data.to_model_images`); with downsample 4 the
last scale is the 16x16 latent grid, so VAR's schedule (1, 2, 3, 4, 5, 6, 8, 10, 13, 16) applies as is.
Loss: MSE + `--l1-weight` * L1 reconstruction plus VAR's multi-scale VQ loss (`MSVQModel.training_forward`:
per scale, commitment `--beta` |sg[f_hat] - f|^2 + |f_hat - sg[f]|^2, straight-through to the encoder).
Codes unused for `--restart-every` steps are restarted on random latent vectors of the current batch
(until 80 % of the steps), so the codebook does not collapse onto a few entries.

Resumable: `<out>/ckpt.pt` every `--ckpt-every` steps; the test-split evaluation goes to `<out>/eval.json`.
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
import torch.nn.functional as F
from torch import Tensor

from mmaccel.image.data import load_fashion_mnist, to_model_images
from mmaccel.image.tokenizers.msvq import MSVQConfig, MSVQModel, load_msvq, save_msvq
from mmaccel.image.train.common import (
    batch_indices,
    cosine_lr,
    optimizer_step,
    read_checkpoint,
    restore,
    run_arguments,
    save_checkpoint,
    set_lr,
    start_run,
)
from mmaccel.image.train.train_vq import save_recon_grid
from mmaccel.progress import progress

logger = logging.getLogger("mmaccel.image.train.train_msvq")


@torch.no_grad()
def restart_dead_codes(model: MSVQModel, used: Tensor, latents: Tensor, generator: torch.Generator) -> int:
    """Reset the codes not in `used` [V] (bool) to random rows of `latents` [N, C]; returns how many."""
    dead = (~used).nonzero().flatten()
    if len(dead) == 0:
        return 0
    pick = torch.randint(0, len(latents), (len(dead),), generator=generator)
    model.quantize.embedding.weight[dead] = latents[pick]
    return len(dead)


@torch.no_grad()
def evaluate(model: MSVQModel, images: Tensor, *, size: int, batch_size: int = 250) -> dict:
    """Reconstruction through encode -> decode on uint8 `images`; MSE/PSNR on pixels in [0, 1]; code usage."""
    model.eval()
    sq_err, n_px = 0.0, 0
    counts = torch.zeros(model.vocab_size, dtype=torch.long)
    for start in range(0, len(images), batch_size):
        x = to_model_images(images[start:start + batch_size], size)
        idx = model.encode(x)
        recon = model.decode(idx)
        sq_err += ((recon - x) / 2).pow(2).sum().item()
        n_px += x.numel()
        counts += torch.bincount(torch.cat(idx, 1).flatten(), minlength=model.vocab_size)
    mse = sq_err / n_px
    p = counts.float() / counts.sum()
    nz = p[p > 0]
    return {"images": len(images), "mse_01": mse, "psnr_db": 10 * math.log10(1.0 / mse),
            "codes_used": int((counts > 0).sum()), "vocab_size": model.vocab_size,
            "code_perplexity": float(torch.exp(-(nz * nz.log()).sum()))}


def config_from_args(args) -> MSVQConfig:
    return MSVQConfig(vocab_size=args.vocab_size, z_channels=args.z_channels, ch=args.ch, ch_mult=tuple(args.ch_mult),
                      num_res_blocks=args.num_res_blocks, using_sa=False, using_mid_sa=True,
                      patch_nums=tuple(args.patch_nums), norm_groups=args.norm_groups)


def train(args) -> MSVQModel:
    ckpt_path = args.out / "ckpt.pt"
    config = config_from_args(args)
    torch.manual_seed(args.seed)
    model = MSVQModel(config)
    torch.nn.init.uniform_(model.quantize.embedding.weight, -0.1, 0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step = 0
    ckpt = read_checkpoint(ckpt_path)
    if ckpt is not None:
        step = restore(ckpt, model, opt, ckpt_path)
    logger.info("config %s, %.3f M parameters", model.config, sum(p.numel() for p in model.parameters()) / 1e6)
    if step >= args.steps:
        return model.eval()
    lr_at = partial(cosine_lr, lr=args.lr, warmup=args.warmup, steps=args.steps)
    images, _ = load_fashion_mnist("train", args.data_root)
    gen = torch.Generator().manual_seed(args.seed + 1)
    model.train()
    window, used, t0 = [], torch.zeros(model.vocab_size, dtype=torch.bool), time.perf_counter()
    bar = progress(desc="train MSVQ", total=args.steps, initial=step, unit="step")
    while step < args.steps:
        x = to_model_images(images[batch_indices(len(images), args.batch_size, args.seed, step)], args.size)
        set_lr(opt, lr_at(step))
        recon, vq_loss, idx = model.training_forward(x, beta=args.beta)
        mse = F.mse_loss(recon, x)
        l1 = (recon - x).abs().mean()
        loss = mse + args.l1_weight * l1 + vq_loss
        optimizer_step(opt, loss, model, 1.0)
        step += 1
        bar.update()
        window.append((mse.item(), vq_loss.item()))
        used[torch.cat(idx, 1).flatten()] = True
        if step % args.restart_every == 0:
            restarted = 0
            if step < 0.8 * args.steps:
                with torch.no_grad():
                    f = model.quant_conv(model.encoder(x))
                restarted = restart_dead_codes(model, used, f.permute(0, 2, 3, 1).reshape(-1, f.shape[1]), gen)
            mse_m = sum(w[0] for w in window) / len(window)
            vq_m = sum(w[1] for w in window) / len(window)
            logger.info("step %d/%d lr %.2e mse %.5f vq %.5f | codes used %d/%d, restarted %d | %.3f s/step",
                        step, args.steps, lr_at(step - 1), mse_m, vq_m, int(used.sum()), model.vocab_size, restarted,
                        (time.perf_counter() - t0) / len(window))
            window, used, t0 = [], torch.zeros_like(used), time.perf_counter()
        if step % args.ckpt_every == 0 or step == args.steps:
            save_checkpoint(ckpt_path, model, opt, step, asdict(model.config))
    bar.close()
    return model.eval()


def parse_args(argv=None):
    p = run_arguments(__doc__.split("\n\n")[0], steps=1200, batch_size=32, lr=1e-3, warmup=50,
                      ckpt_every=100, export_help="write the trained tokenizer here (.safetensors)")
    p.add_argument("--recon-png", type=Path, default=None, help="write 16 test images vs reconstructions here")
    p.add_argument("--beta", type=float, default=0.25, help="commitment weight (VAR default)")
    p.add_argument("--l1-weight", type=float, default=0.2)
    p.add_argument("--restart-every", type=int, default=50, help="restart codes unused for this many steps")
    p.add_argument("--size", type=int, default=64, help="training resolution (pixels per side)")
    p.add_argument("--eval-limit", type=int, default=0, help="evaluate on the first N test images (0 = all)")
    g = p.add_argument_group("tokenizer size (MSVQConfig)")
    g.add_argument("--vocab-size", type=int, default=512)
    g.add_argument("--z-channels", type=int, default=16)
    g.add_argument("--ch", type=int, default=16)
    g.add_argument("--ch-mult", type=int, nargs="+", default=[1, 2, 2])
    g.add_argument("--num-res-blocks", type=int, default=1)
    g.add_argument("--norm-groups", type=int, default=8)
    g.add_argument("--patch-nums", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 8, 10, 13, 16])
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    command = start_run(args.out, args.threads, "mmaccel.image.train.train_msvq", argv)
    model = train(args)
    if args.export is not None:
        save_msvq(model, args.export)
        reloaded = load_msvq(args.export)
        x = to_model_images(load_fashion_mnist("test", args.data_root)[0][:8], args.size)
        same = all(torch.equal(a, b) for a, b in zip(reloaded.encode(x), model.encode(x)))
        logger.info("exported %s (%.2f MB); reloaded codes identical: %s", args.export,
                    args.export.stat().st_size / 1e6, same)
    test, _ = load_fashion_mnist("test", args.data_root)
    result = evaluate(model, test[:args.eval_limit] if args.eval_limit else test, size=args.size)
    result.update(command=command, steps=args.steps, seed=args.seed, config=asdict(model.config))
    (args.out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    logger.info("test split (%d images): MSE %.5f, PSNR %.2f dB, codes used %d/%d, perplexity %.1f", result["images"],
                result["mse_01"], result["psnr_db"], result["codes_used"], result["vocab_size"], result["code_perplexity"])
    if args.recon_png is not None:
        logger.info("wrote %s", save_recon_grid(model, test[:16], args.recon_png, size=args.size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
