"""Issue 47 item 2, long audio: memory and speed of an hour-long file against shorter ones, ours and faster-whisper's.

The input is a WAV file (16 kHz mono) of the in-domain corpus (the real clips and the 60 held-out TTS utterances,
0.5 s of silence after each) repeated until it lasts `--minutes`; its reference is their texts joined. Each
(tool, length) runs in a fresh process that loads the model, notes its resident memory, transcribes the file from
disk with word timestamps and Silero VAD at batch 8, and reports the peak resident memory of the process (the
kernel's high-water mark) beside it: what the transcription added on top of the loaded model. Tools: our greedy
and EAGLE (k=4) on Whisper base, and faster-whisper int8 on the same weights through its BatchedInferencePipeline
(batch 8, its own VAD), English, greedy.

Usage: .venv/bin/python benchmarks/asr_features/long_audio.py --out benchmarks/asr_features/long_audio.json
(about 25 min on 2 cores; `--minutes 5,60` by default)
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))          # this checkout's mmaccel

TOOLS = ("greedy", "eagle-k4", "faster-whisper-int8")
BATCH = 8
GAP_S = 0.5


def build_input(minutes: float, folder: Path) -> tuple[Path, str]:
    """The corpus repeated to `minutes` as a 16 kHz WAV under `folder`; (its path, its reference text)."""
    import soundfile as sf

    from mmaccel.bench.asr_suite import load_corpus
    from mmaccel.speech.audio import SAMPLE_RATE

    corpus = load_corpus(60, "in-domain")
    gap = np.zeros(int(GAP_S * SAMPLE_RATE), np.float32)
    pieces, texts, total, i = [], [], 0, 0
    while total < minutes * 60 * SAMPLE_RATE:
        _, audio, text = corpus[i % len(corpus)]
        pieces += [audio.samples, gap]
        texts.append(text)
        total += len(audio.samples) + len(gap)
        i += 1
    path = folder / f"long_{minutes:g}min.wav"
    if not path.is_file():
        sf.write(str(path), np.concatenate(pieces), SAMPLE_RATE, subtype="FLOAT")
    return path, " ".join(texts)


def peak_mb() -> float:
    """This process's peak resident memory so far (VmHWM: since its exec; getrusage's maxrss would also count
    the parent's memory at the fork)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024       # kB


def child(tool: str, path: str) -> dict:
    """Load `tool`, then transcribe `path`; what it took."""
    import torch

    threads = torch.get_num_threads()
    if tool.startswith("faster-whisper"):
        from faster_whisper import BatchedInferencePipeline, WhisperModel

        from mmaccel.speech.whisper import ct2_model_dir

        model = WhisperModel(str(ct2_model_dir("base")), device="cpu", compute_type="int8", cpu_threads=threads)
        batched = BatchedInferencePipeline(model)
        loaded = peak_mb()
        t0 = time.perf_counter()
        segments, info = batched.transcribe(path, language="en", batch_size=BATCH, beam_size=1, temperature=0.0,
                                            word_timestamps=True, vad_filter=True, condition_on_previous_text=False)
        text = " ".join(s.text.strip() for s in segments)
        duration = info.duration
    else:
        from mmaccel.speech.pipeline import ASRPipeline

        asr = ASRPipeline.from_pretrained("builtin:base")
        method, params = ("greedy", {}) if tool == "greedy" else ("eagle", {"k": 4, "stop_below": 0.0})
        import soundfile as sf

        head, rate = sf.read(path, frames=20 * 16000, dtype="float32")
        asr.transcribe(head, method, sample_rate=rate, batch_size=1, **params)        # warm-up on its first 20 s
        loaded = peak_mb()
        t0 = time.perf_counter()
        out = asr.transcribe(path, method, batch_size=BATCH, word_timestamps=True, vad_filter=True, temperature=0.0,
                             **params)           # one temperature, as the peer's batched pipeline decodes
        text, duration = out.texts[0], out.transcripts[0].duration
    seconds = time.perf_counter() - t0
    return {"tool": tool, "audio_s": round(duration, 1), "seconds": round(seconds, 1),
            "rtfx": round(duration / seconds, 2), "loaded_mb": round(loaded), "peak_mb": round(peak_mb()),
            "added_mb": round(peak_mb() - loaded), "text": text}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", default="5,60")
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--out")
    parser.add_argument("--child", nargs=2, metavar=("TOOL", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    from mmaccel.bench.harness import device_name
    from mmaccel.metrics.wer import corpus_wer
    from mmaccel.paths import default_cache_dir

    folder = default_cache_dir() / "speech" / "long"
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for minutes in [float(m) for m in args.minutes.split(",")]:
        path, reference = build_input(minutes, folder)
        for tool in args.tools.split(","):
            done = subprocess.run([sys.executable, __file__, "--child", tool, str(path)], check=True,
                                  capture_output=True, text=True)
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["wer"] = round(100 * corpus_wer([reference], [row.pop("text")]).wer, 2)
            row["minutes"] = minutes
            rows.append(row)
            print(row, flush=True)
    doc = {"command": "python benchmarks/asr_features/long_audio.py" + (f" --minutes {args.minutes}"
                                                                       if args.minutes != "5,60" else ""),
           "device": device_name(), "model": "builtin:base", "batch": BATCH,
           "features": "word timestamps, Silero VAD", "results": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
