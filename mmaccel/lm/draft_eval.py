"""Stage 4 of `python -m mmaccel.lm.train_draft`: how well a SmolLM2 draft serves its target.

Greedy speculative decoding with k draft tokens per verify step (acceptance per depth and against the
target's own greedy answers), teacher-forced top-1 agreement, and B=1 forward latencies.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path

import torch

from mmaccel.lm.smollm2 import load_prompt_set, load_smollm2_draft, render_prompt, truncated_draft

logger = logging.getLogger("mmaccel.lm.train_draft")      # the trainer's log: train.log records this stage too


@torch.inference_mode()
def greedy_speculative(target, draft, prompt: list[int], *, k: int, max_new_tokens: int, eos: int):
    """Greedy speculative decoding (Leviathan et al. 2023 with argmax verification), B=1.

    Each verify step the draft proposes k tokens greedily; the target scores [last, d_0..d_{k-1}]
    in one forward; the longest prefix with d_j == argmax_target_j is accepted plus the target's
    own token after it. Returns the generated tokens and, per verify step, the k match flags
    (d_j == target argmax at j, given the draft's own prefix) and the accepted length.
    """
    from transformers import DynamicCache

    t_cache, d_cache = DynamicCache(), DynamicCache()
    x = torch.tensor([prompt])
    first = target(x, past_key_values=t_cache, use_cache=True).logits[0, -1].argmax().item()
    ctx = list(prompt) + [first]  # target cache holds ctx[:-1]
    d_len = 0  # draft cache holds ctx[:d_len]
    matches, accepted = [], []
    while len(ctx) - len(prompt) < max_new_tokens and ctx[-1] != eos:
        logits = draft(torch.tensor([ctx[d_len:]]), past_key_values=d_cache, use_cache=True).logits[0, -1]
        d_len = len(ctx)
        proposal = [logits.argmax().item()]
        for _ in range(k - 1):
            logits = draft(torch.tensor([proposal[-1:]]), past_key_values=d_cache, use_cache=True).logits[0, -1]
            proposal.append(logits.argmax().item())
        verify = target(torch.tensor([[ctx[-1]] + proposal]), past_key_values=t_cache, use_cache=True).logits[0]
        choice = verify.argmax(-1).tolist()  # [k+1]: target's token after each draft prefix
        flags = [proposal[j] == choice[j] for j in range(k)]
        n = flags.index(False) if False in flags else k
        matches.append(flags)
        accepted.append(n)
        t_cache.crop(-(k - n))  # keep ctx[-1] and the n accepted drafts
        d_cache.crop(-(k - 1 - min(n, k - 1)))  # the draft cached d_0..d_{k-2}
        d_len += min(n, k - 1)
        ctx += proposal[:n] + [choice[n]]
    new = ctx[len(prompt) :]
    if eos in new:
        new = new[: new.index(eos) + 1]
    return new[:max_new_tokens], matches, accepted


def acceptance_report(target, draft, tokenizer, prompts: list[str], *, k: int, max_new_tokens: int, reference=None):
    """Greedy acceptance of `draft` for `target` on `prompts` (see module docstring)."""
    eos = tokenizer.eos_token_id
    all_flags, all_acc, lossless = [], [], 0
    first_pos = []
    outputs = []
    for i, p in enumerate(prompts):
        ids = render_prompt(tokenizer, p)
        new, flags, acc = greedy_speculative(target, draft, ids, k=k, max_new_tokens=max_new_tokens, eos=eos)
        outputs.append(new)
        if reference is not None:
            lossless += int(new == reference[i])
        all_flags += [f for fl in flags for f in fl]
        first_pos += [fl[0] for fl in flags]
        all_acc += acc
    alpha = sum(first_pos) / len(first_pos)
    depth = [
        sum(1 for a in all_acc if a > j) / max(1, sum(1 for a in all_acc if a >= j)) for j in range(k)
    ]  # P(accept d_j | d_0..d_{j-1} accepted)
    report = {
        "prompts": len(prompts),
        "k": k,
        "verify_steps": len(all_acc),
        "position_agreement": sum(all_flags) / len(all_flags),
        "first_position_acceptance": alpha,
        "conditional_acceptance_by_depth": depth,
        "mean_accepted_drafts": statistics.fmean(all_acc),
        "mean_tokens_per_verify_step": statistics.fmean(a + 1 for a in all_acc),
        "iid_prediction_tokens_per_step": (1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1,
        "accepted_length_histogram": [all_acc.count(j) for j in range(k + 1)],
    }
    if reference is not None:
        report["identical_to_target_greedy"] = f"{lossless}/{len(prompts)}"
    return report, outputs


@torch.inference_mode()
def forward_latency_ms(models: dict, prefix: int = 128, widths=(1, 5), reps: int = 15) -> dict:
    """Median B=1 decode-step latency after a `prefix`-token context, models and widths interleaved."""
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(100, 40000, (1, prefix), generator=g)
    caches = {}
    for name, m in models.items():
        caches[name] = DynamicCache()
        m(ctx, past_key_values=caches[name], use_cache=True)
    times = {(n, w): [] for n in models for w in widths}
    for r in range(reps + 3):
        for name, m in models.items():
            for w in widths:
                x = torch.randint(100, 40000, (1, w), generator=g)
                t = time.perf_counter()
                m(x, past_key_values=caches[name], use_cache=True)
                dt = time.perf_counter() - t
                caches[name].crop(-w)
                if r >= 3:
                    times[(name, w)].append(dt)
    return {f"{n} T={w}": round(statistics.median(v) * 1e3, 2) for (n, w), v in times.items()}


@torch.inference_mode()
def teacher_forced_agreement(target, draft, prompts: list[list[int]], answers: list[list[int]]) -> float:
    """Fraction of answer positions where argmax draft == argmax target, both given the target's
    own greedy answer as prefix: the first-position acceptance rate alpha, from one forward each."""
    hits = total = 0
    for prompt, answer in zip(prompts, answers):
        ids = torch.tensor([prompt + answer])
        span = slice(len(prompt) - 1, len(prompt) - 1 + len(answer))
        t = target(ids).logits[0, span].argmax(-1)
        d = draft(ids).logits[0, span].argmax(-1)
        hits += (t == d).sum().item()
        total += len(answer)
    return hits / total


def evaluate(target, tokenizer, out: Path, weights: Path, args) -> dict:
    core = load_prompt_set("core")
    prompts = [p["prompt"] for p in core[::3]]  # 16 held-out prompts from all 6 categories
    rendered = [render_prompt(tokenizer, p) for p in prompts]
    t0 = time.perf_counter()
    reference = []
    with torch.inference_mode():
        for ids in rendered:
            o = target.generate(torch.tensor([ids]), max_new_tokens=args.eval_tokens, do_sample=False)
            reference.append(o[0, len(ids) :].tolist())
    logger.info("target greedy reference for %d prompts in %.1f s", len(prompts), time.perf_counter() - t0)
    results = {
        "eval_prompts": "assets/prompts/core.jsonl, every 3rd line (16 prompts, all categories)",
        "max_new_tokens": args.eval_tokens,
        "answer_tokens": sum(map(len, reference)),
    }
    drafts = {f"truncated_{n}_layers": truncated_draft(target, n) for n in range(1, 5)}
    drafts["distilled"] = load_smollm2_draft(target, weights)
    results["teacher_forced_agreement"] = {
        name: round(teacher_forced_agreement(target, d, rendered, reference), 4) for name, d in drafts.items()
    }
    logger.info("teacher-forced top-1 agreement: %s", json.dumps(results["teacher_forced_agreement"]))
    for name in (f"truncated_{args.layers}_layers", "distilled"):
        t0 = time.perf_counter()
        rep, _ = acceptance_report(
            target, drafts[name], tokenizer, prompts, k=args.k, max_new_tokens=args.eval_tokens, reference=reference
        )
        results[f"speculative_{name}"] = rep
        logger.info("greedy speculative, %s (%.0f s): %s", name, time.perf_counter() - t0, json.dumps(rep))
    models = {"target": target, "distilled": drafts["distilled"]}
    models.update({f"truncated_{n}": drafts[f"truncated_{n}_layers"] for n in (1, 3, 4)})
    results["latency_ms_b1"] = forward_latency_ms(models)
    logger.info("latency (ms, B=1, 128-token context): %s", json.dumps(results["latency_ms_b1"]))
    results["draft_file_mb"] = round(weights.stat().st_size / 1e6, 2)
    (out / "eval.json").write_text(json.dumps(results, indent=2) + "\n")
    return results
