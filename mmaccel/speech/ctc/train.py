"""Train character CTC heads with early exits on the frozen Whisper base encoder (`WhisperCTC`).

    python -m mmaccel.speech.ctc.train --out runs/ctc

Stages (`--stages`, comma-separated, run in this order; default all):

1. `corpus`: speak the first `--sentences` (1500) sentences of the train split's `--text` (`fortunes`;
   `varied`: man pages, docstrings and fortunes, every other utterance augmented) with
   `--voices-per-sentence` (3) of the training TTS voices into `--corpus`
   (`<cache>/speech/tts`, cache = `$MMACCEL_CACHE` or `~/.cache/mmaccel`; wavs already there are
   kept), and every eval-split fortunes sentence with 2 of the held-out voices. The manifests are copied to
   `<out>/corpus/{train,eval}.jsonl` (absolute paths), which the later stages read: the corpus
   folder's own `train.jsonl` is rewritten by every trainer that builds its corpus there.
2. `features`: `--copies` (2) passes over the training utterances, copy 0 clean and in corpus order,
   the others shuffled and augmented (`mmaccel.speech.ctc.augment`, per window, seeded by
   `--seed`, shard and window). Consecutive utterances are packed into windows of up to `--window-s`
   (20) s with `--gap-s` (0.3) s of silence between them; the target is their `normalize_text`-ed
   texts joined by a space. Each window's variable-length log-mel (`log_mel_variable`) goes through
   the encoder once (`encode_variable`, `--encode-batch` (4) windows at a time), and the states of
   every exit layer (`--exit-layers`, default 2,4,6 for base) are kept in fp16 with the label ids.
   Shards of `--shard-windows` (64) windows are written to `<out>/features/shard_NNNNN.pt`
   atomically; existing shards are skipped, so the stage resumes. `<out>/features/plan.json`
   records the settings the shards were made with; a run with other settings stops with an error.
   A 20 s window keeps 3 x 1000 x 512 fp16 values (3 MB): ~1000 windows per copy of the default
   corpus, so ~6 GB on disk and in memory for 2 copies.
3. `train`: all shards in memory (this run's and those of `--extra-features` folders); every head trains
   jointly (sum of the heads' CTC losses, blank 0, `zero_infinity`), AdamW (`--lr` 1.5e-3, betas
   0.9/0.98, `--weight-decay` 0.01, gradient norm clipped to 1), linear warm-up over `--warmup` (60)
   steps then cosine to 10 %, `--steps` (600) steps of `--batch-size` (4) windows drawn at random.
   Heads: `--width` (256), `--heads` (4), `--layers` (1), `--dropout` (0.1), `--stride` (1; 2 stacks
   pairs of encoder frames into one 40-ms output frame, half the frames for a frame-synchronous
   decoder). `--init DIR` starts the heads from a saved model's (a stride-1 head starts a stride-2 one
   reading the mean of its two frames). (A stride-1 step costs ~2 s on 2 CPU cores alone, ~3.9 s beside
   another training run; stride 2 ~1.5 s on one core beside two other jobs.) A checkpoint (heads,
   optimiser, schedule, step, RNG states) goes to `<out>/last.pt` every `--checkpoint-every` (100) steps
   and at the end; a run finding one resumes from it.
4. `eval`: greedy CTC WER (`mmaccel.metrics.wer.corpus_wer`, Whisper's English normaliser on both
   sides) of every exit head on the first `--eval-limit` (200) held-out utterances (held-out
   voices and sentences) and on `real_utterances()` (LibriVox, cards and ALSA clips), in batches of
   `--eval-batch` (8). Early exit (entropy criterion): for each budget in `--budgets` (0.5,0.75)
   the threshold is picked on the first half of the held-out set (`pick_threshold`) and the WER and
   encoder cost reported on the second half and on the real clips. Writes `<out>/eval.json`.
5. `export`: `WhisperCTC.save(--export-dir)` (default `mmaccel/assets/ctc_whisper_base`), with the
   command line, the training settings and the eval numbers in the info dict.

Other defaults: `--model builtin:base`, `--threads 0` (torch's default), `--seed 0`,
`--log-every 20` steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from mmaccel.errors import InputError, MMAccelError, check
from mmaccel.paths import assets_dir, default_cache_dir
from mmaccel.progress import progress, say
from mmaccel.speech.audio import SAMPLE_RATE, WINDOW_S, load_audio
from mmaccel.speech.ctc.augment import augment
from mmaccel.speech.ctc.beam import ctc_greedy
from mmaccel.speech.ctc.early_exit import early_exit, encoder_cost, pick_threshold
from mmaccel.speech.ctc.train_loop import collate, ctc_losses, init_heads, train_heads  # noqa: F401  (re-exported)
from mmaccel.speech.ctc.train_windows import (  # noqa: F401  (plan_windows: re-exported)
    encode_windows,
    load_windows,
    pack,
    plan_windows,
    window_plan,
)
from mmaccel.speech.ctc.whisper_ctc import WhisperCTC, character_vocab, normalize_text
from mmaccel.speech.data import TEXTS, Utterance, build_tts_corpus, read_manifest, real_utterances, write_manifest
from mmaccel.speech.train.common import log as log_line
from mmaccel.speech.train.common import release_freed_memory

STAGES = ("corpus", "features", "train", "eval", "export")


# ---- stages: corpus and features --------------------------------------------------------------------


def stage_corpus(args, out: Path) -> None:
    corpus = Path(args.corpus)
    for split, text, n, per in (("train", args.text, args.sentences, args.voices_per_sentence),
                                ("eval", "fortunes", None, 2)):
        log_line(out, f"corpus: speaking the {split} split of the {text} text into {corpus} (existing wavs kept)")
        t0 = time.time()
        manifest = build_tts_corpus(corpus, split, max_sentences=n, voices_per_sentence=per, text=text,
                                    noisy=text == "varied")
        utterances = read_manifest(manifest)
        write_manifest(out / "corpus" / f"{split}.jsonl", utterances)
        hours = sum(u.duration for u in utterances) / 3600
        log_line(out, f"corpus: {split}: {len(utterances)} utterances, {hours:.2f} h, {time.time() - t0:.0f} s")


def _corpus(out: Path, split: str) -> list[Utterance]:
    path = out / "corpus" / f"{split}.jsonl"
    if not path.is_file():
        raise InputError(f"{path} not found: run the corpus stage first (--stages corpus,...)")
    return read_manifest(path)


def stage_features(args, out: Path, ctc: WhisperCTC) -> None:
    utterances = _corpus(out, "train")
    folder = out / "features"
    folder.mkdir(parents=True, exist_ok=True)
    plan_info = {"model": args.model, "exit_layers": list(ctc.exit_layers), "copies": args.copies,
                 "window_s": args.window_s, "gap_s": args.gap_s, "shard_windows": args.shard_windows,
                 "seed": args.seed, "utterances": len(utterances)}
    plan_file = folder / "plan.json"
    if plan_file.is_file():
        old = json.loads(plan_file.read_text())
        check(old == plan_info, f"{folder} holds features made with {old}, this run asks for {plan_info}: use "
              "another --out, or delete the features folder")
    else:
        plan_file.write_text(json.dumps(plan_info, indent=1))
    check(args.window_s / 0.9 <= WINDOW_S, f"--window-s {args.window_s} slowed down by 0.9 exceeds Whisper's "
          f"{WINDOW_S:.0f} s; use at most {WINDOW_S * 0.9:.0f}")
    windows = window_plan(utterances, args.copies, args.window_s, args.gap_s, args.seed)
    shards = [windows[i:i + args.shard_windows] for i in range(0, len(windows), args.shard_windows)]
    todo = [i for i in range(len(shards)) if not (folder / f"shard_{i:05d}.pt").is_file()]
    log_line(out, f"features: {len(windows)} windows of up to {args.window_s} s ({args.copies} copies of "
                  f"{len(utterances)} utterances) in {len(shards)} shards, {len(todo)} to compute")
    vocab, t_start, done = ctc.vocab, time.time(), 0
    for i in progress(todo, desc="features", unit="shard"):
        t0 = time.time()
        shard = shards[i]
        needed = sorted({u for _, w in shard for u in w})
        audio = {u: load_audio(utterances[u].audio_filepath).samples for u in needed}
        items = []
        for j, (copy, window) in enumerate(shard):
            samples = pack([audio[u] for u in window], args.gap_s)
            if copy > 0:
                others = [audio[u] for u in needed if u not in window]
                samples = augment(samples, np.random.default_rng([args.seed, i, j]), others)
            text = " ".join(t for t in (normalize_text(utterances[u].text) for u in window) if t)
            items.append({"samples": samples, "text": text, "copy": copy,
                          "ids": [utterances[u].id for u in window]})
        rows = encode_windows(ctc, items, args.encode_batch)
        for item, row in zip(items, rows):
            row.update(labels=torch.tensor(vocab.encode(item["text"]), dtype=torch.int32), text=item["text"],
                       copy=item["copy"], ids=item["ids"], seconds=len(item["samples"]) / SAMPLE_RATE)
        path = folder / f"shard_{i:05d}.pt"
        tmp = path.with_suffix(".tmp")
        torch.save({"windows": rows, "exit_layers": list(ctc.exit_layers)}, tmp)
        tmp.replace(path)
        del rows, items, audio
        release_freed_memory()
        done += 1
        seconds = time.time() - t0
        log_line(out, f"features: shard {i + 1}/{len(shards)} ({len(shard)} windows) in {seconds:.0f} s, "
                      f"{seconds / len(shard):.2f} s/window; {done}/{len(todo)} done in {time.time() - t_start:.0f} s")


# ---- training ------------------------------------------------------------------------------------


def stage_train(args, out: Path, ctc: WhisperCTC) -> None:
    t0 = time.time()
    windows = load_windows([out / "features", *map(Path, args.extra_features)], ctc.exit_layers)
    hours = sum(w["hidden"][ctc.exit_layers[0]].shape[0] for w in windows) * ctc.frame_seconds / 3600
    log_line(out, f"train: {len(windows)} windows ({hours:.1f} h) loaded in {time.time() - t0:.0f} s; heads at layers "
                  f"{list(ctc.exit_layers)}, {sum(p.numel() for p in ctc.heads.parameters()) / 1e6:.2f} M parameters")
    torch.manual_seed(args.seed)
    train_heads(ctc.heads, windows, steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup=args.warmup,
                weight_decay=args.weight_decay, seed=args.seed, checkpoint=out / "last.pt",
                checkpoint_every=args.checkpoint_every, log_every=args.log_every, log=lambda m: log_line(out, m))


def load_trained(ctc: WhisperCTC, out: Path) -> None:
    path = out / "last.pt"
    if not path.is_file():
        raise InputError(f"{path} not found: run the train stage first")
    ctc.heads.load_state_dict(torch.load(path)["heads"])
    ctc.eval()


# ---- evaluation ----------------------------------------------------------------------------------


def all_log_probs(ctc: WhisperCTC, utterances: Sequence[Utterance], batch: int) -> tuple[dict[int, Tensor], Tensor]:
    """Every head's log-probabilities of every utterance, padded to one length: ({layer: [N, T, V]}, lengths [N])."""
    parts: dict[int, list[Tensor]] = {k: [] for k in ctc.exit_layers}
    lengths = []
    for start in range(0, len(utterances), batch):
        audios = [load_audio(u.audio_filepath) for u in utterances[start:start + batch]]
        for k, (lp, n) in ctc.log_probs_all(audios).items():  # noqa: B007 (every head gives the same lengths)
            parts[k].append(lp)
        lengths.append(n)
    T = max(p.shape[1] for p in parts[ctc.exit_layers[0]])
    padded = {k: torch.cat([F.pad(p, (0, 0, 0, T - p.shape[1])) for p in v]) for k, v in parts.items()}
    return padded, torch.cat(lengths)


def _wer(ctc: WhisperCTC, log_probs: Tensor, lengths: Tensor, refs: list[str]) -> dict:
    from mmaccel.metrics.wer import corpus_wer

    hyps = [h.text for h in ctc_greedy(log_probs, ctc.vocab, lengths, frame_seconds=ctc.frame_seconds)]
    return corpus_wer(refs, hyps).to_dict()


def evaluate(ctc: WhisperCTC, sets: dict[str, list[Utterance]], budgets: Sequence[float], batch: int) -> dict:
    """Per-head greedy WER on each set; early exit with thresholds picked on the first half of `tts_eval`."""
    result: dict = {"heads": {}, "early_exit": {}}
    scored = {}
    for name, utterances in sets.items():
        lps, lengths = all_log_probs(ctc, utterances, batch)
        scored[name] = (lps, lengths, [u.text for u in utterances])
        result["heads"][name] = {str(k): _wer(ctc, lps[k], lengths, scored[name][2]) for k in ctc.exit_layers}
    lps, lengths, refs = scored["tts_eval"]
    half = len(refs) // 2
    dev = {k: v[:half] for k, v in lps.items()}
    tests = {"tts_eval_second_half": ({k: v[half:] for k, v in lps.items()}, lengths[half:], refs[half:])}
    if "real" in scored:
        tests["real"] = scored["real"]
    for budget in budgets:
        entry: dict = {}
        try:
            threshold = pick_threshold(dev, lengths[:half], ctc.num_layers, budget, "entropy")
        except InputError as err:
            result["early_exit"][str(budget)] = {"error": str(err)}
            continue
        entry["threshold"] = threshold
        for name, (lp, n, r) in tests.items():
            chosen = early_exit(lp, n, "entropy", threshold)
            exits = {str(k): int((chosen.layers == k).sum()) for k in ctc.exit_layers}
            entry[name] = {**_wer(ctc, chosen.log_probs, n, r),
                           "encoder_cost": round(encoder_cost(chosen.layers, ctc.num_layers), 4), "exits": exits}
        result["early_exit"][str(budget)] = entry
    return result


def stage_eval(args, out: Path, ctc: WhisperCTC) -> dict:
    load_trained(ctc, out)
    sets = {"tts_eval": _corpus(out, "eval")[:args.eval_limit]}
    try:
        sets["real"] = [u for u in real_utterances() if u.duration <= WINDOW_S]
    except FileNotFoundError as err:
        log_line(out, f"eval: no real clips ({err})")
    t0 = time.time()
    result = evaluate(ctc, sets, args.budgets, args.eval_batch)
    result["seconds"] = round(time.time() - t0, 1)
    (out / "eval.json").write_text(json.dumps(result, indent=1))
    log_line(out, f"eval: {json.dumps(result)}")
    return result


def stage_export(args, out: Path, ctc: WhisperCTC, command: str) -> Path:
    load_trained(ctc, out)
    evaluation = json.loads((out / "eval.json").read_text()) if (out / "eval.json").is_file() else None
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "stages", "export_dir")}
    path = ctc.save(args.export_dir, info={"command": command, "train": settings, "eval": evaluation})
    log_line(out, f"export: wrote {path}")
    return path


# ---- command line ----------------------------------------------------------------------------------


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mmaccel.speech.ctc.train", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", required=True,
                   help="run folder (corpus manifests, features, last.pt, eval.json, train.log)")
    p.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset of " + ",".join(STAGES))
    p.add_argument("--model", default="builtin:base", help="the Whisper whose encoder the heads read")
    p.add_argument("--exit-layers", type=_ints, default=None,
                   help="encoder layers with a head (default: 2,4,6 for base)")
    p.add_argument("--corpus", default=str(default_cache_dir() / "speech" / "tts"), help="TTS corpus folder")
    p.add_argument("--text", choices=TEXTS, default="fortunes",
                   help="the training sentences: fortunes, or varied (man pages, docstrings and fortunes, every "
                        "other utterance augmented; `mmaccel.speech.data.varied_sentences`); the eval split is "
                        "always the held-out fortunes")
    p.add_argument("--sentences", type=int, default=1500, help="train-split sentences to speak")
    p.add_argument("--voices-per-sentence", type=int, default=3, help="training voices per sentence")
    p.add_argument("--copies", type=int, default=2,
                   help="passes over the training audio (copy 0 clean, others augmented)")
    p.add_argument("--window-s", type=float, default=20.0, help="longest training window, seconds")
    p.add_argument("--gap-s", type=float, default=0.3, help="silence between packed utterances, seconds")
    p.add_argument("--shard-windows", type=int, default=64, help="windows per feature shard")
    p.add_argument("--encode-batch", type=int, default=4, help="windows per encoder batch")
    p.add_argument("--width", type=int, default=256, help="head width")
    p.add_argument("--heads", type=int, default=4, help="attention heads per head layer")
    p.add_argument("--layers", type=int, default=1, help="Transformer layers per head")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--stride", type=int, default=1, help="encoder frames per output frame (2: 40 ms frames)")
    p.add_argument("--extra-features", nargs="*", default=[],
                   help="feature folders of other runs (same encoder and exit layers) trained on beside this run's")
    p.add_argument("--init", default=None,
                   help="a saved model directory whose heads training starts from (same exit layers and sizes; "
                        "a stride-1 head starts a longer-stride one reading the mean of its frames)")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch-size", type=int, default=4, help="windows per step")
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--warmup", type=int, default=60, help="linear warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--eval-limit", type=int, default=200, help="held-out utterances to evaluate")
    p.add_argument("--eval-batch", type=int, default=8)
    p.add_argument("--budgets", type=_floats, default=(0.5, 0.75), help="early-exit encoder budgets to report")
    p.add_argument("--export-dir", default=str(assets_dir() / "ctc_whisper_base"))
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    stages = [s for s in args.stages.split(",") if s]
    unknown = [s for s in stages if s not in STAGES]
    check(not unknown, f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    check(args.copies >= 1 and args.window_s > 0 and args.gap_s >= 0, "--copies >= 1, --window-s > 0, --gap-s >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m mmaccel.speech.ctc.train " + " ".join(argv)
    log_line(out, f"start: {command} (stages {', '.join(stages)})")
    if "corpus" in stages:
        stage_corpus(args, out)
    rest = [s for s in stages if s != "corpus"]
    if not rest:
        return
    from mmaccel.speech.whisper import load_whisper

    torch.manual_seed(args.seed)
    ctc = WhisperCTC(load_whisper(args.model), args.exit_layers, width=args.width, heads=args.heads,
                     layers=args.layers, dropout=args.dropout, stride=args.stride, source=args.model,
                     vocab=character_vocab())
    if args.init and "train" in stages:
        init_heads(ctc, Path(args.init))
    if "features" in stages:
        stage_features(args, out, ctc)
    if "train" in stages:
        stage_train(args, out, ctc)
    if "eval" in stages:
        stage_eval(args, out, ctc)
    if "export" in stages:
        stage_export(args, out, ctc, command)


if __name__ == "__main__":
    try:
        main()
    except MMAccelError as err:
        say(f"mmaccel.speech.ctc.train: error: {err}")
        sys.exit(2)
