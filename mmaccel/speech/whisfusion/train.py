"""Fine-tune a Whisper decoder into a Whisfusion masked-diffusion decoder on the TTS corpus.

    python -m mmaccel.speech.whisfusion.train --out runs/whisfusion

Stages (`--stages`, comma-separated, in this order; default all):

1. `features`: the training utterances (`build_tts_corpus(--corpus, "train", --sentences (1500),
   --voices-per-sentence (3))`, wavs already there are kept) become windows: every `--single-every`
   (3)-th utterance alone, and all of them packed consecutively into windows of up to `--window-s`
   (28) s with `--gap-s` (0.3) s of silence between (long audio: Whisfusion's stated weakness is
   20-30 s windows it rarely saw). Each window goes through the frozen Whisper encoder of `--model`
   (`builtin:tiny.en`) as a 30-s padded window, `--encode-batch` (8) at a time; its states are kept
   in fp16 with the target tokens (`" " + text`, the texts of a packed window joined by spaces,
   Whisper's tokenizer). Shards of `--shard-windows` (128) go to `<out>/features/shard_NNNNN.pt`
   atomically; existing ones are skipped (the stage resumes).
2. `train`: all shards in memory. `tokens_per_second` is the `--rate-quantile` (0.995) quantile of
   (tokens + 1 - margin) / seconds over the windows, so canvases fit the transcripts they are built
   for. Each step draws `--batch-size` (8) windows of similar length (neighbours by duration from a
   random start); cross-attention reads each window's audio states plus 50 (`audio_frames`). Each
   row's canvas (its target tokens, then `<|endoftext|>` to the canvas length) is masked position by
   position with probability t, t drawn uniformly in (0, 1], and t = 1 (everything masked, as decoding
   starts) with probability `--full-mask` (0.3). Loss: cross-entropy on the masked positions. AdamW
   (`--lr` 3e-4, betas 0.9/0.98, weight decay 0.01, gradient norm 1), linear warm-up `--warmup` (60)
   then cosine to 10 %, `--steps` (600; ~2.3 s a step on 2 CPU cores beside another training run).
   `<out>/last.pt` (model, optimiser, schedule, step, RNG states) every `--checkpoint-every` (100)
   steps and at the end; a run finding it resumes.
3. `eval`: corpus WER (Whisper's English normaliser) of the first `--eval-limit` (100) held-out TTS
   utterances (held-out sentences and voices) and the real clips (LibriVox, cards, ALSA): Whisfusion
   (K `--candidates` (8), S `--steps-decode` (4), both selections) against Whisper's own greedy
   decoder on the same encoder. Writes `<out>/eval.json`.
4. `export`: `WhisfusionDecoder.save(--export-dir)` (default `mmaccel/assets/whisfusion_tiny_en`), with the
   shortlist of token ids the training transcripts use (and `<|endoftext|>`): decoding reads out only
   those rows of the tied embedding (a few thousand of 51 864), which the decoder never learned to
   write anyway.

Other flags: `--threads` (0: torch's default), `--seed` (0), `--log-every` (20).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from mmaccel.errors import InputError, MMAccelError, check
from mmaccel.paths import assets_dir, default_cache_dir
from mmaccel.progress import progress, say
from mmaccel.speech.audio import WINDOW_S, Audio, load_audio, log_mel
from mmaccel.speech.ctc.train import pack, plan_windows
from mmaccel.speech.data import build_tts_corpus, read_manifest
from mmaccel.speech.train.common import log as log_line
from mmaccel.speech.train.common import optimizer_step, release_freed_memory, warmup_cosine
from mmaccel.speech.whisfusion.model import MASK, TRAINED_PADDING, WhisfusionDecoder
from mmaccel.speech.whisper import load_whisper

STAGES = ("features", "train", "eval", "export")


def target_tokens(bundle, text: str) -> list[int]:
    """Whisper's tokens of a transcript as its decoder writes one (a leading space, no specials)."""
    return bundle.tokenizer.encode(" " + text.strip(), add_special_tokens=False)


def stage_features(args, out: Path, bundle) -> None:
    utterances = read_manifest(build_tts_corpus(args.corpus, "train", max_sentences=args.sentences,
                                                voices_per_sentence=args.voices_per_sentence))
    check(args.window_s <= WINDOW_S, f"--window-s must be at most {WINDOW_S:.0f}, got {args.window_s}")
    windows = [[i] for i in range(0, len(utterances), args.single_every)]
    windows += plan_windows([u.duration for u in utterances], args.window_s, args.gap_s)
    folder = out / "features"
    folder.mkdir(parents=True, exist_ok=True)
    plan = {"model": args.model, "utterances": len(utterances), "windows": len(windows), "window_s": args.window_s,
            "gap_s": args.gap_s, "single_every": args.single_every, "shard_windows": args.shard_windows}
    plan_file = folder / "plan.json"
    if plan_file.is_file():
        old = json.loads(plan_file.read_text())
        check(old == plan, f"{folder} holds features made with {old}, this run asks for {plan}: use another --out")
    plan_file.write_text(json.dumps(plan, indent=1))
    shards = [windows[i:i + args.shard_windows] for i in range(0, len(windows), args.shard_windows)]
    todo = [i for i in range(len(shards)) if not (folder / f"shard_{i:05d}.pt").is_file()]
    log_line(out, f"features: {len(windows)} windows in {len(shards)} shards, {len(todo)} to compute")
    encoder = bundle.model.model.encoder
    for i in progress(todo, desc="features", unit="shard"):
        t0 = time.time()
        rows = []
        for start in range(0, len(shards[i]), args.encode_batch):
            group = shards[i][start:start + args.encode_batch]
            audios = [Audio(pack([load_audio(utterances[u].audio_filepath).samples for u in w], args.gap_s))
                      for w in group]
            with torch.inference_mode():
                states = encoder(log_mel(bundle.feature_extractor, audios, TRAINED_PADDING)).last_hidden_state
            for w, audio, s in zip(group, audios, states):
                text = " ".join(utterances[u].text.strip() for u in w)
                rows.append({"states": s.to(torch.float16).clone(), "seconds": audio.duration,
                             "tokens": torch.tensor(target_tokens(bundle, text), dtype=torch.int32), "text": text})
        path = folder / f"shard_{i:05d}.pt"
        torch.save({"windows": rows}, path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)
        del rows
        release_freed_memory()
        log_line(out, f"features: shard {i + 1}/{len(shards)} in {time.time() - t0:.0f} s")


def load_windows(folder: Path) -> list[dict]:
    paths = sorted(folder.glob("shard_*.pt"))
    check(len(paths) > 0, f"no feature shards in {folder}: run the features stage first")
    return [w for p in paths for w in torch.load(p)["windows"]]


def training_shortlist(windows: list[dict], end_of_text: int) -> torch.Tensor:
    """The ids the training transcripts use, and <|endoftext|> (sorted): what the decoder learns to write."""
    seen = {int(t) for w in windows for t in w["tokens"]} | {end_of_text}
    return torch.tensor(sorted(seen), dtype=torch.long)


def tokens_per_second(windows: list[dict], margin: int, quantile: float) -> float:
    rates = [(len(w["tokens"]) + 1 - margin) / max(w["seconds"], 0.1) for w in windows]
    return float(np.quantile(rates, quantile))


def masked_batch(model: WhisfusionDecoder, windows: list[dict], prompt: list[int], eot: int, full_mask: float,
                 gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """tokens [B, N] (masked positions MASK), targets [B, N] (-100 where not masked), key padding [B, N],
    encoder states [B, S, d] fp32 (cut to the batch's audio, `cut_states`) and their padding [B, S]."""
    P = len(prompt)
    lengths = [max(model.canvas_length(w["seconds"], P), len(w["tokens"]) + 1) for w in windows]
    N = P + max(lengths)
    clean = torch.full((len(windows), N), eot, dtype=torch.long)
    clean[:, :P] = torch.tensor(prompt)
    padding = torch.zeros(len(windows), N, dtype=torch.bool)
    masked = torch.zeros(len(windows), N, dtype=torch.bool)
    for b, (w, L) in enumerate(zip(windows, lengths)):
        clean[b, P:P + len(w["tokens"])] = w["tokens"].long()
        padding[b, P + L:] = True
        t = 1.0 if torch.rand((), generator=gen) < full_mask else float(1 - torch.rand((), generator=gen))
        row = torch.rand(L, generator=gen) < t
        row[int(torch.randint(L, (), generator=gen))] = True                     # at least one masked position
        masked[b, P:P + L] = row
    tokens = torch.where(masked, torch.full_like(clean, MASK), clean)
    targets = torch.where(masked, clean, torch.full_like(clean, -100))
    states, cross_padding = model.cut_states(torch.stack([w["states"] for w in windows]), [w["seconds"] for w in windows])
    return tokens, targets, padding, states.float(), cross_padding


def similar_lengths(order: list[int], batch_size: int, gen: torch.Generator) -> list[int]:
    """A batch of windows of similar length: `batch_size` neighbours in `order` (window indices sorted
    by duration) from a random start, so short clips do not pay for a long one's encoder states."""
    start = int(torch.randint(max(1, len(order) - batch_size + 1), (), generator=gen))
    return order[start:start + batch_size]


def masked_loss(model: WhisfusionDecoder, tokens: Tensor, targets: Tensor, padding: Tensor, states: Tensor,
                cross_padding: Tensor) -> Tensor:
    hidden = model.hidden(tokens, model.cross_kv(states), padding, cross_padding)
    keep = targets != -100
    return F.cross_entropy(model.logits(hidden[keep]).float(), targets[keep])


def stage_train(args, out: Path, bundle) -> WhisfusionDecoder:
    windows = load_windows(out / "features")
    rate = tokens_per_second(windows, args.margin, args.rate_quantile)
    model = WhisfusionDecoder(bundle.model, rate, args.margin)
    model.shortlist = training_shortlist(windows, bundle.tokens.end_of_text)
    log_line(out, f"train: {len(windows)} windows, {sum(w['seconds'] for w in windows) / 3600:.2f} h; "
                  f"{rate:.2f} tokens/s + {args.margin}; {sum(p.numel() for p in model.trained_state().values()) / 1e6:.1f} M "
                  f"trained parameters; {len(model.shortlist)} token ids in the transcripts")
    params = list(model.trained_state().values())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    sched = warmup_cosine(opt, args.steps, args.warmup)
    gen = torch.Generator().manual_seed(args.seed)
    checkpoint, start = out / "last.pt", 0
    if checkpoint.is_file():
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["schedule"])
        gen.set_state(state["sampler_rng"])
        start = state["step"]
        log_line(out, f"train: resumed from {checkpoint} at step {start}/{args.steps}")
    prompt, eot = bundle.prompt("en"), bundle.tokens.end_of_text
    order = sorted(range(len(windows)), key=lambda i: windows[i]["seconds"])
    model.train()
    t0, recent = time.time(), []
    for step in range(start, args.steps):
        pick = similar_lengths(order, args.batch_size, gen)
        loss = masked_loss(model, *masked_batch(model, [windows[i] for i in pick], prompt, eot, args.full_mask, gen))
        optimizer_step(opt, sched, loss, params)
        recent.append(float(loss.detach()))
        if (step + 1) % args.checkpoint_every == 0 or step + 1 == args.steps:
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "schedule": sched.state_dict(),
                     "sampler_rng": gen.get_state(), "step": step + 1, "tokens_per_second": rate}
            torch.save(state, checkpoint.with_suffix(".tmp"))
            checkpoint.with_suffix(".tmp").replace(checkpoint)
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            log_line(out, f"train: step {step + 1}/{args.steps}  loss {np.mean(recent):.3f}  lr "
                          f"{sched.get_last_lr()[0]:.2e}  {(time.time() - t0) / (step + 1 - start):.2f} s/step")
            recent = []
    return model.eval()


def load_trained(out: Path, bundle, margin: int) -> WhisfusionDecoder:
    path = out / "last.pt"
    if not path.is_file():
        raise InputError(f"{path} not found: run the train stage first")
    state = torch.load(path)
    model = WhisfusionDecoder(bundle.model, state["tokens_per_second"], margin)
    model.load_state_dict(state["model"])
    model.shortlist = training_shortlist(load_windows(out / "features"), bundle.tokens.end_of_text)
    return model.eval()


def stage_eval(args, out: Path, bundle, model: WhisfusionDecoder) -> dict:
    from mmaccel.metrics.wer import corpus_wer
    from mmaccel.speech.data import real_utterances
    from mmaccel.speech.pipeline import ASRPipeline
    from mmaccel.speech.whisfusion.pipeline import WhisfusionPipeline

    held_out = read_manifest(build_tts_corpus(args.corpus, "eval"))[:args.eval_limit]
    sets = {"tts_held_out": held_out, "real": real_utterances()}
    fusion = WhisfusionPipeline(bundle, model)
    ar = ASRPipeline(bundle)
    result = {"candidates": args.candidates, "steps": args.steps_decode}
    for name, utts in sets.items():
        audio = [load_audio(u.audio_filepath) for u in utts]
        refs = [u.text for u in utts]
        row = {"utterances": len(utts), "ar_greedy": round(100 * corpus_wer(refs, ar.transcribe(audio).texts).wer, 2)}
        for select in ("rover", "confidence"):
            texts = fusion.transcribe(audio, candidates=args.candidates, steps=args.steps_decode, select=select).texts
            row[f"whisfusion_{select}"] = round(100 * corpus_wer(refs, texts).wer, 2)
        result[name] = row
        log_line(out, f"eval: {name}: {json.dumps(row)}")
    (out / "eval.json").write_text(json.dumps(result, indent=1))
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mmaccel.speech.whisfusion.train", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", required=True, help="run folder (features, checkpoint, log, eval)")
    p.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset of " + ",".join(STAGES))
    p.add_argument("--model", default="builtin:tiny.en", help="the Whisper whose encoder and decoder it starts from")
    p.add_argument("--corpus", default=str(default_cache_dir() / "speech" / "tts"), help="TTS corpus folder")
    p.add_argument("--sentences", type=int, default=1500)
    p.add_argument("--voices-per-sentence", type=int, default=3)
    p.add_argument("--single-every", type=int, default=3, help="every n-th utterance is also a window of its own")
    p.add_argument("--window-s", type=float, default=28.0)
    p.add_argument("--gap-s", type=float, default=0.3)
    p.add_argument("--shard-windows", type=int, default=128)
    p.add_argument("--encode-batch", type=int, default=8)
    p.add_argument("--margin", type=int, default=6, help="canvas positions beyond tokens_per_second x seconds")
    p.add_argument("--rate-quantile", type=float, default=0.995)
    p.add_argument("--full-mask", type=float, default=0.3, help="share of rows masked entirely")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=60)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--eval-limit", type=int, default=100)
    p.add_argument("--candidates", type=int, default=8)
    p.add_argument("--steps-decode", type=int, default=4)
    p.add_argument("--export-dir", default=str(assets_dir() / "whisfusion_tiny_en"))
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    try:
        check(not unknown, f"unknown stage(s) {unknown}; choose from {', '.join(STAGES)}")
        if args.threads:
            torch.set_num_threads(args.threads)
        torch.manual_seed(args.seed)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        command = "python -m mmaccel.speech.whisfusion.train " + " ".join(argv if argv is not None else sys.argv[1:])
        log_line(out, f"start: {command}")
        bundle = load_whisper(args.model)
        model = None
        if "features" in stages:
            stage_features(args, out, bundle)
        if "train" in stages:
            model = stage_train(args, out, bundle)
        if model is None and ({"eval", "export"} & set(stages)):
            model = load_trained(out, bundle, args.margin)
        result = stage_eval(args, out, bundle, model) if "eval" in stages else None
        if "export" in stages:
            if result is None and (out / "eval.json").is_file():
                result = json.loads((out / "eval.json").read_text())
            info = {"command": command, "steps": args.steps, "eval": result}
            path = model.save(args.export_dir, args.model, info)
            log_line(out, f"export: {path}")
    except MMAccelError as err:
        say(f"error: {err}")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
