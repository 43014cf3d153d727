"""`mmaccel eval fid | image | wer`: the argparse definitions and the commands.

Each command runs as one process, or unchanged under `torchrun --nproc-per-node N` / `accelerate
launch` (see `mmaccel.eval.distributed`); rank 0 prints the summary JSON to stdout and writes the
files. Heavy imports happen inside the commands, so building the parser stays cheap.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mmaccel.cli.options import (
    add_draft_option,
    add_out_option,
    add_param_option,
    add_sampling_options,
    add_seed_option,
)
from mmaccel.devices import add_device_option
from mmaccel.progress import say


def _print_summary(summary: dict | None) -> None:
    if summary is not None:                      # rank 0 only
        print(json.dumps(summary, indent=2))


def cmd_eval_fid(args: argparse.Namespace) -> int:
    from mmaccel.eval.distributed import distributed
    from mmaccel.eval.fid import evaluate_fid
    from mmaccel.eval.rundir import write_json_atomic

    with distributed(args.threads) as dist:
        report = evaluate_fid(args.samples, args.reference, args.features, dist, args.bootstrap_rounds)
        if report is not None and args.out:
            write_json_atomic(Path(args.out).expanduser(), report)
    _print_summary(report)
    return 0


def cmd_eval_image(args: argparse.Namespace) -> int:
    from mmaccel.eval.distributed import distributed
    from mmaccel.eval.image import evaluate_image_method

    with distributed(args.threads) as dist:
        summary = evaluate_image_method(
            args.out, method=args.method, params=dict(args.param), num_samples=args.num_samples,
            batch_size=args.batch_size, dist=dist, seed=args.seed, cfg_scale=args.cfg_scale,
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, model=args.model, vq=args.vq,
            draft=args.draft, features=args.features, reference=args.reference,
            bootstrap_rounds=args.bootstrap_rounds, overwrite=args.overwrite, log=say, device=args.device)
    _print_summary(summary)
    return 0


def cmd_eval_wer(args: argparse.Namespace) -> int:
    from mmaccel.eval.distributed import distributed
    from mmaccel.eval.wer import evaluate_asr_method

    with distributed(args.threads) as dist:
        summary = evaluate_asr_method(
            args.out, audio=args.audio, method=args.method, params=dict(args.param), batch_size=args.batch_size,
            dist=dist, model=args.model, heads=args.heads, draft=args.draft, assistant=args.assistant,
            language=args.language, compare_greedy=args.compare_greedy, overwrite=args.overwrite, log=say,
            device=args.device, vad=args.vad)
    _print_summary(summary)
    if summary is not None and summary["failed"]:
        say(f"mmaccel: {summary['failed']} utterance(s) could not be transcribed: see 'error' in "
            f"{Path(args.out) / 'utterances.jsonl'}")
        return 1
    return 0


def add_eval_parser(subparsers) -> argparse.ArgumentParser:
    """Register `eval fid`, `eval image` and `eval wer` on the top-level subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--threads", type=int, default=None,
                        help="torch threads per process (default: usable cores / processes on this node); pass the "
                             "same value to reproduce a run with another number of processes bit for bit")
    fid_options = argparse.ArgumentParser(add_help=False)
    fid_options.add_argument("--features", default="inception",
                             help="FID feature extractor: inception (the standard FID Inception) or domain (the "
                                  "Fashion-MNIST classifier, ~300x faster; only comparable between domain runs)")
    fid_options.add_argument("--bootstrap-rounds", type=int, default=10,
                             help="bootstrap resamples for the FID's standard deviation (0: none)")

    ev = subparsers.add_parser("eval", help="evaluation runs (FID, sample sets, WER); shard over torchrun / accelerate")
    ev_sub = ev.add_subparsers(dest="eval_command", required=True)

    f = ev_sub.add_parser("fid", parents=[common, fid_options], help="FID of an image folder or .npz against a reference")
    f.add_argument("--samples", required=True,
                   help="folder of PNG/JPEG images (searched recursively) or .npz (arr_0 or images: uint8 [N,H,W(,C)])")
    f.add_argument("--reference", default="fashion-mnist-test",
                   help="fashion-mnist-test (the test split at the samples' resolution, statistics cached) or an "
                        "image folder / .npz")
    add_out_option(f, "also write the report JSON here")
    f.set_defaults(func=cmd_eval_fid)
    _add_eval_image(ev_sub, [common, fid_options])
    _add_eval_wer(ev_sub, [common])
    return ev


def _add_eval_image(ev_sub, parents: list[argparse.ArgumentParser]) -> None:
    i = ev_sub.add_parser("image", parents=parents,
                          help="generate N class-balanced samples with a method, save PNGs, score FID and NFE")
    i.add_argument("--method", default="ar")
    add_param_option(i, "window=16")
    i.add_argument("--num-samples", type=int, required=True, help="samples to generate (labels i mod classes)")
    i.add_argument("--batch-size", type=int, default=16, help="samples per batch (batch j is seeded --seed + j)")
    add_out_option(i, "run directory (resumed when rerun with the same config)", required=True)
    i.add_argument("--overwrite", action="store_true", help="delete the earlier outputs in --out and start again")
    i.add_argument("--model", default="builtin:fashion-mnist",
                   help="builtin:fashion-mnist, a directory with gpt.* and vq.*, or a GPT checkpoint (with --vq)")
    i.add_argument("--vq", default=None, help="tokenizer checkpoint when --model is a GPT file")
    add_draft_option(i, "builtin", "drafter checkpoint, 'builtin' or 'none'")
    add_sampling_options(i, temperature=1.0, cfg_scale=2.0)
    add_seed_option(i, "seed of the first batch (batch j is seeded --seed + j)")
    i.add_argument("--reference", default="fashion-mnist-test",
                   help="fashion-mnist-test, an image folder / .npz, or none (no FID)")
    add_device_option(i)
    i.set_defaults(func=cmd_eval_image)


def _add_eval_wer(ev_sub, parents: list[argparse.ArgumentParser]) -> None:
    w = ev_sub.add_parser("wer", parents=parents, help="transcribe a test set with a method, score WER and RTFx")
    w.add_argument("--audio", required=True,
                   help="JSONL manifest (audio_filepath, text, duration) or a folder of audio files (reference: "
                        "sibling NAME.txt)")
    w.add_argument("--model", default="builtin:base", help="builtin:base, builtin:tiny.en or a local HF Whisper directory")
    w.add_argument("--method", default="greedy")
    add_param_option(w, "k=8")
    w.add_argument("--heads", default="auto", help="heads file(s), comma-separated, 'auto' or 'none'")
    add_draft_option(w, "auto", "draft decoder file, 'auto' or 'none'")
    w.add_argument("--assistant", default=None, help="another Whisper for speculative-cross")
    w.add_argument("--batch-size", type=int, default=8)
    w.add_argument("--language", default="en")
    add_out_option(w, "run directory (resumed when rerun with the same config)", required=True)
    w.add_argument("--overwrite", action="store_true", help="delete the earlier outputs in --out and start again")
    w.add_argument("--compare-greedy", action="store_true",
                   help="also run greedy on every batch in the same process and report the speed-ups")
    w.add_argument("--vad", default="off", choices=("off", "on", "both"),
                   help="on: decode only the speech Silero VAD finds; both: also a VAD run of every batch, "
                        "its WER beside the plain one")
    add_device_option(w)
    w.set_defaults(func=cmd_eval_wer)
