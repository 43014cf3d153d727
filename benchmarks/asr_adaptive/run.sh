#!/usr/bin/env bash
# Issue 47 item 6: the lossless draft methods of the default bench with adaptive drafting (the default: each
# pass drafts up to k, or nothing, by the acceptance and pass costs measured so far), beside greedy, batch 1
# and 8; the headline two also with every pass drafting k (adaptive=false) in the same run. In domain every
# method (~40 min on 2 cores); out of domain, whose utterances are longer, the headline two and the two weakest
# (~40 min). Run on an idle machine: bash benchmarks/asr_adaptive/run.sh [in_domain|ood]
set -euo pipefail
cd "$(dirname "$0")/../.."
mm() { .venv/bin/python -c "import sys; from mmaccel.cli import main; sys.exit(main())" "$@"; }
HEADLINE="eagle:k=4:stop_below=0.0,eagle:k=4:stop_below=0.0:adaptive=false"
HEADLINE="$HEADLINE,speculative:k=4,speculative:k=4:adaptive=false"
if [ "${1:-in_domain}" = in_domain ]; then
  METHODS="medusa:depth=1:width=1,medusa-block:depth=2:width=1,early-exit:k=2:exit_layer=5,$HEADLINE"
  METHODS="$METHODS,eagle:k=8:stop_below=0.5,speculative:k=8:stop_below=0.8:siblings=2,tree:depth=3:width=2"
  mm bench asr --methods "$METHODS" --out benchmarks/asr_adaptive/in_domain.json
else
  METHODS="medusa:depth=1:width=1,early-exit:k=2:exit_layer=5,$HEADLINE"
  mm bench asr --methods "$METHODS" --split ood --out benchmarks/asr_adaptive/ood.json
fi
