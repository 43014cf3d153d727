"""Train Medusa heads (Linear and Block) and early-exit heads for a Whisper decoder by self-distillation.

    python -m mmaccel.speech.train.heads --model builtin:base --out runs/whisper_base_heads

Stages (`--stages` picks some):
1. `data`: the self-labelled corpus of `mmaccel.speech.train.data` (the model's own greedy
   transcripts of the TTS corpus, with every position's final hidden state, layer outputs and the
   encoder states), under `<out>/data/` or `--data` (shared with the draft-decoder script).
2. `train`: the model stays frozen. Medusa head i learns to predict the token i + 2 places after
   each final hidden state; exit head k learns the model's own next token from layer k's output.
   Cross-entropy on the greedy transcript (hard self-distillation: greedy verification only needs
   the arg-max to agree), uniform over heads as in Whisper-Medusa, AdamW, cosine schedule. The
   softmax runs over the tokens that occur in the training transcripts: the shortlist the heads
   also draft from (`mmaccel.speech.heads`), ~10x cheaper than the full vocabulary. Writes
   `<out>/heads.safetensors` (fp16 on disk; what `ASRPipeline.from_pretrained(heads=...)` loads).
3. `block`: Medusa-Block heads (`mmaccel.speech.medusa_block`: one decoder layer over the final
   hidden states, cross-attending to the audio, then `--block-heads` heads) train the same way, per
   utterance, on the same shortlist, and join the heads file.
4. `eval`: teacher-forced top-1 agreement of every head (through its shortlist, as it drafts) on
   the held-out evaluation manifest.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from mmaccel.progress import progress
from mmaccel.speech.heads import WhisperHeads, load_heads, new_exit_heads, new_medusa_heads, save_heads
from mmaccel.speech.medusa_block import MedusaBlock, block_forward, new_medusa_block
from mmaccel.speech.pipeline import ASRPipeline
from mmaccel.speech.train.common import log, optimizer_step, shortlist_columns, warmup_cosine, write_eval
from mmaccel.speech.train.data import load_rows, start_run
from mmaccel.speech.train.draft import cross_cache, training_parameters, training_state

STAGES = ("data", "train", "block", "eval")
KEEP = ("tokens", "prompt_len", "final", "layers")   # the fields of the labelled rows the heads train on
BLOCK_KEEP = KEEP + ("encoder",)                     # the Medusa block also cross-attends to the audio


def targets(rows: list[dict], num_heads: int, exit_layers: list[int]):
    """Flatten rows into position tensors: final hidden [N, d], layer outputs {k: [N, d]},
    next tokens [N] and Medusa targets [N, K] (-100 past the end)."""
    finals, layer_h, nexts, ahead = [], {k: [] for k in exit_layers}, [], []
    for r in rows:
        seq, P = r["tokens"], r["prompt_len"]
        n = r["final"].shape[0]
        pos = torch.arange(P - 1, P - 1 + n)
        nexts.append(seq[pos + 1])
        idx = pos[:, None] + 2 + torch.arange(num_heads)[None, :]
        ahead.append(torch.where(idx < len(seq), seq[idx.clamp(max=len(seq) - 1)], torch.full_like(idx, -100)))
        finals.append(r["final"])
        for k in exit_layers:
            layer_h[k].append(r["layers"][k - 1])
    return (torch.cat(finals).float(), {k: torch.cat(v).float() for k, v in layer_h.items()},
            torch.cat(nexts), torch.cat(ahead))


def train(asr: ASRPipeline, rows: list[dict], args, out: Path) -> WhisperHeads:
    torch.manual_seed(args.seed)
    model = asr.model
    layers = list(range(1, len(model.decoder.layers)))
    final, layer_h, nxt, ahead = targets(rows, args.num_heads, layers)
    N = final.shape[0]
    vocab = torch.unique(torch.cat([nxt, ahead[ahead >= 0]]))                  # the shortlist
    heads = WhisperHeads(new_medusa_heads(model, args.num_heads, args.head_layers, vocab),
                         new_exit_heads(model, layers, vocab), vocab)
    weight = model.decoder.embed_tokens.weight[vocab].detach()
    lookup = shortlist_columns(vocab, model.vocab_size)
    nxt, ahead = lookup[nxt], torch.where(ahead >= 0, lookup[ahead.clamp(min=0)], ahead)
    params = [*heads.medusa.parameters(), *(p for h in heads.exits.values() for p in h.parameters())]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.0)
    steps = math.ceil(N / args.batch_positions) * args.epochs
    sched = warmup_cosine(opt, steps, warmup=20)
    log(out, f"train on {N} positions from {len(rows)} utterances ({len(vocab)} distinct tokens): "
             f"{args.num_heads} Medusa heads, exit layers {layers}, {steps} steps")
    step = 0
    bar = progress(desc="train heads", total=steps, unit="step")
    for epoch in range(args.epochs):
        order = torch.randperm(N)
        for start in range(0, N, args.batch_positions):
            idx = order[start : start + args.batch_positions]
            h = final[idx]
            medusa = torch.stack([F.cross_entropy(F.linear(head.transform(h), weight), ahead[idx, i], ignore_index=-100)
                                  for i, head in enumerate(heads.medusa)]).mean()
            exits = torch.stack([F.cross_entropy(F.linear(heads.exits[k](layer_h[k][idx]), weight), nxt[idx])
                                 for k in layers]).mean()
            loss = medusa + exits
            optimizer_step(opt, sched, loss, params)
            step += 1
            bar.update()
            if step % 50 == 0 or step == steps:
                log(out, f"step {step}/{steps} epoch {epoch} medusa CE {medusa.item():.3f} exit CE {exits.item():.3f}")
    bar.close()
    return heads


def ahead_targets(row: dict, num_heads: int) -> Tensor:
    """[n, K] Medusa targets of one row: at block position j (from the last prompt position on),
    head i's token is the one i + 2 places ahead (-100 past the end)."""
    seq, P, n = row["tokens"], row["prompt_len"], row["final"].shape[0]
    idx = torch.arange(P - 1, P - 1 + n)[:, None] + 2 + torch.arange(num_heads)[None, :]
    return torch.where(idx < len(seq), seq[idx.clamp(max=len(seq) - 1)], torch.full_like(idx, -100))


def block_batch(rows: list[dict], idx: list[int], num_heads: int) -> tuple[Tensor, Tensor]:
    """Right-padded final hidden states [B, T, d] and Medusa targets [B, T, K] of rows `idx`."""
    T = max(rows[i]["final"].shape[0] for i in idx)
    d = rows[idx[0]]["final"].shape[1]
    hidden = torch.zeros(len(idx), T, d)
    target = torch.full((len(idx), T, num_heads), -100, dtype=torch.long)
    for b, i in enumerate(idx):
        n = rows[i]["final"].shape[0]
        hidden[b, :n] = rows[i]["final"].float()
        target[b, :n] = ahead_targets(rows[i], num_heads)
    return hidden, target


def train_block(asr: ASRPipeline, rows: list[dict], vocab: Tensor, args, out: Path) -> MedusaBlock:
    """Medusa-Block heads on the frozen model: the block and its heads learn the tokens 2.. K+1 ahead."""
    torch.manual_seed(args.seed)
    model = asr.model
    block = new_medusa_block(model, new_medusa_heads(model, args.block_heads, args.head_layers, vocab))
    dm = block.layer.decoder_model(model)
    cross = cross_cache(dm, rows)
    weight = model.decoder.embed_tokens.weight[vocab].detach()
    lookup = shortlist_columns(vocab, model.vocab_size)
    params = training_parameters(block.layer) + list(block.heads.parameters())
    opt = torch.optim.AdamW(params, lr=args.block_lr, betas=(0.9, 0.98), weight_decay=0.01)
    steps = math.ceil(len(rows) / args.batch_utterances) * args.block_epochs
    sched = warmup_cosine(opt, steps, warmup=30)
    log(out, f"train a Medusa block with {args.block_heads} heads on {len(rows)} utterances, {steps} steps")
    step = 0
    bar = progress(desc="train Medusa block", total=steps, unit="step")
    for epoch in range(args.block_epochs):
        order = torch.randperm(len(rows)).tolist()
        for start in range(0, len(rows), args.batch_utterances):
            idx = order[start : start + args.batch_utterances]
            hidden, target = block_batch(rows, idx, args.block_heads)
            state = training_state(dm, [cross[i] for i in idx], hidden.shape[1])
            h = block_forward(dm, state, hidden)
            losses = []
            for i, head in enumerate(block.heads):
                keep = target[..., i] >= 0
                losses.append(F.cross_entropy(F.linear(head.transform(h[keep]), weight), lookup[target[..., i][keep]]))
            loss = torch.stack(losses).mean()
            optimizer_step(opt, sched, loss, params)
            step += 1
            bar.update()
            if step % 25 == 0 or step == steps:
                log(out, f"block step {step}/{steps} epoch {epoch} CE {loss.item():.3f}")
    bar.close()
    block.layer.hf.eval().requires_grad_(False)
    block.heads.eval().requires_grad_(False)
    return block


@torch.no_grad()
def evaluate(asr: ASRPipeline, heads: WhisperHeads, rows: list[dict]) -> dict:
    model = asr.model
    layers = sorted(heads.exits)
    final, layer_h, nxt, ahead = targets(rows, len(heads.medusa), layers)
    result = {"positions": int(final.shape[0]), "medusa_top1": [], "exit_top1": {}}
    for i, head in enumerate(heads.medusa):
        valid = ahead[:, i] != -100
        hit = head(final[valid]).argmax(-1) == ahead[valid, i]
        result["medusa_top1"].append(round(hit.float().mean().item(), 4))
    for k in layers:
        head = heads.exits[k]
        hidden = head(layer_h[k])
        logits = head.projection(hidden) if head.projection is not None else F.linear(hidden, model.decoder.embed_tokens.weight)
        result["exit_top1"][k] = round((logits.argmax(-1) == nxt).float().mean().item(), 4)
    if heads.block is not None:
        dm = heads.block.layer.decoder_model(model)
        cross = cross_cache(dm, rows)
        hits, total = torch.zeros(len(heads.block.heads)), torch.zeros(len(heads.block.heads))
        for start in range(0, len(rows), 16):
            idx = list(range(start, min(start + 16, len(rows))))
            hidden, target = block_batch(rows, idx, len(heads.block.heads))
            h = block_forward(dm, training_state(dm, [cross[i] for i in idx], hidden.shape[1]), hidden)
            for i, head in enumerate(heads.block.heads):
                keep = target[..., i] >= 0
                hits[i] += (head(h[keep]).argmax(-1) == target[..., i][keep]).sum()
                total[i] += keep.sum()
        result["block_top1"] = [round(float(a / max(b, 1)), 4) for a, b in zip(hits, total)]
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-heads", type=int, default=5)
    p.add_argument("--head-layers", type=int, default=1)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-positions", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--block-heads", type=int, default=4, help="heads of the Medusa block (stage `block`)")
    p.add_argument("--block-epochs", type=int, default=10)
    p.add_argument("--block-lr", type=float, default=3e-4)
    p.add_argument("--batch-utterances", type=int, default=16, help="utterances per Medusa-Block training step")
    run = start_run(p, argv, "mmaccel.speech.train.heads", STAGES)
    args, out, asr = run.args, run.out, run.asr
    path = out / "heads.safetensors"
    if "train" in run.stages:
        heads = train(asr, load_rows(run.train_dir, args.limit, KEEP), args, out)
        log(out, f"wrote {save_heads(path, asr.model, heads, run.info)}")
    if "block" in run.stages:
        heads = load_heads(path, asr.model)
        heads.block = train_block(asr, load_rows(run.train_dir, args.limit, BLOCK_KEEP), heads.vocab, args, out)
        log(out, f"wrote {save_heads(path, asr.model, heads, run.info)}")
    if "eval" in run.stages:
        result = evaluate(asr, load_heads(path, asr.model), load_rows(run.eval_dir, args.eval_limit, BLOCK_KEEP))
        write_eval(out, result)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
