"""Train a small draft decoder for a Whisper model by self-distillation (the distil-whisper recipe).

    python -m mmaccel.speech.train.draft --model builtin:base --out runs/whisper_base_draft

Stages (`--stages` picks some):
1. `data`: the self-labelled corpus of `mmaccel.speech.train.data` (the target's own greedy
   transcripts of the TTS corpus and the encoder states), shareable with the heads script (`--data`).
2. `train`: a `WhisperDraft` initialised from target layers `--layers` (first and last by default);
   embeddings and cross-attention keys/values frozen (shared with the target), everything else
   trained with cross-entropy on the target's greedy transcripts (hard distillation: greedy
   verification only needs the arg-max to agree) over the shortlist of transcript tokens the draft
   also drafts from, mixed with `--kd` of KL divergence to the target's own distribution over that
   shortlist (soft distillation from the stored final hidden states, which generalises beyond the
   training sentences better than hard labels alone); AdamW, warm-up then cosine. The draft cross-attends
   to each utterance's audio frames plus `--cross-window` frames (lengths from the corpus manifest), as it
   will when decoding. Those cross-attention keys/values are computed once (frozen projections) and kept
   in memory (fp16; ~1 MB for a 4-s utterance of Whisper base, 6 MB for a whole window). Writes
   `<out>/draft.safetensors` (what `ASRPipeline.from_pretrained(draft=...)` loads).
3. `eval`: teacher-forced top-1 agreement with the target's next token on held-out utterances.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from mmaccel.core.model import DecodeState
from mmaccel.errors import check
from mmaccel.progress import progress
from mmaccel.speech.data import read_manifest
from mmaccel.speech.decoder import EncodedAudio, WhisperDecoderModel, audio_frames
from mmaccel.speech.draft import WhisperDraft, load_draft, new_draft, save_draft, trainable
from mmaccel.speech.pipeline import ASRPipeline
from mmaccel.speech.train.common import log, optimizer_step, shortlist_columns, warmup_cosine, write_eval
from mmaccel.speech.train.data import load_rows, manifest_paths, start_run, training_shortlist, with_timestamps

STAGES = ("data", "train", "eval")
KEEP = ("id", "tokens", "prompt_len", "encoder")
KEEP_KD = KEEP + ("final",)         # the target's final hidden states: its logits for soft targets


@torch.no_grad()
def cross_cache(model: WhisperDecoderModel, rows: list[dict], frames: list[int] | None = None) -> list[dict]:
    """Per utterance, the target's cross-attention keys/values [H, S', Dh] of the layers a draft
    shares (fp16), cut after the frames the draft attends to when `frames` (audio frames per row)
    are given and the model has a `cross_window`; entry "frames" keeps the row's audio frames."""
    out = []
    for b, r in enumerate(rows):
        inputs = EncodedAudio(r.pop("encoder")[None].to(model.dtype), r["tokens"][None, : r["prompt_len"]])
        S = inputs.encoder_states.shape[1]
        audio = S if frames is None else min(frames[b], S)
        keep = S if model.cross_window is None else min(S, audio + model.cross_window)
        entry: dict = {model.cross_layers[i]: tuple(t[0, :, :keep].half() for t in model._cross(inputs, i))
                       for i in range(len(model.cross_layers))}
        entry["frames"] = audio
        out.append(entry)
    return out


def cached_rows(dm: WhisperDecoderModel, folder: Path, limit: int | None, manifest: Path,
                keep: tuple[str, ...]) -> tuple[list[dict], list[dict]]:
    """The rows of `folder` (fields `keep`, which must include "encoder") without their encoder
    states, and per row the cross-attention keys/values `dm` reads (`cross_cache`), made chunk by
    chunk: the peak memory is the cache, not every utterance's encoder states."""
    cross: list[dict] = []
    frames = dm.hf.config.max_source_positions
    rows = load_rows(folder, limit, keep,
                     each=lambda chunk: cross.extend(cross_cache(dm, chunk, row_frames(manifest, chunk, frames))))
    return rows, cross[: len(rows)]


def row_frames(manifest, rows: list[dict], encoder_frames: int, window_s: float = 30.0) -> list[int]:
    """Each row's audio frames, from the utterance durations in the corpus `manifest`."""
    seconds = {u.id: u.duration for u in read_manifest(manifest)}
    return [audio_frames(seconds[r["id"]], window_s, encoder_frames) for r in rows]


def training_state(dm: WhisperDecoderModel, cross: list[dict], length: int) -> DecodeState:
    """A fresh decode state for a batch of utterances (their cached cross-attention keys/values,
    zero-padded to the longest; the draft's cross window masks the padding out)."""
    layers = [k for k in cross[0] if k != "frames"]
    S = max(c[layers[0]][0].shape[1] for c in cross)
    kv = {k: tuple(torch.stack([F.pad(c[k][j], (0, 0, 0, S - c[k][j].shape[1])) for c in cross]).to(dm.dtype)
                   for j in range(2)) for k in layers}
    B = len(cross)
    state = dm.new_state(B, length)
    first = kv[layers[0]][0]
    frames = torch.tensor([c["frames"] for c in cross])
    state.extras["inputs"] = EncodedAudio(first.new_empty(B, 0, dm.hidden_size), torch.zeros(B, 1, dtype=torch.long), kv,
                                          audio_frames=frames)
    return state


def draft_hidden(dm: WhisperDecoderModel, cross: list[dict], tokens: Tensor) -> Tensor:
    """The draft's final hidden states [B, T, d] over right-padded `tokens` [B, T] (causal, so
    padding after a row's end never reaches its real positions), with gradients."""
    state = training_state(dm, cross, tokens.shape[1])
    dm._forward(state, tokens, None, None, last_only=True)
    return state.hidden


def training_parameters(draft: WhisperDraft) -> list[torch.nn.Parameter]:
    """Freeze everything the draft shares with the target; return (and unfreeze) the rest."""
    draft.hf.requires_grad_(False)
    params = list(trainable(draft).values())
    for p in params:
        p.requires_grad_(True)
    return params


def batches(rows: list[dict], eot: int, size: int, order: Tensor):
    """(indices, tokens [B, T] right-padded with eot, targets [B, T] with -100 where nothing is learnt)."""
    for start in range(0, len(order), size):
        idx = order[start : start + size].tolist()
        T = max(len(rows[i]["tokens"]) for i in idx)
        tokens = torch.full((len(idx), T), eot, dtype=torch.long)
        target = torch.full((len(idx), T), -100, dtype=torch.long)
        for b, i in enumerate(idx):
            seq, P = rows[i]["tokens"], rows[i]["prompt_len"]
            tokens[b, : len(seq)] = seq
            target[b, P - 1 : len(seq) - 1] = seq[P:]        # position t predicts token t + 1
        yield idx, tokens, target


def distillation_loss(logits: Tensor, labels: Tensor, teacher: Tensor | None = None, kd: float = 0.0) -> Tensor:
    """(1 - kd) x cross-entropy with the target's tokens `labels` [N] + kd x KL(target || draft), where
    `teacher` [N, S] are the target's logits over the same columns as the draft's `logits` [N, S]."""
    loss = F.cross_entropy(logits, labels)
    if kd == 0:
        return loss
    kl = F.kl_div(logits.log_softmax(-1), teacher.log_softmax(-1), log_target=True, reduction="batchmean")
    return (1 - kd) * loss + kd * kl


def train(asr: ASRPipeline, draft: WhisperDraft, rows: list[dict], cross: list[dict], args, out: Path) -> WhisperDraft:
    """Fit `draft` (its `vocab` set: the shortlist) on `rows` and their `cross` caches."""
    torch.manual_seed(args.seed)
    target = asr.model
    vocab = draft.vocab
    dm = draft.decoder_model(target)
    weight = target.decoder.embed_tokens.weight[vocab].detach()
    lookup = shortlist_columns(vocab, target.vocab_size)
    params = training_parameters(draft)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    steps = math.ceil(len(rows) / args.batch_utterances) * args.epochs
    sched = warmup_cosine(opt, steps, warmup=30)
    positions = sum(len(r["tokens"]) - r["prompt_len"] for r in rows)
    log(out, f"train a {len(draft.layers)}-layer draft (from target layers {draft.layers}) on {len(rows)} utterances, "
             f"{positions} positions, {len(vocab)} distinct tokens, {steps} steps")
    eot = asr.bundle.tokens.end_of_text
    draft.hf.train()
    step = 0
    bar = progress(desc="train draft decoder", total=steps, unit="step")
    for epoch in range(args.epochs):
        for idx, tokens, tgt in batches(rows, eot, args.batch_utterances, torch.randperm(len(rows))):
            hidden = draft_hidden(dm, [cross[i] for i in idx], tokens)
            keep = tgt >= 0
            teacher = None if args.kd == 0 else F.linear(torch.cat([rows[i]["final"] for i in idx]).float(), weight)
            loss = distillation_loss(F.linear(hidden[keep], weight), lookup[tgt[keep]], teacher, args.kd)
            optimizer_step(opt, sched, loss, params)
            step += 1
            bar.update()
            if step % 25 == 0 or step == steps:
                log(out, f"step {step}/{steps} epoch {epoch} CE {loss.item():.3f}")
    bar.close()
    draft.hf.eval().requires_grad_(False)
    return draft


@torch.no_grad()
def evaluate(asr: ASRPipeline, draft: WhisperDraft, rows: list[dict], manifest: Path) -> dict:
    """Teacher-forced top-1 agreement of the draft (through its shortlist) with the target's tokens."""
    dm = draft.decoder_model(asr.model)
    cross = cross_cache(dm, rows, row_frames(manifest, rows, asr.model.hf.config.max_source_positions))
    hits = total = 0
    eot = asr.bundle.tokens.end_of_text
    for idx, tokens, tgt in batches(rows, eot, 16, torch.arange(len(rows))):
        hidden = draft_hidden(dm, [cross[i] for i in idx], tokens)
        keep = tgt >= 0
        guess = dm.projection(hidden[keep]).argmax(-1) if dm.projection is not None else None
        hits += int((guess == tgt[keep]).sum())
        total += int(keep.sum())
    return {"positions": total, "top1": round(hits / max(total, 1), 4)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", default="0,-1", help="target layers the draft's layers start from")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-utterances", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--kd", type=float, default=0.0,
                   help="weight in [0, 1] of the KL divergence to the target's distribution (the rest: cross-entropy)")
    p.add_argument("--cross-window", type=int, default=50,
                   help="encoder frames after the audio the draft attends to (-1: the whole 30-s window)")
    p.add_argument("--init", default=None,
                   help="a draft file training starts from (its layers and cross window; default: a new draft)")
    p.add_argument("--shortlist-text", action="store_true",
                   help="widen the shortlist beyond the transcripts' tokens: the tokens of every training sentence "
                        "of --text (spoken or not) and the --init draft's shortlist")
    run = start_run(p, argv, "mmaccel.speech.train.draft", STAGES)
    args, out, asr = run.args, run.out, run.asr
    path = out / "draft.safetensors"
    if "train" in run.stages:
        check(0.0 <= args.kd <= 1.0, f"--kd must be in [0, 1], got {args.kd}")
        window = None if args.cross_window < 0 else args.cross_window
        draft = load_draft(args.init, asr.bundle.model) if args.init else \
            new_draft(asr.bundle.model, [int(k) for k in args.layers.split(",")], window)
        rows, cross = cached_rows(draft.decoder_model(asr.model), run.train_dir, args.limit,
                                  manifest_paths(args)["train"], KEEP_KD if args.kd > 0 else KEEP)
        draft.vocab = training_shortlist(rows, args, asr.bundle.tokenizer, draft.vocab)
        draft.timestamps = draft.timestamps or with_timestamps(rows, asr.bundle.tokens.no_timestamps)
        draft = train(asr, draft, rows, cross, args, out)
        log(out, f"wrote {save_draft(path, asr.bundle.model, draft, run.info)}")
    if "eval" in run.stages:
        result = evaluate(asr, load_draft(path, asr.bundle.model), load_rows(run.eval_dir, args.eval_limit, KEEP),
                          manifest_paths(args)["eval"])
        write_eval(out, result)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
