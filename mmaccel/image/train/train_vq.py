"""Train the small LlamaGen-layout VQ tokenizer shipped as `mmaccel/assets/fashion_vq.safetensors`.

    python -m mmaccel.image.train.train_vq --out runs/vq --export mmaccel/assets/fashion_vq.safetensors

Data: Fashion-MNIST train split (Debian `dataset-fashion-mnist`), 28x28 grey upsampled bilinearly to
64x64 RGB in [-1, 1] (`mmaccel.image.data.to_model_images`); with downsample 4 an image is a 16x16
token grid. Loss: LlamaGen's VQ loss without the perceptual and GAN terms (Sun et al. 2024, §2.1;
VQGAN, Esser et al. 2021, eq. 4): MSE + `--l1-weight` * L1 reconstruction, codebook loss
|sg[z] - zq|^2 and commitment `--beta` * |z - sg[zq]|^2 on l2-normalised latents, straight-through
gradients to the encoder.

Resumable: `<out>/ckpt.pt` is written every `--ckpt-every` steps and at the end; rerunning the same
command continues from it (the batch of step s depends only on `--seed` and s). Logs go to
`<out>/train.log`; the test-split evaluation (reconstruction MSE/PSNR, codebook usage) to
`<out>/eval.json`.
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
from mmaccel.image.tokenizers.vq import VQConfig, VQModel, load_vq, save_vq
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

logger = logging.getLogger("mmaccel.image.train.train_vq")


def vq_losses(model: VQModel, x: Tensor, *, beta: float, l1_weight: float) -> tuple[Tensor, dict[str, float], Tensor]:
    """One training forward. x: [B, 3, H, W] in [-1, 1] -> (total loss, parts, code indices [B, h, w])."""
    z = model.quant_conv(model.encoder(x))  # [B, D, h, w]
    zq, indices = model.quantize(z)  # zq is a (normalised) codebook row, differentiable w.r.t. the codebook
    if model.quantize.l2_norm:
        z = F.normalize(z, dim=1)
    codebook_loss = F.mse_loss(zq, z.detach())
    commit_loss = F.mse_loss(z, zq.detach())
    zq_st = z + (zq - z).detach()  # straight-through estimator
    recon = model.decode_code_vectors(zq_st)
    mse = F.mse_loss(recon, x)
    l1 = (recon - x).abs().mean()
    loss = mse + l1_weight * l1 + codebook_loss + beta * commit_loss
    parts = {"mse": mse.item(), "l1": l1.item(), "codebook": codebook_loss.item(), "commit": commit_loss.item()}
    return loss, parts, indices


@torch.no_grad()
def evaluate(model: VQModel, images: Tensor, *, size: int, batch_size: int = 250) -> dict:
    """Reconstruct uint8 `images` [N, 28, 28] through encode -> decode (the inference path).

    MSE and PSNR are on pixels scaled to [0, 1] (the reconstruction clamped to that range); PSNR is
    10 log10(1 / MSE) over the whole set. Codebook usage = distinct codes used / codebook size."""
    model.eval()
    sq_err, n_px, counts = 0.0, 0, torch.zeros(model.codebook_size, dtype=torch.long)
    for start in range(0, len(images), batch_size):
        x = to_model_images(images[start:start + batch_size], size)
        idx = model.encode(x)
        recon = model.decode(idx).clamp(-1, 1)
        sq_err += ((recon - x) / 2).pow(2).sum().item()
        n_px += x.numel()
        counts += torch.bincount(idx.flatten(), minlength=model.codebook_size)
    mse = sq_err / n_px
    p = counts.float() / counts.sum()
    nz = p[p > 0]
    return {
        "images": len(images),
        "mse_01": mse,
        "psnr_db": 10 * math.log10(1.0 / mse),
        "codes_used": int((counts > 0).sum()),
        "codebook_size": model.codebook_size,
        "codebook_usage": float((counts > 0).float().mean()),
        "code_perplexity": float(torch.exp(-(nz * nz.log()).sum())),
    }


@torch.no_grad()
def save_recon_grid(model: VQModel, images: Tensor, path: Path, *, size: int) -> Path:
    """PNG: top row = `images` (uint8 [n, 28, 28]) at model resolution, bottom row = their reconstructions."""
    import matplotlib.image

    model.eval()
    x = to_model_images(images, size)
    recon = model.decode(model.encode(x)).clamp(-1, 1)
    rows = [torch.cat(list(t[:, 0]), dim=1) for t in (x, recon)]  # grey channel, [size, n*size]
    grid = ((torch.cat(rows, dim=0) + 1) * 127.5).round().to(torch.uint8).numpy()
    path.parent.mkdir(parents=True, exist_ok=True)
    matplotlib.image.imsave(path, grid, cmap="gray", vmin=0, vmax=255)
    return path


def config_from_args(args) -> VQConfig:
    return VQConfig(codebook_size=args.codebook_size, codebook_embed_dim=args.codebook_dim, ch=args.ch,
                    ch_mult=tuple(args.ch_mult), num_res_blocks=args.num_res_blocks, z_channels=args.z_channels,
                    norm_groups=args.norm_groups)


def train(args) -> VQModel:
    out: Path = args.out
    ckpt_path = out / "ckpt.pt"
    config = config_from_args(args)
    torch.manual_seed(args.seed)
    model = VQModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step = 0
    ckpt = read_checkpoint(ckpt_path)
    if ckpt is not None:
        if ckpt["config"] != asdict(config):
            logger.warning("checkpoint config %s differs from the arguments; using the checkpoint's", ckpt["config"])
            model = VQModel(VQConfig(**ckpt["config"]))
            opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
        step = restore(ckpt, model, opt, ckpt_path)
    logger.info("config %s, %.3f M parameters", model.config, sum(p.numel() for p in model.parameters()) / 1e6)
    lr_at = partial(cosine_lr, lr=args.lr, warmup=args.warmup, steps=args.steps)

    if step >= args.steps:
        logger.info("already trained for %d steps (>= --steps %d)", step, args.steps)
        return model.eval()
    images, _ = load_fashion_mnist("train", args.data_root)
    if args.train_limit:
        images = images[:args.train_limit]
    logger.info("training on %d Fashion-MNIST images at %dx%d, batch %d, steps %d -> %d",
                len(images), args.size, args.size, args.batch_size, step, args.steps)
    model.train()
    window, used, t0 = [], torch.zeros(model.codebook_size, dtype=torch.bool), time.perf_counter()
    bar = progress(desc="train VQ", total=args.steps, initial=step, unit="step")
    while step < args.steps:
        x = to_model_images(images[batch_indices(len(images), args.batch_size, args.seed, step)], args.size)
        set_lr(opt, lr_at(step))
        loss, parts, idx = vq_losses(model, x, beta=args.beta, l1_weight=args.l1_weight)
        optimizer_step(opt, loss, model, 1.0)
        step += 1
        bar.update()
        window.append(parts)
        used[idx.flatten()] = True
        if step % args.log_every == 0 or step == args.steps:
            mean = {k: sum(p[k] for p in window) / len(window) for k in window[0]}
            logger.info("step %d/%d lr %.2e mse %.5f l1 %.4f codebook %.4f commit %.4f | codes used %d/%d | %.3f s/step",
                        step, args.steps, lr_at(step - 1), mean["mse"], mean["l1"], mean["codebook"], mean["commit"],
                        int(used.sum()), model.codebook_size, (time.perf_counter() - t0) / len(window))
            window, used, t0 = [], torch.zeros_like(used), time.perf_counter()
        if step % args.ckpt_every == 0 or step == args.steps:
            save_checkpoint(ckpt_path, model, opt, step, asdict(model.config))
    bar.close()
    return model.eval()


def parse_args(argv=None):
    p = run_arguments(__doc__.split("\n\n")[0], steps=900, batch_size=32, lr=1e-3, warmup=50,
                      ckpt_every=100, export_help="write the trained tokenizer here (.safetensors)")
    p.add_argument("--recon-png", type=Path, default=None, help="write 16 test images vs reconstructions here")
    p.add_argument("--beta", type=float, default=0.25, help="commitment weight (LlamaGen default)")
    p.add_argument("--l1-weight", type=float, default=0.2)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--size", type=int, default=64, help="training resolution (pixels per side)")
    p.add_argument("--train-limit", type=int, default=0, help="use only the first N training images (0 = all)")
    p.add_argument("--eval-limit", type=int, default=0, help="evaluate on the first N test images (0 = all)")
    p.add_argument("--no-eval", action="store_true")
    g = p.add_argument_group("tokenizer size (LlamaGen VQConfig)")
    g.add_argument("--codebook-size", type=int, default=1024)
    g.add_argument("--codebook-dim", type=int, default=8)
    g.add_argument("--ch", type=int, default=16)
    g.add_argument("--ch-mult", type=int, nargs="+", default=[1, 2, 2])
    g.add_argument("--num-res-blocks", type=int, default=1)
    g.add_argument("--z-channels", type=int, default=32)
    g.add_argument("--norm-groups", type=int, default=8)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    command = start_run(args.out, args.threads, "mmaccel.image.train.train_vq", argv)
    t_start = time.perf_counter()
    model = train(args)
    logger.info("training done in %.1f min this run", (time.perf_counter() - t_start) / 60)
    if args.export is not None:
        save_vq(model, args.export)
        reloaded = load_vq(args.export)
        x = to_model_images(load_fashion_mnist("test", args.data_root)[0][:8], args.size)
        same = torch.equal(reloaded.encode(x), model.encode(x))
        logger.info("exported %s (%.2f MB); reloaded codes identical: %s", args.export,
                    args.export.stat().st_size / 1e6, same)
    if not args.no_eval:
        test, _ = load_fashion_mnist("test", args.data_root)
        if args.eval_limit:
            test = test[:args.eval_limit]
        t0 = time.perf_counter()
        result = evaluate(model, test, size=args.size)
        result.update(command=command, steps=args.steps, seed=args.seed, config=asdict(model.config))
        (args.out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
        logger.info("test split (%d images, %.0f s): MSE %.5f, PSNR %.2f dB, codes used %d/%d (%.1f %%), perplexity %.1f",
                    result["images"], time.perf_counter() - t0, result["mse_01"], result["psnr_db"],
                    result["codes_used"], result["codebook_size"], 100 * result["codebook_usage"],
                    result["code_perplexity"])
    if args.recon_png is not None:
        test, _ = load_fashion_mnist("test", args.data_root)
        logger.info("wrote %s", save_recon_grid(model, test[:16], args.recon_png, size=args.size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
