"""The before/after table of issue 46 item 8 (benchmarks/refactor/README.md) from the JSON that run.sh wrote.

Usage: .venv/bin/python benchmarks/refactor/table.py > benchmarks/refactor/README.md
"""

import json
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
          "passes (NFE), which depend on the code only, so they must match exactly.\n")
    for suite in SUITES:
        before, after = (json.loads((HERE / f"{suite}_{side}.json").read_text()) for side in ("before", "after"))
        print(f"## {suite}\n\n{after['device']}; `{after['command']}`\n")
        print("| method | batch | passes before | passes after | speed-up before | speed-up after | after / before "
              "| lossless (after) |")
        print("|---|---|---|---|---|---|---|---|")
        b_rows = rows(before)
        for key, r in rows(after).items():
            b = b_rows.get(key)
            if b is None:
                continue
            ratio = headline(r) / headline(b) if headline(b) else float("nan")
            print(f"| {key[0]} | {key[1]} | {b['nfe']} | {r['nfe']} | {headline(b):.2f} | {headline(r):.2f} "
                  f"| {ratio:.2f} | {'yes' if r['lossless'] else 'no'} |")
        print()


if __name__ == "__main__":
    main()
