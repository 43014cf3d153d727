"""The page of the WER-gap study (benchmarks/asr_gap/README.md) from study.json.

Usage: .venv/bin/python benchmarks/asr_gap/table.py > benchmarks/asr_gap/README.md
"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    doc = json.loads((HERE / "study.json").read_text())
    split = doc["split"]
    print("# Where our Whisper and faster-whisper's differ (issue 47 item 5, the WER gap)\n")
    print(f"Whisper {doc['model'].split(':')[-1]}, the same weights on both sides, English. The split (`study.py`): "
          f"{split['utterances']} sentences of {split['text']} (a text domain no corpus of the library uses), spoken "
          f"by espeak-ng voices no split uses ({', '.join(split['voices'])}), each degraded one way in turn "
          f"({', '.join(split['degradations'])}). {doc['wer']}; {doc['device']}. Command: `{doc['command']}`.\n")
    print("## Finding\n")
    print("Greedy against greedy, no timestamps, faster-whisper in float32: where the two transcripts differ, the "
          "first differing token and our model's log-probability margin between the two there. fp32 numerics can "
          "only flip a near-tie; a token one side suppresses would be a decoding rule; a wide margin with no rule "
          "involved means the model was given other input.\n")
    print("| our log-mel padding after a short clip | same tokens | differ | of which near-ties | their token suppressed by us |")
    print("|---|---|---|---|---|")
    for padding, row in doc["greedy_vs_faster_whisper_float32"].items():
        print(f"| {padding} | {row['same_tokens']} | {row['differ']} | {row['near_ties']} | "
              f"{row['their_token_suppressed_by_us']} |")
    print("\nEvery Whisper window is 30 s; after a shorter clip the window is padding, most of it for a short "
          "utterance. transformers' feature extractor pads the audio with silence (the log-mel at its floor, 8 "
          "decades below the loudest bin); openai-whisper's `transcribe` and faster-whisper cut the log-mel at the "
          "audio's end and pad it with zeros. The model reads the two differently, often from the first token. "
          "Our pipeline now pads with zeros (`audio.log_mel`; `ASRPipeline.mel_padding = \"silence\"` gives the "
          "other), so its greedy is faster-whisper float32's greedy token for token (tested on tiny.en's clips, "
          "`tests/speech/test_alignment.py`), and the remaining gap to faster-whisper int8 is int8 numerics and "
          "its default decoding (beam search, temperature fallback).\n")
    print("## WER by decoder\n")
    degradations = split["degradations"]
    print("| decoder | WER | " + " | ".join(degradations) + " |")
    print("|---|---|" + "---|" * len(degradations))
    for label, row in doc["wer_by_decoder"].items():
        print(f"| {label} | {row['wer']:.2f} | " + " | ".join(f"{row[d]:.2f}" for d in degradations) + " |")
    print("\nfaster-whisper greedy: beam 1, temperature 0, not conditioned on earlier text (as ours); its defaults: "
          "`WhisperModel.transcribe(audio)` as a new user runs it (5 beams, timestamps, temperature fallback, "
          "conditioned on earlier text; its fallback samples unseeded, so that row moves a little from run to "
          "run). On 8 utterances per degradation a single hallucinated loop moves a "
          "column by tens of points: read the columns as where each decoder struggles, not as a ranking.")


if __name__ == "__main__":
    main()
