"""Train an EAGLE head (`mmaccel.speech.eagle`) for a Whisper model by self-distillation.

    python -m mmaccel.speech.train.eagle --model builtin:base --data runs/whisper_base_data --out runs/whisper_base_eagle

Stages (`--stages` picks some):
1. `data`: the self-labelled corpus of `mmaccel.speech.train.data` (the target's greedy transcripts of
   the TTS corpus, every position's final hidden state, the encoder states), shareable (`--data`).
2. `train`: the target stays frozen. At transcript position t the head reads the target's feature
   f_t and the token x_{t+1}. It learns x_{t+2} and f_{t+1}:
   - x_{t+2}: cross-entropy on the greedy transcript mixed with `--kd` of KL divergence to the
     target's own distribution, both over the shortlist of the training transcripts' tokens (which
     the head drafts from);
   - f_{t+1}: smooth L1 on normalised features (`EagleHead.normalized`), weight `--reg`.
   Training-time test (`--unroll` S, as in EAGLE-3): pass s feeds the head its own outputs of pass
   s - 1 in place of the features, each position attending to the real entries before its draft
   began and to its own earlier drafts, exactly as when drafting s tokens ahead; the losses of all
   passes are summed. Pass 1's features get uniform noise of half-width `--noise` (EAGLE; in
   normalised units). Each utterance's entries start with the prompt's (prompt tokens with the
   learned `start` feature), so the same passes teach drafting the first tokens from the prompt.
   With `--fuse` (EAGLE-3) the head's real-feature input fuses the outputs of those target layers
   (stored by the `data` stage) with f_t, the fusion starting as f_t alone; `--init` starts from a
   trained head. The head has one decoder layer per `--layers` entry and cross-attends to the audio frames plus
   `--cross-window`. Writes `<out>/heads.safetensors`: a heads file of this head (and its
   shortlist), or the `--heads` file with it added, what `ASRPipeline.from_pretrained(heads=...)` loads.
3. `eval`: teacher-forced top-1 agreement on held-out utterances for drafts 1.. S ahead (draft s
   given the s - 1 before it were right: the acceptance rate of each step of a chain), after real
   features and from the prompt.
"""

from __future__ import annotations

import argparse
from itertools import zip_longest
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from mmaccel.errors import check
from mmaccel.progress import progress
from mmaccel.speech.decoder import LayerStep, WhisperDecoderModel
from mmaccel.speech.eagle import EagleHead, new_eagle_head, with_fusion
from mmaccel.speech.heads import WhisperHeads, load_heads, save_heads
from mmaccel.speech.train.common import log, optimizer_step, shortlist_columns, warmup_cosine, write_eval
from mmaccel.speech.train.data import load_rows, manifest_paths, start_run, training_shortlist, with_timestamps
from mmaccel.speech.train.draft import (
    cached_rows,
    cross_cache,
    distillation_loss,
    row_frames,
    training_parameters,
    training_state,
)

STAGES = ("data", "train", "eval")
KEEP = ("id", "tokens", "prompt_len", "final", "encoder")


class _Passes:
    """Each layer's keys/values of every pass so far, concatenated (the cache writer of a training
    pass: nothing is written in place, so every pass keeps its gradient)."""

    def __init__(self):
        self.k: dict[int, list[Tensor]] = {}
        self.v: dict[int, list[Tensor]] = {}

    def update(self, key: Tensor, value: Tensor, layer_idx: int, *args, **kwargs) -> tuple[Tensor, Tensor]:
        self.k.setdefault(layer_idx, []).append(key)
        self.v.setdefault(layer_idx, []).append(value)
        return torch.cat(self.k[layer_idx], 2), torch.cat(self.v[layer_idx], 2)


def unroll_mask(T: int, s: int) -> Tensor:
    """[1, 1, T, s*T] (True = attend): in pass s (from 1), entry j sees pass 1's entries up to
    j - s + 1 (the real features before its draft began) and pass r's entry j - s + r for r = 2.. s
    (its own earlier drafts, itself last)."""
    j = torch.arange(T)[:, None]
    i = torch.arange(T)[None, :]
    blocks = [i <= j - s + 1] + [i == j - s + r for r in range(2, s + 1)]
    return torch.cat(blocks, 1)[None, None]


def prompt_batches(rows: list[dict], size: int, order: list[int]) -> list[list[int]]:
    """Batches of at most `size` row indices that share one decoder prompt (rows labelled with and
    without timestamps differ), in `order` within each prompt; the batches of all prompts in turn."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in order:
        groups.setdefault(tuple(rows[i]["tokens"][: rows[i]["prompt_len"]].tolist()), []).append(i)
    per_prompt = [[g[s : s + size] for s in range(0, len(g), size)] for g in groups.values()]
    return [b for turn in zip_longest(*per_prompt) for b in turn if b is not None]


def batch(rows: list[dict], idx: list[int], lookup: Tensor, prompt: bool,
          feature_layers: tuple[int, ...] = ()) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """Right-padded features f_t [B, T, (m + 1) d] (the outputs of the m `feature_layers`, then the
    final hidden state: what `EagleHead.read` takes), tokens x_{t+1} [B, T], targets x_{t+2} as shortlist
    columns [B, T] (-100: padding or outside the shortlist), target features f_{t+1} [B, T, d] and
    the number of prompt entries first (`prompt`: the head's entries for prompt tokens 1.. P - 1,
    whose features are the head's `start`; only the last one has a target, the first transcript
    token, and its target feature is the last prompt position's)."""
    P = rows[idx[0]]["prompt_len"]
    check(all(rows[i]["prompt_len"] == P and torch.equal(rows[i]["tokens"][:P], rows[idx[0]]["tokens"][:P]) for i in idx),
          "the rows of a batch must share one decoder prompt")
    n0 = P - 1 if prompt else 0
    T = n0 + max(rows[i]["final"].shape[0] - 1 for i in idx)
    d = rows[idx[0]]["final"].shape[1]
    feats, nxt = torch.zeros(len(idx), T, (len(feature_layers) + 1) * d), torch.zeros(len(idx), T, d)
    tokens = torch.zeros(len(idx), T, dtype=torch.long)
    target = torch.full((len(idx), T), -100, dtype=torch.long)
    for b, i in enumerate(idx):
        f, seq = rows[i]["final"].float(), rows[i]["tokens"]
        n = f.shape[0] - 1                     # entry n0 + j: feature at P-1+j, token at P+j, target at P+j+1
        x = torch.cat([rows[i]["layers"][j, :n].float() for j in feature_layers] + [f[:n]], -1)
        feats[b, n0 : n0 + n], nxt[b, n0 : n0 + n] = x, f[1:]
        tokens[b, n0 : n0 + n] = seq[P : P + n]
        target[b, n0 : n0 + n] = lookup[seq[P + 1 : P + 1 + n]]
        if prompt:
            tokens[b, :n0] = seq[1:P]
            target[b, n0 - 1], nxt[b, n0 - 1] = lookup[seq[P]], f[0]
    return feats, tokens, target, nxt, n0


def unrolled(head: EagleHead, dm: WhisperDecoderModel, inputs, feats: Tensor, tokens: Tensor, passes: int,
             n0: int = 0, noise: float = 0.0) -> list[Tensor]:
    """The head's outputs g [B, T, d] of passes 1.. `passes` (training-time test, see `unroll_mask`);
    the first `n0` entries are the prompt's, whose feature is `head.start` in every pass."""
    writer = _Passes()
    emb = F.embedding(tokens, dm.decoder.embed_tokens.weight.detach()) * dm.embed_scale     # the target's: frozen
    out, T = [], tokens.shape[1]
    x = head.read(feats, noise)
    for s in range(1, passes + 1):
        if s > 1:                              # entry j reads the previous pass's output at j - 1
            x = head.normalized(F.pad(out[-1][:, :-1], (0, 0, 1, 0)))
        if n0:
            x = torch.cat([head.start.expand(x.shape[0], n0, -1), x[:, n0:]], 1)
        step = LayerStep(writer, unroll_mask(T, s), inputs, dm.num_heads)
        h = head.fc(torch.cat([emb, x], -1))
        for i in range(dm.num_layers):
            h = dm.layer(i, h, step)
        out.append(dm.decoder.layer_norm(h))
    return out


def first_entry(n0: int, s: int) -> int:
    """The first entry pass s + 1 (s from 0) scores: its context must reach the last prompt entry
    (with prompt entries) or the first real one."""
    return max(n0 - 1, 0) + s


def train(asr, head: EagleHead, rows: list[dict], cross: list[dict], args, out: Path) -> EagleHead:
    """Fit `head` (its `layer.vocab` set: the shortlist) on `rows` and their `cross` caches."""
    torch.manual_seed(args.seed)
    target = asr.model
    vocab = head.layer.vocab
    dm = head.layer.decoder_model(target)
    weight = target.decoder.embed_tokens.weight[vocab].detach()
    lookup = shortlist_columns(vocab, target.vocab_size)
    head.start = torch.nn.Parameter(head.start)
    mixers = [head.fc] + ([head.fuse] if head.fuse is not None else [])
    params = training_parameters(head.layer) + [p for m in mixers for p in m.parameters()] + [head.start]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    steps = len(prompt_batches(rows, args.batch_utterances, list(range(len(rows))))) * args.epochs
    sched = warmup_cosine(opt, steps, warmup=30)
    positions = sum(r["final"].shape[0] - 1 for r in rows)
    log(out, f"train an EAGLE head on {len(rows)} utterances, {positions} positions, shortlist {len(vocab)}, "
             f"unroll {args.unroll}, fused layers {list(head.feature_layers)}, {steps} steps")
    head.layer.hf.train()
    step = 0
    bar = progress(desc="train EAGLE head", total=steps, unit="step")
    for epoch in range(args.epochs):
        for idx in prompt_batches(rows, args.batch_utterances, torch.randperm(len(rows)).tolist()):
            feats, tokens, tgt, nxt, n0 = batch(rows, idx, lookup, True, head.feature_layers)
            inputs = training_state(dm, [cross[i] for i in idx], tokens.shape[1]).extras["inputs"]
            losses = []
            for s, g in enumerate(unrolled(head, dm, inputs, feats, tokens, args.unroll, n0, args.noise)):
                keep = tgt >= 0
                keep[:, : first_entry(n0, s)] = False
                teacher = F.linear(nxt[keep], weight) if args.kd > 0 else None
                loss = distillation_loss(F.linear(g[keep], weight), tgt[keep], teacher, args.kd)
                regression = F.smooth_l1_loss(head.normalized(g[keep]), head.normalized(nxt[keep]))
                losses.append(loss + args.reg * regression)
            loss = torch.stack(losses).sum()
            optimizer_step(opt, sched, loss, params)
            step += 1
            bar.update()
            if step % 25 == 0 or step == steps:
                log(out, f"step {step}/{steps} epoch {epoch} loss per pass {[round(x.item(), 3) for x in losses]}")
    bar.close()
    head.layer.hf.eval().requires_grad_(False)
    for m in mixers:
        m.eval().requires_grad_(False)
    head.start = head.start.detach()
    return head


@torch.no_grad()
def evaluate(asr, head: EagleHead, rows: list[dict], manifest: Path, passes: int) -> dict:
    """Top-1 agreement of draft s (s = 1.. `passes`) with the target's token, its s - 1 predecessors
    right: `top1_by_draft` after real features (the drafts of a verification's aftermath), and for a
    head with a `start` feature `top1_from_prompt` (the first transcript tokens, drafted before the
    prefill from the prompt alone)."""
    target = asr.model
    dm = head.layer.decoder_model(target)
    cross = cross_cache(dm, rows, row_frames(manifest, rows, target.hf.config.max_source_positions))
    vocab = head.layer.vocab
    lookup = shortlist_columns(vocab, target.vocab_size)
    weight = target.decoder.embed_tokens.weight[vocab]
    prompt = head.start is not None
    hits, total = torch.zeros(2, passes), torch.zeros(2, passes)
    for idx in prompt_batches(rows, 16, list(range(len(rows)))):
        feats, tokens, _, _, n0 = batch(rows, idx, lookup, prompt, head.feature_layers)
        truth = torch.full_like(tokens, -1)     # the target's tokens, whether in the shortlist or not
        for b, i in enumerate(idx):
            seq, P = rows[i]["tokens"], rows[i]["prompt_len"]
            n = rows[i]["final"].shape[0] - 1
            truth[b, n0 : n0 + n] = seq[P + 1 : P + 1 + n]
            if prompt:
                truth[b, n0 - 1] = seq[P]
        inputs = training_state(dm, [cross[i] for i in idx], tokens.shape[1]).extras["inputs"]
        for s, g in enumerate(unrolled(head, dm, inputs, feats, tokens, passes, n0)):
            after = truth >= 0
            after[:, : n0 + s] = False           # the context holds a real feature
            kinds = [after]
            if prompt:                          # the context is the prompt alone
                kinds.append(torch.zeros_like(after))
                kinds[1][:, first_entry(n0, s)] = truth[:, first_entry(n0, s)] >= 0
            for kind, keep in enumerate(kinds):
                guess = vocab[F.linear(g[keep], weight).argmax(-1)]
                hits[kind, s] += (guess == truth[keep]).sum()
                total[kind, s] += keep.sum()
    rate = [[round(float(h / max(t, 1)), 4) for h, t in zip(hits[k], total[k])] for k in range(2)]
    result = {"positions": int(total[0, 0]), "top1_by_draft": rate[0]}
    if prompt:
        result.update(utterances=len(rows), top1_from_prompt=rate[1])
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--heads", default=None, help="a heads file to add the EAGLE head to (default: a file of this head alone)")
    p.add_argument("--init", default=None,
                   help="a heads file whose EAGLE head training starts from (its layers and cross window; default: a new head)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-utterances", type=int, default=16)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--kd", type=float, default=0.8, help="weight in [0, 1] of the KL divergence to the target")
    p.add_argument("--reg", type=float, default=1.0, help="weight of the feature regression (smooth L1)")
    p.add_argument("--unroll", type=int, default=3, help="training-time test passes (1: teacher features only)")
    p.add_argument("--noise", type=float, default=0.0, help="half-width of the uniform noise on pass 1's features")
    p.add_argument("--cross-window", type=int, default=50,
                   help="encoder frames after the audio the head attends to (-1: the whole 30-s window)")
    p.add_argument("--eval-passes", type=int, default=5)
    p.add_argument("--shortlist-text", action="store_true",
                   help="widen the shortlist beyond the transcripts' tokens: the tokens of every training sentence "
                        "of --text (spoken or not) and the --init head's shortlist")
    p.add_argument("--layers", type=lambda v: tuple(int(x) for x in v.split(",")), default=(-1,),
                   help="target layers the head's layers start from (comma-separated; negative counts from the end)")
    p.add_argument("--fuse", type=lambda v: tuple(int(x) for x in v.split(",")) if v else (), default=(),
                   help="target layers (0-based, comma-separated) whose outputs the head fuses with the final feature (EAGLE-3)")
    run = start_run(p, argv, "mmaccel.speech.train.eagle", STAGES)
    args, out, asr = run.args, run.out, run.asr
    check(0.0 <= args.kd <= 1.0, f"--kd must be in [0, 1], got {args.kd}")
    check(args.unroll >= 1, f"--unroll must be >= 1, got {args.unroll}")
    path = out / "heads.safetensors"
    if "train" in run.stages:
        heads = load_heads(args.heads, asr.model) if args.heads else WhisperHeads()
        if args.init:
            head = load_heads(args.init, asr.model).eagle
            check(head is not None, f"--init {args.init} holds no EAGLE head")
        else:
            head = new_eagle_head(asr.model, None if args.cross_window < 0 else args.cross_window, args.layers)
        if args.fuse:
            head = with_fusion(head, asr.model, args.fuse)
        keep = KEEP + (("layers",) if head.feature_layers else ())
        rows, cross = cached_rows(head.layer.decoder_model(asr.model), run.train_dir, args.limit,
                                  manifest_paths(args)["train"], keep)
        head.layer.vocab = training_shortlist(rows, args, asr.bundle.tokenizer, head.layer.vocab)
        head.layer.timestamps = head.layer.timestamps or with_timestamps(rows, asr.bundle.tokens.no_timestamps)
        heads.eagle = train(asr, head, rows, cross, args, out)
        log(out, f"wrote {save_heads(path, asr.model, heads, run.info)}")
    if "eval" in run.stages:
        head = load_heads(path, asr.model).eagle
        keep = KEEP + (("layers",) if head.feature_layers else ())
        result = evaluate(asr, head, load_rows(run.eval_dir, args.eval_limit, keep), manifest_paths(args)["eval"],
                          args.eval_passes)
        write_eval(out, result)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
