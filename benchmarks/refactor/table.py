"""The before/after table of issue 46 item 8 (benchmarks/refactor/README.md) from the JSON that run.sh wrote.

Usage: .venv/bin/python benchmarks/refactor/table.py > benchmarks/refactor/README.md
"""

import json
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITES = ("core", "image", "asr")


def rows(doc: dict) -> dict:
    return {(r["method"], r["batch"]): r for r in doc["results"]}


def headline(r: dict) -> float:
    """The suite's headline ratio of a row: the decoder speed-up for Whisper, the end-to-end one otherwise."""
    return r["quality"].get("decoder_speedup", r["speedup"])


def main() -> None:
    print("# Before and after the method-contract refactor (issue 46)\n")
    print("The quick suites on 54d6042 (before) and on the refactored code (after), back to back on one machine "
          "(`BEFORE=/tmp/before bash benchmarks/refactor/run.sh`; table: `benchmarks/refactor/table.py`). "
          "Speed-up is against the suite's baseline in the same run (Whisper: the decoder's); passes are target "
          "passes (NFE), which depend on the code only, so they must match exactly. Latency is the row's own wall "
          "time (s): a ratio that moves because the baseline itself got faster shows there.\n")
    for suite in SUITES:
        files = [HERE / f"{suite}_{side}.json" for side in ("before", "after")]
        if not all(f.is_file() for f in files):
            print(f"## {suite}\n\nNot run back to back yet (needs both {files[0].name} and {files[1].name}).\n")
            continue
        before, after = (json.loads(f.read_text()) for f in files)
        print(f"## {suite}\n\n{after['device']}; `{after['command']}`\n")
        print("| method | batch | passes before | passes after | latency before | latency after | speed-up before "
              "| speed-up after | after / before | lossless (after) |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        b_rows, ratios = rows(before), []
        for key, r in rows(after).items():
            b = b_rows.get(key)
            if b is None:
                continue
            ratio = headline(r) / headline(b) if headline(b) else float("nan")
            if key[0] != after["baseline"]:
                ratios.append(ratio)
            print(f"| {key[0]} | {key[1]} | {b['nfe']} | {r['nfe']} | {b['latency_s']:.2f} | {r['latency_s']:.2f} "
                  f"| {headline(b):.2f} | {headline(r):.2f} | {ratio:.2f} | {'yes' if r['lossless'] else 'no'} |")
        same = all(rows(before)[k]["nfe"] == r["nfe"] for k, r in rows(after).items() if k in b_rows)
        print(f"\nPasses identical before and after: {'yes' if same else 'NO'}; geometric mean of the speed-up "
              f"ratios after / before over {len(ratios)} rows: {math.prod(ratios) ** (1 / len(ratios)):.2f} "
              f"(spread {min(ratios):.2f}-{max(ratios):.2f}).\n")


if __name__ == "__main__":
    main()
