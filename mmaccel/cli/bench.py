"""`mmaccel bench SUITE`: one dispatch over a table of benchmark suites (or `report` to refresh the README tables).

Every suite says which options it takes (others are refused), which of them the result document's
"command" records and in what order, where it writes by default and how: JSON and Markdown beside it
(the harness suites add a plot and their artifacts). `--out` and `--threads` apply to every suite.
"""

from __future__ import annotations

import argparse
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mmaccel.cli.options import add_out_option, key_value
from mmaccel.devices import add_device_option
from mmaccel.errors import InputError
from mmaccel.progress import say

SUITE_OPTIONS = ("samples", "inception_samples", "model", "heads", "draft", "device", "cuda_graphs", "split", "timestamps",
                 "vad")
CHECKED = ("quick", "methods", *SUITE_OPTIONS)     # the options a suite takes or refuses, in the order they are named
MINIMUM = {"samples": 2, "inception_samples": 0}
IMAGE_FID_MODEL = "builtin:fashion-mnist"
IMAGE_FID_OUT = {"builtin:fashion-mnist": "image_fid.json", "builtin:fashion-mnist-sjd2": "image-sjd2_fid.json",
                 "builtin:fashion-mnist-mar": "image-continuous_fid.json", "builtin:fashion-mnist-var": "image-scale_fid.json"}


@dataclass
class BenchRun:
    """A finished run: its result document, the table printed at the end, and how to write both."""

    doc: dict
    table: str
    write: Callable[[Path], list[Path]]        # out.json -> the files written (reads doc["command"] when called)


@dataclass(frozen=True)
class BenchSuite:
    """One row of the `mmaccel bench` table."""

    takes: tuple[str, ...]                     # the options of CHECKED it takes: any other one given is refused
    records: tuple[str, ...]                   # options recorded in doc["command"], in this order (when given)
    refusal: Callable[[str, tuple[str, ...], list[str]], str]   # (suite, takes, refused flags) -> the error
    run: Callable[[argparse.Namespace], BenchRun]
    default_out: Callable[[argparse.Namespace], str] | None = None   # None: NAME.json (NAME-quick.json with --quick)


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def _given(args: argparse.Namespace, option: str) -> bool:
    value = getattr(args, option)
    return value is not None and value is not False


def _does_not_apply(name: str, takes: tuple[str, ...], flags: list[str]) -> str:
    return f"{flags[0]} does not apply to the {name!r} suite"


def _takes_only(name: str, takes: tuple[str, ...], flags: list[str]) -> str:
    allowed = [_flag(o) for o in takes]
    return f"{name} takes {', '.join(allowed)} and --out, not {', '.join(flags)}"


def method_specs(text: str | None):
    """'speculative:k=6,ngram' -> [ar, speculative(k=6), ngram] (the AR baseline first), None when not given."""
    from mmaccel.bench.harness import MethodSpec

    if not text:
        return None
    specs = [MethodSpec("ar")]
    for item in text.split(","):  # name or name:key=value:key=value
        name, *kvs = item.strip().split(":")
        if name and name != "ar":
            specs.append(MethodSpec(name, dict(key_value(kv) for kv in kvs), label=item.strip() if kvs else None))
    return specs


def _write_document(doc: dict, out: Path, markdown: str, plot: Callable[[dict, Path], None] | None = None) -> list[Path]:
    """`out` (JSON), the Markdown beside it and, with `plot`, its figure (.png)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown)
    if plot is None:
        return [out, out.with_suffix(".md")]
    plot(doc, out.with_suffix(".png"))
    return [out, out.with_suffix(".md"), out.with_suffix(".png")]


def _harness(name: str) -> Callable[[argparse.Namespace], BenchRun]:
    """A suite of `mmaccel.bench.SUITES`: every method against the AR baseline through `run_suite`."""
    def run(args: argparse.Namespace) -> BenchRun:
        from mmaccel.bench import SUITES
        from mmaccel.bench.harness import markdown_table, run_suite, write_results

        options = {o: getattr(args, o) for o in SUITE_OPTIONS if _given(args, o)}
        suite = SUITES[name](quick=args.quick, methods=method_specs(args.methods), **options)
        doc = run_suite(suite, log=say)

        def write(out: Path) -> list[Path]:
            paths = write_results(doc, out, suite.primary_quality)
            return paths + (suite.artifacts(out) if suite.artifacts is not None else [])
        return BenchRun(doc, markdown_table(doc), write)
    return run


def _run_image_fid(args: argparse.Namespace) -> BenchRun:
    from mmaccel.bench.image_fid import markdown, run_image_fid
    from mmaccel.bench.image_suite import DEFAULT_METHODS, FULL_SAMPLES

    samples = FULL_SAMPLES if args.samples is None else args.samples
    doc = run_image_fid(method_specs(args.methods) or DEFAULT_METHODS, samples, log=say,
                        model=args.model or IMAGE_FID_MODEL)
    return BenchRun(doc, markdown(doc), lambda out: _write_document(
        doc, out, f"# Benchmark `image-fid`\n\n`{doc['command']}`\n\nConfig: `{json.dumps(doc['config'])}`\n\n{markdown(doc)}"))


def _run_kernels(args: argparse.Namespace) -> BenchRun:
    from mmaccel.bench.kernels_suite import markdown, run_kernels

    doc = run_kernels(args.device or "cpu", quick=args.quick, log=say)
    return BenchRun(doc, markdown(doc), lambda out: _write_document(
        doc, out, f"# Benchmark `kernels`\n\n`{doc['command']}`\n\n{doc['device']}, torch {doc['torch']}, "
                  f"Triton {doc['triton']}, {doc['date']}\n\nConfig: `{json.dumps(doc['config'])}`\n\n{markdown(doc)}"))


def _run_floor(args: argparse.Namespace) -> BenchRun:
    from mmaccel.bench.floor_suite import markdown, plot, run_floor_bench

    doc = run_floor_bench(quick=args.quick, log=say)
    return BenchRun(doc, markdown(doc), lambda out: _write_document(
        doc, out, f"# Benchmark `floor`\n\n`{doc['command']}`\n\n{doc['device']}, torch {doc['torch']}, {doc['date']}"
                  f"\n\nConfig: `{json.dumps(doc['config'])}`\n\n{markdown(doc)}\n", plot))


def _run_asr_stream(args: argparse.Namespace) -> BenchRun:
    from mmaccel.bench.stream_suite import markdown, run_stream_bench

    doc = run_stream_bench(args.model or "builtin:base", method_specs(args.methods), quick=args.quick, log=say)
    return BenchRun(doc, markdown(doc), lambda out: _write_document(
        doc, out, f"# Benchmark `asr-stream`\n\n`{doc['command']}`\n\n{doc['device']}, {doc['threads']} threads, "
                  f"{doc['date']}\n\nConfig: `{json.dumps(doc['config'])}`\n\n{markdown(doc)}"))


def _run_serve(args: argparse.Namespace) -> BenchRun:
    from mmaccel.bench.serve_suite import markdown, plot, run_serve_bench

    doc = run_serve_bench(quick=args.quick, log=say)
    return BenchRun(doc, markdown(doc), lambda out: _write_document(
        doc, out, f"# Benchmark `serve`\n\n`{doc['command']}`\n\n{doc['device']}, {doc['threads']} threads, "
                  f"{doc['date']}\n\nConfig: `{json.dumps(doc['config'])}`\n\n{markdown(doc)}", plot))


def _run_serve_memory(args: argparse.Namespace) -> BenchRun:
    from mmaccel.bench.serve_suite import memory_markdown, run_memory_check

    doc = run_memory_check(quick=args.quick, requests=args.samples, log=say)
    return BenchRun(doc, memory_markdown(doc), lambda out: _write_document(
        doc, out, f"# Benchmark `serve-memory`\n\n`{doc['command']}`\n\n{doc['device']}, {doc['threads']} threads, "
                  f"{doc['date']}\n\nConfig: `{json.dumps(doc['config'])}`; failed requests: {doc['failed']}, "
                  f"{doc['wall_s']} s\n\n{memory_markdown(doc)}"))


def _run_serve_text(args: argparse.Namespace) -> BenchRun:
    from mmaccel.bench.serve_suite import run_text_serve_bench, text_markdown

    doc = run_text_serve_bench(quick=args.quick, log=say)
    return BenchRun(doc, text_markdown(doc), lambda out: _write_document(
        doc, out, f"# Benchmark `serve-text`\n\n`{doc['command']}`\n\n{doc['device']}, {doc['threads']} threads, "
                  f"{doc['date']}\n\nConfig: `{json.dumps(doc['config'])}`\n\n{text_markdown(doc)}"))


def suites() -> dict[str, BenchSuite]:
    """The table: the harness suites (their options are their builders' parameters), then image-fid and kernels."""
    from mmaccel.bench import SUITES

    table = {name: BenchSuite(takes=("quick", "methods", *(o for o in SUITE_OPTIONS if o in inspect.signature(build).parameters)),
                              records=("quick", "methods", "threads", *SUITE_OPTIONS), refusal=_does_not_apply,
                              run=_harness(name))
             for name, build in SUITES.items()}
    # image-fid: the Inception FID of a method's image-suite samples against the test split (one sample count)
    table["image-fid"] = BenchSuite(takes=("samples", "methods", "model"), records=("model", "methods", "threads", "samples"),
                                    refusal=_takes_only, run=_run_image_fid,
                                    default_out=lambda args: IMAGE_FID_OUT[args.model or IMAGE_FID_MODEL])
    # kernels: fused kernels against their reference twins; its "command" has never recorded --threads
    table["kernels"] = BenchSuite(takes=("quick", "device"), records=("quick", "device"), refusal=_takes_only,
                                  run=_run_kernels)
    # floor: every pass's time against this machine's floor, per model, precision, batch and verify width
    table["floor"] = BenchSuite(takes=("quick",), records=("quick", "threads"), refusal=_takes_only, run=_run_floor,
                                default_out=lambda args: f"floor/floor{'-quick' if args.quick else ''}.json")
    # asr-stream: live transcription at real time (word delays, streaming against offline WER)
    table["asr-stream"] = BenchSuite(takes=("quick", "methods", "model"), records=("quick", "methods", "model", "threads"),
                                     refusal=_takes_only, run=_run_asr_stream)
    # serve: `mmaccel serve` under concurrent clients, against one request at a time and faster-whisper
    table["serve"] = BenchSuite(takes=("quick",), records=("quick", "threads"), refusal=_takes_only, run=_run_serve,
                                default_out=lambda args: f"serve/serve{'-quick' if args.quick else ''}.json")
    table["serve-text"] = BenchSuite(takes=("quick",), records=("quick", "threads"), refusal=_takes_only,
                                     run=_run_serve_text,
                                     default_out=lambda args: f"serve/text{'-quick' if args.quick else ''}.json")
    table["serve-memory"] = BenchSuite(takes=("quick", "samples"), records=("quick", "threads", "samples"),
                                       refusal=_takes_only,
                                       run=_run_serve_memory,
                                       default_out=lambda args: "serve/memory{}{}.json".format(
                                           "-quick" if args.quick else "", "" if args.samples is None else f"-{args.samples}"))
    return table


def _check_options(name: str, suite: BenchSuite, args: argparse.Namespace) -> None:
    given = [o for o in CHECKED if _given(args, o)]
    refused = [_flag(o) for o in given if o not in suite.takes]
    if refused:
        raise InputError(suite.refusal(name, suite.takes, refused))
    for option in given:
        if option in MINIMUM and getattr(args, option) < MINIMUM[option]:
            raise InputError(f"{_flag(option)} must be >= {MINIMUM[option]}, got {getattr(args, option)}")


def cmd_bench(args: argparse.Namespace) -> int:
    if args.suite == "report":
        from mmaccel.bench.report import update

        changed = update(Path(args.root))
        print("updated " + ", ".join(changed) if changed else "every generated page is up to date")
        return 0
    if args.threads is not None:
        import torch

        if args.threads < 1:
            raise InputError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    table = suites()
    if args.suite not in table:
        raise InputError(f"unknown benchmark suite {args.suite!r}; choose from {', '.join(table)} or report")
    suite = table[args.suite]
    _check_options(args.suite, suite, args)
    run = suite.run(args)
    run.doc["command"] = " ".join(["mmaccel bench", args.suite] + [
        _flag(o) + ("" if getattr(args, o) is True else f" {getattr(args, o)}") for o in suite.records if _given(args, o)])
    default_out = suite.default_out(args) if suite.default_out else f"{args.suite}{'-quick' if args.quick else ''}.json"
    paths = run.write(Path(args.out) if args.out else Path("benchmarks") / default_out)
    print(run.table)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def add_parser(subparsers) -> None:
    b = subparsers.add_parser("bench", help="run a benchmark suite (or `report` to refresh the README tables)")
    b.add_argument("suite", help="core | image | image-scale | image-continuous | image-fid | asr | asr-stream | asr-nar | "
                                 "ctc | video | kernels | floor | serve | serve-text | serve-memory | report")
    b.add_argument("--quick", action="store_true", help="reduced run (same code path, fewer samples)")
    add_out_option(b, "JSON path (Markdown and PNG are written beside it)")
    b.add_argument("--methods", help="comma-separated methods, e.g. 'speculative:k=6,ngram'")
    b.add_argument("--samples", type=int, default=None,
                   help="image suite: samples per method for the quality scores (full run: 5008); serve-memory: "
                        "requests sent (default 1000)")
    b.add_argument("--inception-samples", type=int, default=None,
                   help="image suite: of those, how many the (slow) Inception FID scores (full run: 300)")
    b.add_argument("--model", default=None, help="asr suite: builtin:base (default), builtin:tiny.en or a Whisper directory; "
                   "video suite: builtin:moving-fashion (default) or a Qwen-VL directory with words.json; "
                   "ctc suite: builtin:ctc-base (default), a WhisperCTC or a Wav2Vec2ForCTC directory; "
                   "asr-nar suite: builtin:whisfusion-tiny.en (default) or a Whisfusion directory; "
                   "image suite: builtin:fashion-mnist (default) or builtin:fashion-mnist-sjd2 (the GPT fine-tuned "
                   "for SJD2); image-fid: those two, builtin:fashion-mnist-var (the image-scale samples) or "
                   "builtin:fashion-mnist-mar (the image-continuous samples)")
    b.add_argument("--split", default=None, choices=("in-domain", "ood"),
                   help="speech suites (asr, asr-nar, ctc): the held-out in-domain set (default) or the out-of-domain one")
    b.add_argument("--heads", default=None,
                   help="asr suite: heads file(s), comma-separated, 'auto' (the shipped ones, default) or 'none'")
    b.add_argument("--draft", default=None, help="asr suite: draft decoder file, 'auto' (default) or 'none'")
    b.add_argument("--timestamps", default=None, choices=("segments", "words"),
                   help="asr suite: every method, faster-whisper too, decodes with segment (or word) timestamps")
    b.add_argument("--vad", action="store_true", help="asr suite: every method, faster-whisper too, with VAD on")
    add_device_option(b, default=None)
    b.add_argument("--threads", type=int, default=None,
                   help="CPU threads for the run (default: torch's, one per core); recorded with the results")
    b.add_argument("--root", default=".", help="report: the repository whose README headline tables, docs/benchmarks/ "
                                               "pages and methods reference are regenerated from benchmarks/")
    b.set_defaults(func=cmd_bench)
