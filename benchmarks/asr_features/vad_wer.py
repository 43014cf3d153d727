"""Issue 47 item 5, VAD and WER: what Silero VAD costs in WER on clean speech (where it has nothing to remove).

Whisper base, greedy, the in-domain set of `mmaccel bench asr` (the 18 real clips and the first 60 held-out TTS
utterances, clean), batch 8; without timestamps and with word timestamps, each with VAD off and on. The target:
VAD-on WER at most VAD-off WER + 0.5.

Usage: .venv/bin/python benchmarks/asr_features/vad_wer.py --out benchmarks/asr_features/vad_wer.json (~6 min)
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))          # this checkout's mmaccel

from mmaccel.bench.asr_suite import load_corpus  # noqa: E402
from mmaccel.bench.harness import device_name  # noqa: E402
from mmaccel.metrics.wer import corpus_wer, normalizer_version  # noqa: E402
from mmaccel.speech.pipeline import ASRPipeline  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    corpus = load_corpus(60, "in-domain")
    audios, refs = [a for _, a, _ in corpus], [t for _, _, t in corpus]
    asr = ASRPipeline.from_pretrained("builtin:base")
    rows = []
    for words in (False, True):
        texts = {}
        for vad in (False, True):
            out = asr.transcribe(audios, "greedy", batch_size=8, word_timestamps=words, vad_filter=vad)
            texts[vad] = out.texts
            rows.append({"word_timestamps": words, "vad": vad, "wer": round(100 * corpus_wer(refs, out.texts).wer, 2),
                         "seconds": round(out.wall_s, 1)})
            print(rows[-1], flush=True)
        rows[-1]["changed_transcripts"] = sum(a != b for a, b in zip(texts[False], texts[True]))
    doc = {"command": "python benchmarks/asr_features/vad_wer.py --out benchmarks/asr_features/vad_wer.json",
           "device": device_name(), "model": "builtin:base", "mel_padding": asr.mel_padding, "method": "greedy", "batch": 8,
           "audio": f"{len(corpus)} in-domain utterances (18 real clips, 60 held-out TTS), clean",
           "wer": f"corpus WER, {normalizer_version()}", "results": rows}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
