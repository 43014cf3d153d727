#!/usr/bin/env bash
# Issue 46 item 8: the quick core, image and Whisper suites on the code before the method-contract refactor
# (54d6042, checked out at $BEFORE) and after it (this checkout), back to back on one machine, so that the
# headline ratios can be compared. Usage: BEFORE=/tmp/before bash benchmarks/refactor/run.sh (SUITES="asr": one suite;
# METHODS: the suite's --methods, e.g. the Whisper decoders the refactor touched without the outside peers)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
py="$here/.venv/bin/python"
out="$here/benchmarks/refactor"
for suite in ${SUITES:-core image asr}; do
  for side in before after; do
    tree=$([ "$side" = before ] && echo "$BEFORE" || echo "$here")
    (cd "$tree" && "$py" -c "import sys; from mmaccel.cli import main; sys.exit(main())" \
        bench "$suite" --quick ${METHODS:+--methods "$METHODS"} --out "$out/${suite}_${side}.json")
  done
done
