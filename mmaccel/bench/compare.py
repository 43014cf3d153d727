"""The terminal comparison (`mmaccel compare`): the accelerated methods next to AR on the embedded defaults.

Image methods on the Fashion-MNIST GPT (a sample grid and the quick image table), the core methods
on the real small LM (SmolLM2-135M), then Whisper base on the real LibriVox clips: greedy against
the fastest lossless methods, transcript by transcript. Tables go to stdout, progress to `log`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mmaccel.progress import say


def run_compare(out_dir: str | Path, log: Callable[[str], None] = say) -> None:
    """Print the image, text and speech comparisons; write `out_dir/image_grid.png`."""
    from mmaccel.bench import SUITES
    from mmaccel.bench.harness import markdown_table, run_suite
    from mmaccel.bench.image_suite import DEMO_METHODS, sample_grid
    from mmaccel.image.pipeline import ImagePipeline

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pipe = ImagePipeline.from_pretrained("builtin:fashion-mnist")
    grid = sample_grid(pipe, DEMO_METHODS, out / "image_grid.png")
    print(f"wrote {grid} (one row of samples per method, same labels and seed)")
    print("\n## Image methods (built-in Fashion-MNIST GPT, quick run)\n")
    print(markdown_table(run_suite(SUITES["image"](quick=True, methods=DEMO_METHODS, pipeline=pipe), log=log)))
    print("\n## Core methods (SmolLM2-135M, greedy, quick run)\n")
    print(markdown_table(run_suite(SUITES["core"](quick=True), log=log)))
    compare_speech()


def compare_speech() -> None:
    """Greedy vs the best lossless methods (heads only, and with the draft decoder) on the real
    LibriVox clips with the built-in Whisper base, batch 1."""
    from mmaccel.speech.data import real_utterances
    from mmaccel.speech.pipeline import ASRPipeline

    asr = ASRPipeline.from_pretrained("builtin:base")
    utts = [u for u in real_utterances() if u.id.startswith("librivox")]
    # the fastest lossless settings at batch 1 in benchmarks/asr_base_eagle.json
    methods = {"greedy": {}}
    if asr.heads.eagle is not None:
        methods["eagle"] = {"k": 8, "stop_below": 0.5}
    if asr.draft is not None:
        methods["speculative"] = {"k": 8, "stop_below": 0.8, "siblings": 2}
    if len(methods) == 1:
        methods["ngram"] = {"k": 3}
    runs = {}
    for name, kw in methods.items():
        asr.transcribe([utts[0].audio_filepath], name, **kw)                      # warm-up
        runs[name] = asr.transcribe([u.audio_filepath for u in utts], name, batch_size=1, **kw)
    _print_speech_tables(utts, runs)


def _print_speech_tables(utts: list, runs: dict) -> None:
    """The transcripts side by side (marked where they differ from greedy), then WER, passes, time, RTFx."""
    from mmaccel.metrics.wer import corpus_wer

    base = runs["greedy"]
    names = list(runs)
    print(f"\n## Speech: Whisper base on {len(utts)} LibriVox clips, batch 1 ({' vs '.join(names)})\n")
    print("| clip | " + " | ".join(names) + " |\n|" + "---|" * (len(names) + 1))
    for i, u in enumerate(utts):
        cells = [runs[n].texts[i] + ("" if runs[n].texts[i] == base.texts[i] else " (differs)") for n in names]
        print(f"| {u.id.split('-')[-1]} | " + " | ".join(cells) + " |")
    refs = [u.text for u in utts]
    print("\n| method | WER % | decoder passes / token | decoder time (s) | RTFx | identical to greedy |\n"
          "|---|---|---|---|---|---|")
    for name, out in runs.items():
        print(f"| {name} | {100 * corpus_wer(refs, out.texts).wer:.2f} | {1 / out.stats.mean_accepted:.3f} | "
              f"{out.stats.time_s['decode']:.2f} | {out.rtfx:.2f} | "
              f"{sum(a == b for a, b in zip(out.texts, base.texts))}/{len(utts)} |")
    for name in names[1:]:
        fast = runs[name]
        print(f"\ndecoder speed-up of {name}: {base.stats.time_s['decode'] / fast.stats.time_s['decode']:.2f}x; "
              f"end to end: {base.wall_s / fast.wall_s:.2f}x")
