"""Issue 47 item 1, the drafts in timestamp mode: how many tokens each target pass of EAGLE and the draft decoder
emits per row, with and without Whisper's timestamp mode, for sets of draft files side by side.

Drafts trained on plain transcripts read every timestamp as <|notimestamps|> and cannot draft one, so in timestamp
mode each segment's boundary costs a pass; drafts trained on timestamp-mode labels too (`--timestamp-every`,
`WhisperDraft.timestamps`) draft them. The draft length is fixed (k = 4, `adaptive=False`) so the counts measure
the drafts, not the chooser; they are counts, not timings, so this may run beside other jobs. Both splits of
`mmaccel bench asr` (the drafts were trained on neither), batch 8; greedy in the same mode is the reference and
every transcript must equal it.

Usage (~12 min a set on 2 cores; a set already in `--out` is kept, not run again):
    git show b4f52d3:mmaccel/assets/whisper_base_eagle.safetensors > runs/varied2/eagle_b4f52d3.safetensors
    git show b4f52d3:mmaccel/assets/whisper_base_draft.safetensors > runs/varied2/draft_b4f52d3.safetensors
    .venv/bin/python benchmarks/asr_features/draft_passes.py --out benchmarks/asr_features/draft_passes.json \
        --drafts before=runs/varied2/eagle_b4f52d3.safetensors:runs/varied2/draft_b4f52d3.safetensors \
        --drafts retrained=mmaccel/assets/whisper_base_eagle.safetensors:mmaccel/assets/whisper_base_draft.safetensors
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))          # this checkout's mmaccel

from mmaccel.bench.asr_suite import FULL_TTS, OOD_UTTERANCES, load_corpus  # noqa: E402
from mmaccel.bench.harness import device_name  # noqa: E402
from mmaccel.progress import progress  # noqa: E402
from mmaccel.speech.pipeline import ASRPipeline  # noqa: E402

METHODS = ("eagle", "speculative")
K = 4
BATCH = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafts", action="append", required=True,
                        help="LABEL=EAGLE_HEADS_FILE:DRAFT_DECODER_FILE (repeat for each set)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sets = {}
    for item in args.drafts:
        label, _, files = item.partition("=")
        eagle, _, draft = files.partition(":")
        sets[label] = (eagle, draft)
    splits = {"in-domain": load_corpus(FULL_TTS), "ood": load_corpus(OOD_UTTERANCES, "ood")}
    out_path, started = Path(args.out), time.time()
    # rows of an earlier run into the same file are kept (a set already measured is not run again)
    rows = json.loads(out_path.read_text())["rows"] if out_path.is_file() else []
    done = {(r["drafts"], r["split"], r["timestamps"]) for r in rows}
    jobs = [(label, split, timestamps) for label in sets for split in splits for timestamps in (False, True)
            if (label, split, timestamps) not in done]
    reference: dict[tuple, list[str]] = {}
    for label, split, timestamps in progress(jobs, desc="draft passes", unit="run"):
        eagle, draft = sets[label]
        asr = ASRPipeline.from_pretrained("builtin:base", heads=[eagle], draft=draft)
        audio = [a for _, a, _ in splits[split]]
        if (split, timestamps) not in reference:
            reference[split, timestamps] = _tokens(asr.transcribe(audio, "greedy", batch_size=BATCH, timestamps=timestamps))
        for method in METHODS:
            out = asr.transcribe(audio, method, batch_size=BATCH, timestamps=timestamps, adaptive=False, k=K)
            per_pass = out.stats.mean_accepted
            rows.append({"drafts": label, "split": split, "timestamps": timestamps, "method": f"{method}-k{K}",
                         "tokens_per_pass": round(per_pass, 4), "passes_per_token": round(1 / per_pass, 4),
                         "identical_to_greedy": _tokens(out) == reference[split, timestamps],
                         "utterances": len(audio)})
            print(json.dumps(rows[-1]), flush=True)
        old = json.loads(out_path.read_text()) if out_path.is_file() else {"commands": [], "drafts": {}}
        command = "python " + " ".join(sys.argv)
        doc = {"commands": old["commands"] + [command] * (command not in old["commands"]), "device": device_name(),
               "batch": BATCH, "k": K, "run": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
               "drafts": {**old["drafts"], **{label: {"eagle": e, "draft": d} for label, (e, d) in sets.items()}},
               "rows": rows}
        out_path.write_text(json.dumps(doc, indent=2) + "\n")


def _tokens(out) -> list[list[int]]:
    return [tr.tokens for tr in out.transcripts]


if __name__ == "__main__":
    main()
