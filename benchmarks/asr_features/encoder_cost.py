"""Issue 47 item 5, where end-to-end time goes: one 30-s window through Whisper base's encoder, ours against
faster-whisper's (CTranslate2) on the same weights.

Every utterance, however short, is one padded 30-s window through the encoder, for us and for faster-whisper
alike; the decoding methods only change the decoder's share. This measures that fixed cost: our encoder (PyTorch,
fp32 as loaded, and the relaxed `encoder=int8` copy) against CTranslate2's Whisper encoder in int8 (what
faster-whisper int8 runs) and float32, at batch 1 and 8, the variants interleaved round by round, the median
round reported. Inputs are random log-mel windows (the cost does not depend on the values).

Usage (idle machine, ~3 min):
    .venv/bin/python benchmarks/asr_features/encoder_cost.py --out benchmarks/asr_features/encoder_cost.json
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))          # this checkout's mmaccel

from mmaccel.bench.harness import device_name  # noqa: E402
from mmaccel.engine.precision import convert  # noqa: E402
from mmaccel.speech.whisper import ct2_model_dir, load_whisper  # noqa: E402

ROUNDS = 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    import ctranslate2

    threads = torch.get_num_threads()
    encoder = load_whisper("builtin:base").model.model.encoder.eval()
    ours = {"ours-fp32": encoder, "ours-int8": convert(encoder, "int8")}
    ct2 = {f"ctranslate2-{t}": ctranslate2.models.Whisper(str(ct2_model_dir("base")), device="cpu", compute_type=t,
                                                         intra_threads=threads) for t in ("int8", "float32")}

    def run(name: str, windows: torch.Tensor) -> None:
        if name in ours:
            with torch.inference_mode():
                ours[name](windows)
        else:
            ct2[name].encode(ctranslate2.StorageView.from_array(windows.numpy()), to_cpu=True)

    rows = []
    for batch in (1, 8):
        windows = torch.randn(batch, 80, 3000, generator=torch.Generator().manual_seed(batch))
        times: dict[str, list[float]] = {name: [] for name in [*ours, *ct2]}
        for name in times:                                      # warm-up
            run(name, windows)
        for r in range(args.rounds):
            names = list(times)
            for name in names[r % len(names):] + names[:r % len(names)]:     # the order rotates round by round
                t = time.perf_counter()
                run(name, windows)
                times[name].append(time.perf_counter() - t)
        for name, ts in times.items():
            rows.append({"encoder": name, "batch": batch, "seconds_per_window": round(statistics.median(ts) / batch, 4),
                         "rounds": [round(t, 3) for t in ts]})
            print(rows[-1], flush=True)
    doc = {"command": "python benchmarks/asr_features/encoder_cost.py --out benchmarks/asr_features/encoder_cost.json",
           "device": device_name(), "model": "builtin:base", "date": time.strftime("%Y-%m-%d"),
           "ctranslate2": ctranslate2.__version__, "torch": torch.__version__, "numpy": np.__version__,
           "results": rows}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
