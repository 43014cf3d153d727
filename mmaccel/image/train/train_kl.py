"""Train the small KL tokenizer of the continuous-token models (`mmaccel/assets/fashion_kl.safetensors`).

    python -m mmaccel.image.train.train_kl --out runs/kl --export mmaccel/assets/fashion_kl.safetensors

Data: Fashion-MNIST train split at 32x32 (`to_model_images`); three levels halve the side twice, so an
image is an 8x8 grid of 4-channel continuous tokens (64 tokens, MAR's raster order).
Loss: MSE + `--l1-weight` * L1 reconstruction + `--kl-weight` * KL(posterior || N(0, I)) (summed over
a latent, averaged over the batch); the decoder sees posterior samples. After training, the token
scale is set so the posterior means have unit standard deviation over `--scale-images` training
images (MAR's 0.2325 for KL-16, computed the same way).

Resumable: `<out>/ckpt.pt` every `--ckpt-every` steps; the test-split evaluation goes to `<out>/eval.json`.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from dataclasses import asdict, replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from mmaccel.image.data import load_fashion_mnist, to_model_images
from mmaccel.image.tokenizers.kl import KLConfig, KLTokenizer, load_kl, save_kl
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
from mmaccel.progress import progress

logger = logging.getLogger("mmaccel.image.train.train_kl")


@torch.no_grad()
def token_scale(model: KLTokenizer, images: Tensor, batch_size: int = 500) -> float:
    """1 / std of the unscaled posterior means of uint8 `images`."""
    size = model.config.image_size
    means = torch.cat([model.posterior(to_model_images(images[i:i + batch_size], size)).mean
                       for i in range(0, len(images), batch_size)])
    return float(1.0 / means.std())


@torch.no_grad()
def evaluate(model: KLTokenizer, images: Tensor, batch_size: int = 500) -> dict:
    """Reconstruction (posterior mean -> decoder) of uint8 `images`: MSE/PSNR on pixels in [0, 1]."""
    model.eval()
    sq_err, n_px = 0.0, 0
    for start in range(0, len(images), batch_size):
        x = to_model_images(images[start:start + batch_size], model.config.image_size)
        recon = model.decode(model.encode(x)).clamp(-1, 1)
        sq_err += ((recon - x) / 2).pow(2).sum().item()
        n_px += x.numel()
    mse = sq_err / n_px
    return {"images": len(images), "mse_01": mse, "psnr_db": 10 * math.log10(1.0 / mse)}


def train(args) -> KLTokenizer:
    ckpt_path = args.out / "ckpt.pt"
    config = KLConfig(channels=tuple(args.channels), latent_channels=args.latent_channels,
                      layers_per_block=args.layers_per_block, norm_groups=args.norm_groups, image_size=args.size)
    torch.manual_seed(args.seed)
    model = KLTokenizer(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step = 0
    ckpt = read_checkpoint(ckpt_path)
    if ckpt is not None:
        step = restore(ckpt, model, opt, ckpt_path)
    logger.info("config %s, %.3f M parameters", config, sum(p.numel() for p in model.parameters()) / 1e6)
    images, _ = load_fashion_mnist("train", args.data_root)
    if step < args.steps:
        lr_at = partial(cosine_lr, lr=args.lr, warmup=args.warmup, steps=args.steps)
        gen = torch.Generator().manual_seed(args.seed + 1)
        model.train()
        window, t0 = [], time.perf_counter()
        bar = progress(desc="train KL", total=args.steps, initial=step, unit="step")
        while step < args.steps:
            x = to_model_images(images[batch_indices(len(images), args.batch_size, args.seed, step)], args.size)
            set_lr(opt, lr_at(step))
            dist = model.posterior(x)
            recon = model.vae.decode(dist.sample(gen)).sample
            mse, l1, kl = F.mse_loss(recon, x), (recon - x).abs().mean(), dist.kl().mean()
            optimizer_step(opt, mse + args.l1_weight * l1 + args.kl_weight * kl, model, 1.0)
            step += 1
            bar.update()
            window.append((mse.item(), kl.item()))
            if step % args.log_every == 0:
                logger.info("step %d/%d lr %.2e mse %.5f kl %.1f | %.3f s/step", step, args.steps, lr_at(step - 1),
                            sum(w[0] for w in window) / len(window), sum(w[1] for w in window) / len(window),
                            (time.perf_counter() - t0) / len(window))
                window, t0 = [], time.perf_counter()
            if step % args.ckpt_every == 0 or step == args.steps:
                save_checkpoint(ckpt_path, model, opt, step, asdict(config))
        bar.close()
    model.eval()
    model.config = replace(config, scale=token_scale(model, images[:args.scale_images]))
    logger.info("token scale %.4f (unit-variance posterior means over %d training images)", model.config.scale,
                args.scale_images)
    return model


def parse_args(argv=None):
    p = run_arguments(__doc__.split("\n\n")[0], steps=2000, batch_size=32, lr=1e-3, warmup=50,
                      ckpt_every=100, export_help="write the trained tokenizer here (.safetensors)")
    p.add_argument("--kl-weight", type=float, default=1e-5)
    p.add_argument("--l1-weight", type=float, default=0.2)
    p.add_argument("--size", type=int, default=32, help="training resolution (pixels per side)")
    p.add_argument("--scale-images", type=int, default=5000, help="training images that set the token scale")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--eval-limit", type=int, default=0, help="evaluate on the first N test images (0 = all)")
    g = p.add_argument_group("tokenizer size (KLConfig)")
    g.add_argument("--channels", type=int, nargs="+", default=[16, 32, 64])
    g.add_argument("--latent-channels", type=int, default=4)
    g.add_argument("--layers-per-block", type=int, default=1)
    g.add_argument("--norm-groups", type=int, default=8)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    command = start_run(args.out, args.threads, "mmaccel.image.train.train_kl", argv)
    model = train(args)
    if args.export is not None:
        save_kl(model, args.export)
        reloaded = load_kl(args.export)
        x = to_model_images(load_fashion_mnist("test", args.data_root)[0][:8], args.size)
        logger.info("exported %s (%.2f MB); reloaded tokens identical: %s", args.export,
                    args.export.stat().st_size / 1e6, torch.equal(reloaded.encode(x), model.encode(x)))
    test, _ = load_fashion_mnist("test", args.data_root)
    result = evaluate(model, test[:args.eval_limit] if args.eval_limit else test)
    result.update(command=command, steps=args.steps, seed=args.seed, config=asdict(model.config))
    (args.out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    logger.info("test split (%d images): MSE %.5f, PSNR %.2f dB", result["images"], result["mse_01"], result["psnr_db"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
