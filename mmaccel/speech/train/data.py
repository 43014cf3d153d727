"""Self-labelled training data for Whisper drafts (Medusa / exit heads, draft decoders).

The target transcribes the synthetic TTS corpus (`mmaccel.speech.data`) with its own greedy
decoder (self-distillation: greedy verification only needs the draft's arg-max to agree with the
target's), then one teacher-forced pass over prompt + transcript keeps per position the final hidden
state and every layer's output, plus the encoder states of the utterance (fp16, [S, d]) for
training drafts that cross-attend to the audio. With `--timestamp-every K`, every K-th chunk is
labelled in Whisper's timestamp mode (its prompt without <|notimestamps|>, its transcript with the
timestamp tokens the rules let the target write), so drafts learn both modes. Chunks of `batch_size`
utterances are written atomically, so an interrupted collection resumes where it stopped.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mmaccel.errors import check
from mmaccel.paths import default_cache_dir
from mmaccel.progress import progress
from mmaccel.speech.audio import load_audio, log_mel
from mmaccel.speech.data import TEXTS, build_tts_corpus, read_manifest
from mmaccel.speech.train.common import log, release_freed_memory

if TYPE_CHECKING:
    from mmaccel.speech.pipeline import ASRPipeline


@dataclass
class Run:
    """A speech training run after its common set-up and the `data` stage."""

    args: argparse.Namespace
    out: Path
    stages: list[str]
    asr: ASRPipeline
    train_dir: Path
    eval_dir: Path
    info: dict                   # stored with the trained file: the command and the model


def start_run(p: argparse.ArgumentParser, argv: list[str] | None, module: str, stages: tuple[str, ...]) -> Run:
    """Add the shared options to `p` (model, output, data, stages, threads, seed), parse `argv`,
    load the target (no drafts), and run the `data` stage if asked."""
    from mmaccel.speech.pipeline import ASRPipeline

    p.add_argument("--model", default="builtin:base")
    p.add_argument("--out", required=True)
    _add_data_arguments(p)
    p.add_argument("--stages", default=",".join(stages))
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave the default)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    asr = ASRPipeline.from_pretrained(args.model, heads=None, draft=None)
    train_dir, eval_dir = data_dirs(args, out)
    run = Run(args, out, args.stages.split(","), asr, train_dir, eval_dir,
              {"command": f"python -m {module} " + " ".join(argv or []), "model": args.model})
    if "data" in run.stages:
        collect_splits(asr, args, out)
    return run


def _add_data_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", default=str(default_cache_dir() / "speech" / "tts"),
                   help="TTS corpus folder (train.jsonl / eval.jsonl; built if missing)")
    p.add_argument("--data", default=None, help="self-labelled data folder (default: <out>); shareable between scripts")
    p.add_argument("--text", choices=TEXTS, default="fortunes",
                   help="training text: fortunes quotations (2 voices a sentence, clean) or varied (man pages, "
                        "Python docstrings and quotations in turn; 1 voice a sentence, every other one augmented)")
    p.add_argument("--train-sentences", type=int, default=1500, help="sentences of the train split to speak")
    p.add_argument("--limit", type=int, default=None, help="use only the first N training utterances")
    p.add_argument("--eval-limit", type=int, default=160, help="evaluate on the first N held-out utterances")
    p.add_argument("--batch-size", type=int, default=8, help="utterances per labelling batch")
    p.add_argument("--timestamp-every", type=int, default=0,
                   help="label every K-th chunk in timestamp mode (0: none; 2: every other chunk)")
    p.add_argument("--from-end", action="store_true",
                   help="label the chunks last to first (a second process beside one walking them in order)")


def data_dirs(args, out: Path) -> tuple[Path, Path]:
    root = Path(args.data) if args.data else out
    return root / "data", root / "eval_data"


def manifest_paths(args) -> dict[str, Path]:
    """The corpus manifests of the train and eval splits of `--text`."""
    prefix = "" if args.text == "fortunes" else f"{args.text}_"
    return {split: Path(args.corpus) / f"{prefix}{split}.jsonl" for split in ("train", "eval")}


def text_tokens(tokenizer, text: str) -> torch.Tensor:
    """The distinct token ids of every training sentence of `text` (`TEXTS`), tokenised as a
    transcript's first word (after a space) and as running text."""
    from mmaccel.speech.data import sentences, varied_sentences

    found = set()
    for sentence in sentences("train") if text == "fortunes" else varied_sentences("train"):
        for form in (" " + sentence, sentence):
            found.update(tokenizer.encode(form, add_special_tokens=False))
    return torch.tensor(sorted(found), dtype=torch.long)


def with_timestamps(rows: list[dict], no_timestamps: int) -> bool:
    """Whether some rows were labelled in timestamp mode (their prompt lacks <|notimestamps|>): a draft trained
    on them reads timestamp tokens as they are (`WhisperDraft.timestamps`)."""
    return any(no_timestamps not in r["tokens"][: r["prompt_len"]].tolist() for r in rows)


def training_shortlist(rows: list[dict], args, tokenizer, start: torch.Tensor | None) -> torch.Tensor:
    """The read-out shortlist of a draft: the transcripts' tokens; with `--shortlist-text` also every token of
    the training text of `--text` and `start`, the shortlist of the file training starts from (`--init`)."""
    found = [r["tokens"][r["prompt_len"]:] for r in rows]
    if args.shortlist_text:
        found += [text_tokens(tokenizer, args.text)] + ([start] if args.init and start is not None else [])
    return torch.unique(torch.cat(found))


def collect_splits(asr, args, out: Path) -> None:
    """Speak the corpus (the train split up to `--train-sentences`; existing files are kept, so a
    larger number extends it), then label the train split (up to `--limit`) and the eval split."""
    corpus = Path(args.corpus)
    options = {} if args.text == "fortunes" else {"text": "varied", "voices_per_sentence": 1, "noisy": True,
                                                  "seed": args.seed}
    for split, n in (("train", args.train_sentences), ("eval", None if args.text == "fortunes" else args.eval_limit)):
        log(out, f"building the {args.text} {split} TTS corpus in {corpus} (kept where present)")
        build_tts_corpus(corpus, split, max_sentences=n, **options)
    train_dir, eval_dir = data_dirs(args, out)
    manifests = manifest_paths(args)
    for manifest, folder, limit in ((manifests["train"], train_dir, args.limit),
                                    (manifests["eval"], eval_dir, args.eval_limit)):
        collect(asr, manifest, folder, args.batch_size, limit, out, args.from_end, args.timestamp_every)


def collect(asr, manifest: Path, folder: Path, batch_size: int, limit: int | None, out: Path,
            from_end: bool = False, timestamp_every: int = 0) -> None:
    """Self-labelled rows, one chunk file per batch of utterances (chunks already written are kept);
    chunk i is labelled in timestamp mode when `timestamp_every` divides i + 1."""
    from mmaccel.core.speculative import LoopConfig, decode
    from mmaccel.speech.pipeline import MAX_NEW_TOKENS
    from mmaccel.speech.timestamps import TimestampRules

    check(timestamp_every >= 0, f"--timestamp-every must be >= 0, got {timestamp_every}")
    utterances = read_manifest(manifest)[:limit]
    folder.mkdir(parents=True, exist_ok=True)
    model, marks = asr.model, asr.bundle.tokens
    eot = marks.end_of_text
    t0 = time.time()
    starts = range(0, len(utterances), batch_size)
    for start in progress(starts[::-1] if from_end else starts, desc=f"data {folder.name}", unit="batch"):
        path = folder / f"chunk_{start // batch_size:05d}.pt"
        if path.is_file():
            continue
        batch = utterances[start : start + batch_size]
        timestamps = timestamp_every > 0 and (start // batch_size + 1) % timestamp_every == 0
        prompt = asr.bundle.prompt("en", timestamps=timestamps)
        rules = TimestampRules(marks.no_timestamps, eot, len(prompt)) if timestamps else None
        features = log_mel(asr.bundle.feature_extractor, [load_audio(u.audio_filepath) for u in batch])
        inputs = model.encode(features, prompt, rules=rules)
        gen = decode(model, inputs, LoopConfig(), max_new_tokens=MAX_NEW_TOKENS, eos_token_id=eot)
        T = max(len(g) for g in gen.tokens)
        tokens = torch.full((len(batch), T), eot, dtype=torch.long)
        for b, g in enumerate(gen.tokens):
            tokens[b, : len(g)] = torch.tensor(g)
        final, layers = model.teacher_forced(inputs, tokens)
        P = len(prompt)
        rows = []
        for b, g in enumerate(gen.tokens):
            n = len(g)                                      # positions P-1 .. P+n-2 predict the n tokens
            rows.append({"id": batch[b].id, "tokens": torch.tensor(prompt + g), "prompt_len": P,
                         "final": final[b, P - 1 : P + n - 1].half().clone(),
                         "layers": torch.stack([h[b, P - 1 : P + n - 1] for h in layers]).half().clone(),
                         "encoder": inputs.encoder_states[b].half().clone()})
        tmp = path.with_suffix(".tmp")
        torch.save(rows, tmp)
        tmp.replace(path)
        log(out, f"data {folder.name}: {start + len(batch)}/{len(utterances)} utterances, {time.time() - t0:.0f} s")


def load_rows(folder: Path, limit: int | None = None, keep: tuple[str, ...] | None = None,
              each: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """The rows of every chunk in `folder` (the first `limit`), with only the `keep` fields if given;
    `each` sees every chunk's rows as they are read (to replace bulky fields before the next chunk)."""
    rows = []
    for path in sorted(folder.glob("chunk_*.pt")):
        chunk = torch.load(path)
        chunk = chunk if keep is None else [{k: r[k] for k in keep} for r in chunk]
        if each is not None:
            each(chunk)
            release_freed_memory()
        rows += chunk
        if limit is not None and len(rows) >= limit:
            return rows[:limit]
    return rows
