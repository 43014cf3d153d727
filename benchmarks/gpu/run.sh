#!/usr/bin/env bash
# The GPU benchmarks of issue 22, run on a CUDA machine from the repository root; JSON (with the device
# name inside) lands in benchmarks/gpu/. The LlamaGen peer needs a LlamaGen checkout: LLAMAGEN=/path.
#   bash benchmarks/gpu/run.sh            # full runs
#   QUICK=--quick bash benchmarks/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-.venv/bin}
QUICK=${QUICK:-}
OUT=benchmarks/gpu
$BIN/python -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU here'; print(torch.cuda.get_device_name())"
$BIN/mmaccel bench kernels --device cuda $QUICK --out $OUT/kernels.json
for graphs in "" "--cuda-graphs"; do      # eager steps, then the same runs with the steps replayed as CUDA graphs
  tag=${graphs:+_graphs}
  $BIN/mmaccel bench core --device cuda $graphs $QUICK --out $OUT/core$tag.json
  $BIN/mmaccel bench image --device cuda $graphs $QUICK --out $OUT/image$tag.json
  $BIN/mmaccel bench asr --device cuda $graphs $QUICK --out $OUT/asr_base$tag.json
done
if [ -n "${LLAMAGEN:-}" ]; then
  $BIN/python benchmarks/peers/llamagen_official.py --repo "$LLAMAGEN" --device cuda --compile --cuda-graphs \
      --out $OUT/peer_llamagen.json
fi
