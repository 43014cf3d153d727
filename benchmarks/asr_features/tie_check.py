"""Why EAGLE's timestamp-mode transcript of one out-of-domain utterance differs from greedy's (`draft_passes.py`):
the target's logits of two adjacent timestamps at the segment's end are equal in fp32, so which one is the arg-max
depends on the rounding of the pass that scores it (a one-token step, or a verify pass over k + 1 tokens of 8 rows).

Prints, at the first position where the method's tokens leave greedy's (batch 8, as in `draft_passes.py`), the
target's logits of both tokens in a teacher-forced pass over greedy's tokens.

Usage (~3 min): .venv/bin/python benchmarks/asr_features/tie_check.py --utterance 21
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))          # this checkout's mmaccel

from mmaccel.bench.asr_suite import OOD_UTTERANCES, load_corpus  # noqa: E402
from mmaccel.speech.audio import log_mel  # noqa: E402
from mmaccel.speech.pipeline import ASRPipeline  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--utterance", type=int, default=21, help="index in the out-of-domain split")
    parser.add_argument("--method", default="eagle")
    args = parser.parse_args()
    asr = ASRPipeline.from_pretrained("builtin:base")
    items = load_corpus(OOD_UTTERANCES, "ood")
    audio = [a for _, a, _ in items]
    greedy = asr.transcribe(audio, "greedy", batch_size=8, timestamps=True).transcripts[args.utterance].tokens
    other = asr.transcribe(audio, args.method, batch_size=8, timestamps=True, adaptive=False,
                           k=4).transcripts[args.utterance].tokens
    if greedy == other:
        print(f"{items[args.utterance][0]}: {args.method} gives greedy's tokens")
        return
    n = next(j for j, (a, b) in enumerate(zip(greedy + [-1], other + [-2])) if a != b)
    prompt = asr.bundle.prompt("en", timestamps=True)
    inputs = asr.model.encode(log_mel(asr.bundle.feature_extractor, [audio[args.utterance]]), prompt)
    final, _ = asr.model.teacher_forced(inputs, asr.model.hf.proj_out.weight.new_tensor([greedy]).long())
    logits = final[0, len(prompt) - 1 + n] @ asr.model.hf.proj_out.weight.T
    a, b = greedy[n], other[n]
    print(f"{items[args.utterance][0]}, token {n}: greedy {a} ({asr.bundle.tokenizer.decode([a], decode_with_timestamps=True)}), "
          f"{args.method} {b} ({asr.bundle.tokenizer.decode([b], decode_with_timestamps=True)}); target logits "
          f"{logits[a].item():.6f} and {logits[b].item():.6f} (difference {logits[a].item() - logits[b].item():.2e})")


if __name__ == "__main__":
    main()
