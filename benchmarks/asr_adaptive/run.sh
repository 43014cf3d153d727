#!/usr/bin/env bash
# Issue 47 item 6: every lossless draft method of the default bench with adaptive drafting (the default: each
# pass drafts up to k, or nothing, by the acceptance and pass costs measured so far), beside greedy, batch 1
# and 8; the headline two also with every pass drafting k (adaptive=false) in the same run. About 45 min on 2
# cores for either split. Run on an idle machine: bash benchmarks/asr_adaptive/run.sh [in_domain|ood]
set -euo pipefail
cd "$(dirname "$0")/../.."
mm() { .venv/bin/python -c "import sys; from mmaccel.cli import main; sys.exit(main())" "$@"; }
METHODS="medusa:depth=1:width=1,medusa-block:depth=2:width=1,early-exit:k=2:exit_layer=5"
METHODS="$METHODS,eagle:k=4:stop_below=0.0,eagle:k=4:stop_below=0.0:adaptive=false"
METHODS="$METHODS,speculative:k=4,speculative:k=4:adaptive=false"
METHODS="$METHODS,eagle:k=8:stop_below=0.5,speculative:k=8:stop_below=0.8:siblings=2,tree:depth=3:width=2"
if [ "${1:-in_domain}" = in_domain ]; then
  mm bench asr --methods "$METHODS" --out benchmarks/asr_adaptive/in_domain.json
else
  mm bench asr --methods "$METHODS" --split ood --out benchmarks/asr_adaptive/ood.json
fi
