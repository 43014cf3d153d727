"""`mmaccel generate`: text from the built-in LM (or a local Hugging Face model) with a decoding method."""

from __future__ import annotations

import argparse
import json

from mmaccel.cli.options import add_draft_option, add_param_option, add_sampling_options, add_seed_option
from mmaccel.devices import add_device_option
from mmaccel.progress import say


def cmd_generate(args: argparse.Namespace) -> int:
    """One completion per line on stdout, the decode statistics as JSON on stderr."""
    from mmaccel.lm.pipeline import TextPipeline

    pipe = TextPipeline.from_pretrained(args.model, draft=args.draft, device=args.device, cuda_graphs=args.cuda_graphs)
    out = pipe.generate(args.prompt, args.method, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        top_k=args.top_k, top_p=args.top_p, seed=args.seed, **dict(args.param))
    for text in out.texts:
        print(text)
    say(json.dumps(out.stats.to_dict()))
    return 0


def add_parser(subparsers) -> None:
    g = subparsers.add_parser("generate", help="generate text with the built-in LM (or a local HF model) and a method")
    g.add_argument("prompt", nargs="+")
    g.add_argument("--model", default="builtin:smollm2")
    add_draft_option(g, "builtin", "draft model directory, 'builtin' or 'none'")
    g.add_argument("--method", default="ar")
    add_param_option(g, "k=4")
    g.add_argument("--max-new-tokens", type=int, default=64)
    add_sampling_options(g, temperature=0.0, temperature_help="sampling temperature (0: greedy)")
    add_seed_option(g)
    add_device_option(g)
    g.set_defaults(func=cmd_generate)
