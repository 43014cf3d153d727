#!/usr/bin/env bash
# The GPU benchmarks, from the repository root of the tree benchmarks/gpu/tree.sh makes (<= 60 MiB): the kernel
# suite, then the image suite with eager steps and with the steps replayed as CUDA graphs, the next-scale and the
# continuous-token suites. JSON and Markdown (the device name inside) land in --out (default benchmarks/gpu/).
# Whisper and SmolLM2 come from packages that do not travel, so the core and speech suites run on CPU machines.
#   bash benchmarks/gpu/run.sh [--quick]                 # on a CUDA machine (QUICK=--quick works too)
#   bash benchmarks/gpu/run.sh --device cpu --quick --out DIR
#                                                        # the same plumbing on a CPU (tests/bench/test_gpu_runner.py)
# Python: $PYTHON, else .venv/bin/python where a checkout has one, else python3 (a GPU machine's own, which has
# torch, transformers, safetensors, torchmetrics, timm and triton; diffusers travels as a wheel, see tree.sh). The LlamaGen peer
# needs a LlamaGen checkout: LLAMAGEN=/path.
set -euo pipefail
cd "$(dirname "$0")/../.."

DEVICE=cuda
QUICK=${QUICK:-}
OUT=benchmarks/gpu
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --quick) QUICK=--quick; shift ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "usage: bash benchmarks/gpu/run.sh [--device cuda|cpu] [--quick] [--out DIR]" >&2; exit 2 ;;
  esac
done
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# the image suites' domain FID reference: the test split that tree.sh copies into .gpu/ (carried with the tree)
if [ -z "${MMACCEL_FASHION_MNIST:-}" ] && [ -d .gpu/fashion-mnist ]; then
  export MMACCEL_FASHION_MNIST=$PWD/.gpu/fashion-mnist
fi
# packages the GPU machine lacks travel as wheels in .gpu/wheels (tree.sh); install them beside the tree
if [ -d .gpu/wheels ] && ! "$PYTHON" -c "import diffusers" 2>/dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/mmaccel-site .gpu/wheels/*.whl
  export PYTHONPATH=$PYTHONPATH:/tmp/mmaccel-site
fi
mkdir -p "$OUT"
FAILED=()
bench() {                  # a suite that fails is reported at the end; the others still run
  "$PYTHON" -m mmaccel.cli bench "$@" --device "$DEVICE" $QUICK || FAILED+=("bench $*")
}

if [ "$DEVICE" = cuda ]; then
  "$PYTHON" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU here'; print(torch.cuda.get_device_name())"
  graphs=("" "--cuda-graphs")          # eager steps, then the same runs replayed as CUDA graphs
else
  graphs=("")                          # CUDA graphs need CUDA
fi
bench kernels --out "$OUT/kernels.json"
for g in "${graphs[@]}"; do
  bench image $g --out "$OUT/image${g:+_graphs}.json"
done
bench image-scale --out "$OUT/image-scale.json"
bench image-continuous --out "$OUT/image-continuous.json"
if [ -n "${LLAMAGEN:-}" ] && [ "$DEVICE" = cuda ]; then
  "$PYTHON" benchmarks/peers/llamagen_official.py --repo "$LLAMAGEN" --device cuda --compile --cuda-graphs \
      --out "$OUT/peer_llamagen.json" || FAILED+=("peer llamagen")
fi
echo "wrote $OUT"
if [ ${#FAILED[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${FAILED[@]}" >&2
  exit 1
fi
