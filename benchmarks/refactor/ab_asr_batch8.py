"""Issue 46 item 8 follow-up: Whisper base decode seconds at batch 8 (the 24 quick-suite utterances, ROUNDS rounds
in one process, default 2) for METHODS (default greedy,speculative,eagle; k=4 for the drafting ones), in the
checkout it is run from: `cd TREE && [METHODS=speculative ROUNDS=3] python /path/to/ab_asr_batch8.py LABEL`.
ab_asr_batch8.txt holds the processes run one after another, before (54d6042, a worktree at /tmp/before) and after
alternating; table.py summarises them under the Whisper table."""

import json
import os
import sys

sys.path.insert(0, ".")          # the checkout's mmaccel, not an installed one

from mmaccel.bench.asr_suite import load_corpus  # noqa: E402
from mmaccel.speech.pipeline import ASRPipeline  # noqa: E402

PARAMS = {"greedy": {}, "speculative": {"k": 4}, "eagle": {"k": 4}}
methods = os.environ.get("METHODS", "greedy,speculative,eagle").split(",")
rounds = int(os.environ.get("ROUNDS", "2"))

audios = [a for _, a, _ in load_corpus(6)]
asr = ASRPipeline.from_pretrained("builtin:base")
for method in methods:
    asr.transcribe(audios[:1], method, batch_size=1, **PARAMS[method])          # warm-up, as the suite's
seconds: dict[str, list[float]] = {}
for _ in range(rounds):
    for method in methods:
        decode = sum(asr.transcribe(audios[i : i + 8], method, batch_size=8, **PARAMS[method]).stats.time_s["decode"]
                     for i in range(0, len(audios), 8))
        seconds.setdefault(method, []).append(round(decode, 3))
print(sys.argv[1], json.dumps(seconds))
