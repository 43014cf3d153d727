#!/usr/bin/env bash
# Issue 47 item 5: Whisper base with the product's features on, every default method and faster-whisper with the
# same features (word timestamps, Silero VAD), in domain and out of domain; then live transcription at real
# time. Run on an idle machine (~75 min in domain, ~45 out of domain on 2 cores without AVX-512): bash benchmarks/asr_features/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
mm() { .venv/bin/python -c "import sys; from mmaccel.cli import main; sys.exit(main())" "$@"; }
mm bench asr --timestamps words --vad --out benchmarks/asr_features/words_vad.json
mm bench asr --timestamps words --vad --split ood --out benchmarks/asr_features/words_vad_ood.json
mm bench asr-stream --out benchmarks/asr_features/stream.json
