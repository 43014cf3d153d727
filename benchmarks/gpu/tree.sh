#!/usr/bin/env bash
# Make the working tree that travels to a GPU machine fit its 64 MiB (keep it <= 60 MiB), and put it back.
#
# A lent GPU machine receives the tracked files, the untracked files git does not ignore and the paths a call
# carries; it reaches no package index, and its python3 lacks the packages that carry Whisper base, tiny.en and
# SmolLM2. So the suites that run there (benchmarks/gpu/run.sh) are the image, next-scale, continuous and
# kernel ones, and the speech and text assets below cannot be used there: `slim` untracks them (the files stay
# on disk) and excludes them in .git/info/exclude; `restore` tracks them again. Nothing is committed.
#
#   bash benchmarks/gpu/tree.sh slim      # then run on the device: carry [".gpu"], command
#                                         #   bash benchmarks/gpu/run.sh --quick   (QUICK=--quick works too)
#   bash benchmarks/gpu/tree.sh restore   # at once afterwards: a commit in the slim state would delete them
#   bash benchmarks/gpu/tree.sh size      # MiB that would travel now (tracked + untracked-not-ignored + .gpu)
#   bash benchmarks/gpu/tree.sh list      # the files that travel once slim (tests/bench/test_gpu_runner.py)
#
# `slim` also fills .gpu/ (ignored by .gitignore; it travels only when carried): the Fashion-MNIST test split (the
# reference of the image suites' domain FID) and the wheels of the packages the image models need that a GPU
# machine lacks (diffusers, for MAR's noise schedule and the KL tokenizer), at the versions requirements.txt pins;
# run.sh installs them there.
set -euo pipefail
cd "$(dirname "$0")/../.."

NOT_SENT=(                                   # what the GPU run cannot use (no Whisper / SmolLM2 package there)
  mmaccel/assets/whisper_base_heads.safetensors
  mmaccel/assets/whisper_base_draft.safetensors
  mmaccel/assets/whisper_base_eagle.safetensors
  mmaccel/assets/whisper_tiny.en_eagle.safetensors
  mmaccel/assets/smollm2_draft.safetensors
  mmaccel/assets/whisfusion_tiny_en
  mmaccel/assets/ctc_whisper_base
)
EXCLUDE=.git/info/exclude
BEGIN="# >>> benchmarks/gpu/tree.sh slim"
END="# <<< benchmarks/gpu/tree.sh slim"
FASHION=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
LIMIT_MIB=60
WHEELS=(diffusers importlib_metadata lazy-importer)     # diffusers and what it needs beyond the GPU machine's own

size_mib() {
  { git ls-files -z; git ls-files -z --others --exclude-standard; [ -d .gpu ] && find .gpu -type f -print0; } \
    | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {printf "%.1f\n", s / 1048576}'
}

slim_files() {            # what git would send once slim: tracked and untracked-not-ignored, less NOT_SENT
  { git ls-files; git ls-files --others --exclude-standard; } | grep -v -x -F -f <(printf '%s\n' "${NOT_SENT[@]}") \
    | grep -v -F -f <(printf '%s/\n' "${NOT_SENT[@]}") | while IFS= read -r f; do if [ -f "$f" ]; then echo "$f"; fi; done
}

drop_block() {
  [ -f "$EXCLUDE" ] || return 0
  sed -i "\\|^$BEGIN\$|,\\|^$END\$|d" "$EXCLUDE"
}

case "${1:-}" in
  slim)
    drop_block
    mkdir -p "$(dirname "$EXCLUDE")"
    { echo "$BEGIN"; printf '/%s\n' "${NOT_SENT[@]}"; echo "$END"; } >> "$EXCLUDE"
    git rm -r -q --cached --ignore-unmatch -- "${NOT_SENT[@]}"
    mkdir -p .gpu/fashion-mnist .gpu/wheels
    cp "$FASHION"/t10k-*-ubyte.gz .gpu/fashion-mnist/
    for name in "${WHEELS[@]}"; do
      pin=$(grep -i -m1 "^$name==" requirements.txt || .venv/bin/python -m pip show "$name" 2>/dev/null \
            | awk -v n="$name" '/^Version:/ {print n "==" $2}')
      python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 -d .gpu/wheels "${pin:-$name}"
    done
    mib=$(size_mib)
    echo "tree to send: $mib MiB (limit $LIMIT_MIB); carry [\".gpu\"]; run 'bash benchmarks/gpu/tree.sh restore' after"
    awk -v m="$mib" -v l="$LIMIT_MIB" 'BEGIN {exit !(m <= l)}' || { echo "error: $mib MiB is over $LIMIT_MIB" >&2; exit 1; }
    ;;
  restore)
    git reset -q -- "${NOT_SENT[@]}"
    drop_block
    echo "restored: $(git ls-files -- "${NOT_SENT[@]}" | wc -l) files tracked again; tree: $(size_mib) MiB"
    ;;
  size)
    size_mib
    ;;
  list)
    slim_files
    ;;
  *)
    echo "usage: bash benchmarks/gpu/tree.sh slim|restore|size|list" >&2
    exit 2
    ;;
esac
