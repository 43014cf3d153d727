"""SJD2's fine-tune: teach the image GPT next-clean-token prediction from noise-perturbed embeddings.

    python -m mmaccel.image.train.train_sjd2 --out runs/gpt_sjd2 --steps 1500 --threads 2 \
        --export mmaccel/assets/fashion_gpt_sjd2.safetensors

SJD2 (Teng et al., NeurIPS 2025) starts the Jacobi window from Gaussian noise in embedding space and
denoises it while decoding, so the model must read noisy inputs. Each training row keeps a clean prefix
of random length s; the next `w` inputs (1 <= w <= --window) are perturbed as
x = (1 - t) e + t sigma eps (`mmaccel.image.sjd2.noisy_embeddings`, sigma the spread of the embedding
table) with levels t rising along the window (sorted uniform draws), and every later input is pure noise
(t = 1). The target at every position stays the next *clean* token; scored are the outputs up to two
past the window (the decoder reads predictions behind pure noise too), not the rest. A fraction --clean
of the rows stays fully clean (plain next-token loss), so the fine-tuned model remains a good AR model:
its own AR quality is what SJD2 reproduces losslessly, and the benchmark reports it.

Starts from the shipped GPT (--init) and its tokenised Fashion-MNIST train split; label dropout as in
the original training. Resumable (`<out>/ckpt.pt`); held-out losses (clean AR loss and the loss behind
a noisy window) before and after go to `<out>/eval.json`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from mmaccel.image.models.gpt import LlamaGenGPT, load_gpt, save_gpt
from mmaccel.image.sjd2 import embedding_scale, noisy_embeddings
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
from mmaccel.image.train.train_gpt import DEFAULT_VQ, held_out_loss, load_tokens
from mmaccel.paths import assets_dir
from mmaccel.progress import progress

logger = logging.getLogger("mmaccel.image.train.train_sjd2")


def noise_levels(batch: int, length: int, window: int, clean: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(levels t [B, L] per input position, scored [B, L + 1] which outputs count in the loss).

    Row b: inputs before s_b clean, w_b rising noisy levels, then pure noise; outputs up to the one
    after the window are scored. A fraction `clean` of the rows has no window (all clean, all scored)."""
    s = torch.randint(0, length, (batch,), generator=generator)
    w = torch.randint(1, window + 1, (batch,), generator=generator)
    rising = torch.rand(batch, window, generator=generator).sort(dim=1).values
    pos = torch.arange(length)[None, :]
    offset = pos - s[:, None]                                        # index inside the window
    inside = (offset >= 0) & (offset < w[:, None])
    levels = torch.where(offset < 0, 0.0, 1.0)
    levels = torch.where(inside, rising.gather(1, offset.clamp(0, window - 1)), levels)
    whole = torch.rand(batch, generator=generator) < clean
    levels[whole] = 0.0
    out_pos = torch.arange(length + 1)[None, :]                      # output j predicts token j
    scored = (out_pos <= (s + w + 2)[:, None]) | whole[:, None]      # and two outputs behind pure noise
    return levels, scored


def sjd2_loss(model: LlamaGenGPT, labels: Tensor, tokens: Tensor, levels: Tensor, scored: Tensor,
              generator: torch.Generator) -> Tensor:
    """Next-clean-token cross-entropy [scored outputs] with the inputs tokens[:, :-1] perturbed at `levels`."""
    inputs = tokens[:, :-1]
    clean = model.tok_embeddings(inputs)
    eps = torch.randn(clean.shape, generator=generator)
    x = noisy_embeddings(clean, levels[:, : inputs.shape[1], None], eps, embedding_scale(model))
    logits = model(labels, inputs, embeds=x)                         # [B, N, V]: row j predicts token j
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1), reduction="none")
    mask = scored[:, : tokens.shape[1]].reshape(-1).float()
    return (ce * mask).sum() / mask.sum()


@torch.no_grad()
def held_out_window_loss(model: LlamaGenGPT, tokens: Tensor, labels: Tensor, window: int, seed: int = 0,
                         batch_size: int = 250) -> float:
    """The scored next-clean-token loss behind random noisy windows (no clean rows), seeded."""
    model.eval()
    g = torch.Generator().manual_seed(seed)
    total = 0.0
    for start in range(0, len(tokens), batch_size):
        x = tokens[start:start + batch_size].long()
        levels, scored = noise_levels(len(x), x.shape[1] - 1, window, 0.0, g)
        total += sjd2_loss(model, labels[start:start + batch_size], x, levels, scored, g).item() * len(x)
    return total / len(tokens)


def evaluate(model: LlamaGenGPT, tokens: Tensor, labels: Tensor, window: int) -> dict:
    return {"clean_loss": round(held_out_loss(model, tokens, labels), 4),
            "window_loss": round(held_out_window_loss(model, tokens, labels, window), 4)}


def main(argv=None) -> int:
    p = run_arguments(__doc__.split("\n\n")[0], steps=1500, batch_size=32, lr=3e-4, warmup=50, ckpt_every=100,
                      export_help="write the fine-tuned GPT here (.safetensors, fp16)")
    p.add_argument("--init", type=Path, default=assets_dir() / "fashion_gpt.safetensors", help="the GPT to fine-tune")
    p.add_argument("--vq", type=Path, default=DEFAULT_VQ, help="tokenizer that encodes the training images")
    p.add_argument("--window", type=int, default=16, help="longest noisy window")
    p.add_argument("--clean", type=float, default=0.5, help="fraction of rows trained fully clean")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--eval-images", type=int, default=2000)
    args = p.parse_args(argv)
    if args.window < 1 or not 0 <= args.clean <= 1:
        p.error("--window must be >= 1 and --clean in [0, 1]")
    command = start_run(args.out, args.threads, "mmaccel.image.train.train_sjd2", argv)
    model = load_gpt(args.init, dtype=torch.float32)
    tokens, labels = load_tokens("train", args.out.parent / "tokens_train.pt", args.vq, args.data_root)
    test_tokens, test_labels = load_tokens("test", args.out.parent / "tokens_test.pt", args.vq, args.data_root)
    test_tokens, test_labels = test_tokens[:args.eval_images], test_labels[:args.eval_images]
    before = evaluate(model, test_tokens, test_labels, args.window)
    logger.info("held-out before: %s", before)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    ckpt_path, step = args.out / "ckpt.pt", 0
    ckpt = read_checkpoint(ckpt_path)
    if ckpt is not None:
        step = restore(ckpt, model, opt, ckpt_path)
    lr_at = partial(cosine_lr, lr=args.lr, warmup=args.warmup, steps=args.steps)
    model.train()
    window, t0 = [], time.perf_counter()
    bar = progress(desc="SJD2 fine-tune", total=args.steps, initial=step, unit="step")
    while step < args.steps:
        idx = batch_indices(len(tokens), args.batch_size, args.seed, step)
        g = torch.Generator().manual_seed(args.seed * 7919 + step)
        x = tokens[idx].long()
        levels, scored = noise_levels(len(x), x.shape[1] - 1, args.window, args.clean, g)
        set_lr(opt, lr_at(step))
        loss = sjd2_loss(model, labels[idx], x, levels, scored, g)
        optimizer_step(opt, loss, model, 1.0)
        step += 1
        bar.update()
        window.append(loss.item())
        if step % args.log_every == 0 or step == args.steps:
            logger.info("step %d/%d loss %.4f | %.3f s/step", step, args.steps, sum(window) / len(window),
                        (time.perf_counter() - t0) / len(window))
            window, t0 = [], time.perf_counter()
        if step % args.ckpt_every == 0 or step == args.steps:
            save_checkpoint(ckpt_path, model, opt, step, {"window": args.window, "clean": args.clean})
    bar.close()
    model.eval()
    after = evaluate(model, test_tokens, test_labels, args.window)
    logger.info("held-out after: %s", after)
    (args.out / "eval.json").write_text(json.dumps({"before": before, "after": after, "steps": args.steps,
                                                    "window": args.window, "clean": args.clean,
                                                    "command": command}, indent=2) + "\n")
    if args.export is not None:
        save_gpt(model, args.export, metadata={"command": command, "held_out_loss": f"{after['clean_loss']:.4f}"},
                 dtype=torch.float16)
        logger.info("exported %s", args.export)
    return 0


if __name__ == "__main__":
    sys.exit(main())
