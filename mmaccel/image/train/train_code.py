"""Specialise a small VAR as CoDe's refiner for hand-off scale N (the non-training-free CoDe mode).

    python -m mmaccel.image.train.train_code --out runs/code_refiner_n6 --draft-steps 6 \
        --teacher mmaccel/assets/fashion_var_large.safetensors --student mmaccel/assets/fashion_var_small.safetensors \
        --export mmaccel/assets/fashion_var_small_code6.safetensors

CoDe (Chen et al., CVPR 2025, §3.3 and Fig. 4) fine-tunes the refiner only on the scales it will draw,
N..K-1, with knowledge distillation from the large model: loss = KL(teacher || student) over those
scales' codes (temperature 1), mixed with the cross-entropy to the ground-truth codes by `--alpha`
(CoDe's 0.5). Inputs are the ground-truth pyramids of the Fashion-MNIST train split (teacher forcing,
as VAR trains), with the label dropout of the original training so guidance keeps working.
`--guidance CFG` (ours, a second stage on top of CoDe's recipe) also distils the CFG-combined
distribution at VAR's ramp, which is what sampling draws from; the labels are then not dropped, and
the null-class rows run beside them.
Resumable (`<out>/ckpt.pt`); the held-out loss of both models on scales N..K-1 goes to `<out>/eval.json`.
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

from mmaccel.image.models.var import VAR, load_var, save_var
from mmaccel.image.tokenizers.msvq import MSVQModel, load_msvq
from mmaccel.image.train.common import (
    batch_indices,
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
from mmaccel.image.train.train_var import DEFAULT_MSVQ, load_pyramids, split_scales
from mmaccel.progress import progress

logger = logging.getLogger("mmaccel.image.train.train_code")


def guided(logits: Tensor, ramp: Tensor) -> Tensor:
    """VAR's guided logits from a [cond | null] batch [2B, L, V] with the per-token guidance `ramp` [L]."""
    B, t = logits.shape[0] // 2, ramp[None, :, None]
    return (1 + t) * logits[:B] - t * logits[B:]


def scale_ramp(model: VAR, cfg: float) -> Tensor:
    """VAR's guidance per token [L]: cfg * k / (K - 1) on the tokens of scale k."""
    K, off = len(model.patch_nums), model.offsets
    return torch.cat([torch.full((off[k + 1] - off[k],), cfg * k / (K - 1)) for k in range(K)])


def kl_to(logp: Tensor, target: Tensor) -> Tensor:
    """KL(target || student) per token, averaged; both log-probabilities [..., V]."""
    return F.kl_div(logp.reshape(-1, logp.shape[-1]), target.reshape(-1, target.shape[-1]), log_target=True,
                    reduction="batchmean")


def refiner_loss(student: VAR, teacher: VAR, vq: MSVQModel, labels: Tensor, tokens: Tensor, draft_steps: int,
                 alpha: float, guidance: float = 0.0) -> tuple[Tensor, float, float]:
    """(alpha * CE + (1 - alpha) * KL(teacher || student), CE, KL) over the codes of scales draft_steps..K-1.

    With `guidance` > 0 the distillation term is the mean of the conditional KL and the KL between the
    two models' *guided* distributions at VAR's ramp for that guidance scale (what sampling draws from:
    guidance multiplies the student's errors in cond - uncond by up to 1 + 2 cfg); `labels` must then be
    undropped, and the batch is run with the null class beside it."""
    start = student.offsets[draft_steps]
    rows = labels if guidance <= 0 else torch.cat((labels, torch.full_like(labels, student.num_classes)))
    with torch.no_grad():
        inputs = vq.quantize.scale_inputs(split_scales(tokens, student.patch_nums))
        inputs = inputs.repeat(len(rows) // len(labels), 1, 1)
        target = teacher(rows, inputs)[:, start:].float()
    logits = student(rows, inputs)[:, start:]
    B = labels.shape[0]
    logp = logits[:B].log_softmax(-1)
    ce = F.nll_loss(logp.reshape(-1, logp.shape[-1]), tokens[:, start:].long().reshape(-1))
    kl = kl_to(logp, target[:B].log_softmax(-1))
    distill = kl
    if guidance > 0:
        ramp = scale_ramp(student, guidance)[start:].to(logits.device)
        distill = 0.5 * (kl + kl_to(guided(logits, ramp).log_softmax(-1), guided(target, ramp).log_softmax(-1)))
    return alpha * ce + (1 - alpha) * distill, ce.item(), kl.item()


@torch.no_grad()
def held_out(student: VAR, teacher: VAR, vq: MSVQModel, tokens: Tensor, labels: Tensor, draft_steps: int,
             guidance: float = 0.0, batch_size: int = 100) -> dict:
    """Cross-entropy on the refiner's scales of the student and of the teacher, the student's KL to the
    teacher and, with `guidance`, the KL between their guided distributions."""
    student.eval()
    totals = {"student_ce": 0.0, "teacher_ce": 0.0, "kl_to_teacher": 0.0}
    if guidance > 0:
        totals["guided_kl_to_teacher"] = 0.0
    start = student.offsets[draft_steps]
    ramp = scale_ramp(student, guidance)[start:]
    for s in range(0, len(tokens), batch_size):
        y, t = labels[s:s + batch_size], tokens[s:s + batch_size]
        rows = y if guidance <= 0 else torch.cat((y, torch.full_like(y, student.num_classes)))
        inputs = vq.quantize.scale_inputs(split_scales(t, student.patch_nums)).repeat(len(rows) // len(y), 1, 1)
        target = t[:, start:].long().reshape(-1)
        ls, lt = student(rows, inputs)[:, start:].float(), teacher(rows, inputs)[:, start:].float()
        n = B = len(y)
        cs, ct = ls[:B].log_softmax(-1), lt[:B].log_softmax(-1)
        totals["student_ce"] += F.nll_loss(cs.reshape(-1, cs.shape[-1]), target).item() * n
        totals["teacher_ce"] += F.nll_loss(ct.reshape(-1, ct.shape[-1]), target).item() * n
        totals["kl_to_teacher"] += kl_to(cs, ct).item() * n
        if guidance > 0:
            guided_kl = kl_to(guided(ls, ramp).log_softmax(-1), guided(lt, ramp).log_softmax(-1))
            totals["guided_kl_to_teacher"] += guided_kl.item() * n
    student.train()
    return {k: round(v / len(tokens), 4) for k, v in totals.items()}


def main(argv=None) -> int:
    p = run_arguments(__doc__.split("\n\n")[0], steps=400, batch_size=16, lr=3e-4, warmup=20,
                      ckpt_every=50, export_help="write the refiner here (.safetensors, fp16)")
    p.add_argument("--teacher", type=Path, required=True, help="the large VAR (CoDe's drafter)")
    p.add_argument("--student", type=Path, required=True, help="the small VAR to specialise (CoDe's refiner)")
    p.add_argument("--draft-steps", type=int, required=True, help="N: the refiner draws scales N..K-1")
    p.add_argument("--vq", type=Path, default=DEFAULT_MSVQ)
    p.add_argument("--alpha", type=float, default=0.5, help="weight of the ground-truth cross-entropy")
    p.add_argument("--class-dropout", type=float, default=0.1)
    p.add_argument("--guidance", type=float, default=0.0,
                   help="also distil the guided distribution at this CFG scale (VAR's ramp; 0 = CoDe's recipe)")
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--eval-images", type=int, default=1000)
    args = p.parse_args(argv)
    start_run(args.out, args.threads, "mmaccel.image.train.train_code", argv)
    vq, teacher, student = load_msvq(args.vq), load_var(args.teacher), load_var(args.student)
    teacher.requires_grad_(False)
    K = len(student.patch_nums)
    if not 1 <= args.draft_steps <= K - 1:
        p.error(f"--draft-steps must be in [1, {K - 1}]")
    if args.guidance < 0:
        p.error(f"--guidance must be >= 0, got {args.guidance}")
    tokens, labels = load_pyramids("train", args.out.parent / "msvq_tokens_train.pt", args.vq, args.data_root)
    test_tokens, test_labels = load_pyramids("test", args.out.parent / "msvq_tokens_test.pt", args.vq, args.data_root)
    test_tokens, test_labels = test_tokens[:args.eval_images], test_labels[:args.eval_images]
    before = held_out(student, teacher, vq, test_tokens, test_labels, args.draft_steps, args.guidance)
    logger.info("held-out before: %s", before)
    student.train()
    opt = torch.optim.AdamW(student.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    ckpt_path, step = args.out / "ckpt.pt", 0
    ckpt = read_checkpoint(ckpt_path)
    if ckpt is not None:
        step = restore(ckpt, student, opt, ckpt_path)
    lr_at = partial(cosine_lr, lr=args.lr, warmup=args.warmup, steps=args.steps)
    window, t0 = [], time.perf_counter()
    bar = progress(desc="train CoDe refiner", total=args.steps, initial=step, unit="step")
    while step < args.steps:
        idx = batch_indices(len(tokens), args.batch_size, args.seed, step)
        y = labels[idx] if args.guidance > 0 else dropped_labels(labels[idx], args.class_dropout, student.num_classes,
                                                                 args.seed, step)
        set_lr(opt, lr_at(step))
        loss, ce, kl = refiner_loss(student, teacher, vq, y, tokens[idx], args.draft_steps, args.alpha,
                                      args.guidance)
        optimizer_step(opt, loss, student, 2.0)
        step += 1
        bar.update()
        window.append((ce, kl))
        if step % args.log_every == 0 or step == args.steps:
            logger.info("step %d/%d ce %.4f kl %.4f | %.3f s/step", step, args.steps,
                        sum(w[0] for w in window) / len(window), sum(w[1] for w in window) / len(window),
                        (time.perf_counter() - t0) / len(window))
            window, t0 = [], time.perf_counter()
        if step % args.ckpt_every == 0 or step == args.steps:
            save_checkpoint(ckpt_path, student, opt, step, {"draft_steps": args.draft_steps})
    bar.close()
    after = held_out(student, teacher, vq, test_tokens, test_labels, args.draft_steps, args.guidance)
    logger.info("held-out after: %s", after)
    report = {"before": before, "after": after, "steps": args.steps, "draft_steps": args.draft_steps,
              "guidance": args.guidance}
    (args.out / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    if args.export is not None:
        save_var(student.eval(), args.export, dtype=torch.float16)
        logger.info("exported %s", args.export)
    return 0


if __name__ == "__main__":
    sys.exit(main())
