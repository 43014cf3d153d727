"""Issue 46 item 8 follow-up: Whisper base decode seconds at batch 8 (the 24 quick-suite utterances, two rounds
in one process) for greedy, speculative k=4 and eagle k=4, in the checkout it is run from:
`cd TREE && python /path/to/ab_asr_batch8.py LABEL`. ab_asr_batch8.txt holds four processes run one after
another: before (54d6042, a worktree at /tmp/before), after, before, after."""

import json
import sys

sys.path.insert(0, ".")          # the checkout's mmaccel, not an installed one

from mmaccel.bench.asr_suite import load_corpus  # noqa: E402
from mmaccel.speech.pipeline import ASRPipeline  # noqa: E402

METHODS = (("greedy", {}), ("speculative", {"k": 4}), ("eagle", {"k": 4}))

audios = [a for _, a, _ in load_corpus(6)]
asr = ASRPipeline.from_pretrained("builtin:base")
for method, params in METHODS:
    asr.transcribe(audios[:1], method, batch_size=1, **params)          # warm-up, as the suite's
seconds: dict[str, list[float]] = {}
for _ in range(2):
    for method, params in METHODS:
        decode = sum(asr.transcribe(audios[i : i + 8], method, batch_size=8, **params).stats.time_s["decode"]
                     for i in range(0, len(audios), 8))
        seconds.setdefault(method, []).append(round(decode, 3))
print(sys.argv[1], json.dumps(seconds))
