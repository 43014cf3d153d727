"""`mmaccel image generate | generate-scale | generate-continuous`: one PNG per class label.

`generate` is next-token (LlamaGen-layout GPT) with any image method, `generate-scale` next-scale
(VAR, plain or CoDe), `generate-continuous` continuous tokens (MAR-style: AR, MAR's multi-token mode
or CSpD).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mmaccel.cli.options import (
    add_draft_option,
    add_out_option,
    add_param_option,
    add_sampling_options,
    add_seed_option,
)
from mmaccel.devices import add_device_option
from mmaccel.errors import InputError
from mmaccel.progress import say


def parse_labels(text: str) -> list[int | str]:
    """'0,1,2' or 'Sneaker,Bag' -> [0, 1, 2] / ['Sneaker', 'Bag'] (names are resolved by the pipeline)."""
    labels = [t.strip() for t in text.split(",") if t.strip()]
    if not labels:
        raise InputError("--labels is empty: pass class indices such as --labels 0,1,2")
    return [int(t) if t.lstrip("-").isdigit() else t for t in labels]


def write_images(out, directory: Path) -> int:
    """One PNG per generated image (`NNN_class<label>.png`, paths on stdout), the stats as JSON on stderr."""
    directory.mkdir(parents=True, exist_ok=True)
    for i, (image, label) in enumerate(zip(out.images, out.labels)):
        path = directory / f"{i:03d}_class{label}.png"
        image.save(path)
        print(path)
    say(json.dumps(out.stats.to_dict()))
    return 0


def cmd_image_generate(args: argparse.Namespace) -> int:
    from mmaccel.image.pipeline import ImagePipeline

    labels = parse_labels(args.labels)
    pipe = ImagePipeline.from_pretrained(args.model, vq=args.vq, draft=args.draft, device=args.device,
                                         cuda_graphs=args.cuda_graphs)
    out = pipe.generate(labels, args.method, cfg_scale=args.cfg_scale, temperature=args.temperature,
                        top_k=args.top_k, top_p=args.top_p, seed=args.seed, **dict(args.param))
    return write_images(out, Path(args.out))


def cmd_image_generate_scale(args: argparse.Namespace) -> int:
    from mmaccel.image.scale_pipeline import ScalePipeline

    labels = parse_labels(args.labels)
    refiner = None if args.refiner == "none" else args.refiner
    pipe = ScalePipeline.from_pretrained(args.model, vq=args.vq, refiner=refiner, patch_nums=args.patch_nums,
                                         num_heads=args.num_heads, device=args.device)
    params = {"draft_steps": args.draft_steps, "training_free": False if args.specialised else None,
              "refiner_cfg": args.refiner_cfg, "refiner_temperature": args.refiner_temperature, **dict(args.param)}
    out = pipe.generate(labels, args.method, cfg_scale=args.cfg_scale, temperature=args.temperature, top_k=args.top_k,
                        top_p=args.top_p, seed=args.seed, **params)         # a parameter left as None takes its default
    return write_images(out, Path(args.out))


def cmd_image_generate_continuous(args: argparse.Namespace) -> int:
    from mmaccel.image.continuous_pipeline import ContinuousPipeline

    labels = parse_labels(args.labels)
    pipe = ContinuousPipeline.from_pretrained(args.model, tokenizer=args.tokenizer, draft=args.draft, device=args.device)
    params = {"num_draft": args.num_draft, "prefill_ratio": args.prefill_ratio,
              "inner_temperature": args.inner_temperature, **dict(args.param)}
    out = pipe.generate(labels, args.method, num_iter=args.num_iter, cfg=args.cfg, temperature=args.temperature,
                        diffusion_steps=args.diffusion_steps, seed=args.seed, **params)
    return write_images(out, Path(args.out))


def _add_common(parser: argparse.ArgumentParser) -> None:
    """What every image command ends with: the labels, the seed, the PNG directory and the device."""
    parser.add_argument("--labels", required=True, help="comma-separated class indices (or class names)")
    add_seed_option(parser)
    add_out_option(parser, "directory for the PNGs", required=True)
    add_device_option(parser)


def add_parser(subparsers) -> None:
    image = subparsers.add_parser("image", help="class-conditional image generation")
    image_sub = image.add_subparsers(dest="image_command", required=True)
    _add_generate(image_sub)
    _add_generate_scale(image_sub)
    _add_generate_continuous(image_sub)


def _add_generate(image_sub) -> None:
    ig = image_sub.add_parser("generate", help="generate one PNG per class label")
    ig.add_argument("--model", default="builtin:fashion-mnist",
                    help="builtin:fashion-mnist, builtin:fashion-mnist-sjd2 (the GPT fine-tuned for SJD2), a directory "
                    "with gpt.* and vq.*, or a GPT checkpoint (with --vq)")
    ig.add_argument("--vq", default=None, help="tokenizer checkpoint when --model is a GPT file")
    add_draft_option(ig, "builtin", "drafter checkpoint, 'builtin' or 'none'")
    ig.add_argument("--method", default="ar")
    add_param_option(ig, "window=8")
    add_sampling_options(ig, temperature=1.0, cfg_scale=2.0)
    _add_common(ig)
    ig.set_defaults(func=cmd_image_generate)


def _param_help(registry: dict, method: str, name: str) -> str:
    """A method parameter's option help, from its plug-in: 'METHOD: HELP (default D)'."""
    row = next(r for r in registry[method].parameters() if r["name"] == name)
    return f"{method}: {row['help']} (default {row['default']})".replace("%", "%%")


def _add_generate_scale(image_sub) -> None:
    from mmaccel.image.scale_methods import SCALE_REGISTRY
    from mmaccel.image.scale_pipeline import SCALE_SAMPLING

    isg = image_sub.add_parser("generate-scale", help="next-scale (VAR) generation, plain or CoDe: one PNG per label")
    isg.add_argument("--model", default="builtin:fashion-mnist-var",
                     help="builtin:fashion-mnist-var, a directory with var.*, vq.* (refiner.*), or a VAR file (with --vq)")
    isg.add_argument("--vq", default=None, help="multi-scale tokenizer when --model is a VAR file (vae_ch160v4096z32.pth)")
    isg.add_argument("--refiner", default="builtin", help="the small VAR for CoDe: a checkpoint, 'builtin' or 'none'")
    isg.add_argument("--method", default="ar", choices=tuple(SCALE_REGISTRY))
    isg.add_argument("--draft-steps", type=int, default=None, help=_param_help(SCALE_REGISTRY, "code", "draft_steps"))
    isg.add_argument("--specialised", action="store_true",
                     help="code: hand off to the refiner specialised for N (or for the latest earlier N): "
                          "training_free=false")
    isg.add_argument("--refiner-cfg", type=float, default=None, help=_param_help(SCALE_REGISTRY, "code", "refiner_cfg"))
    isg.add_argument("--refiner-temperature", type=float, default=None,
                     help=_param_help(SCALE_REGISTRY, "code", "refiner_temperature"))
    add_param_option(isg, "draft_steps=7 (see mmaccel methods --pipeline image-scale)")
    add_sampling_options(isg, temperature=SCALE_SAMPLING["temperature"], top_k=SCALE_SAMPLING["top_k"],
                         top_p=SCALE_SAMPLING["top_p"], cfg_scale=SCALE_SAMPLING["cfg_scale"],
                         cfg_help="VAR's ramped guidance")
    isg.add_argument("--patch-nums", type=int, nargs="+", default=None, help="the scale schedule of an official tokenizer")
    isg.add_argument("--num-heads", type=int, default=None, help="heads of a VAR file whose count cannot be inferred")
    _add_common(isg)
    isg.set_defaults(func=cmd_image_generate_scale)


def _add_generate_continuous(image_sub) -> None:
    from mmaccel.image.continuous_methods import CONTINUOUS_REGISTRY
    from mmaccel.image.continuous_pipeline import CONTINUOUS_SAMPLING

    icg = image_sub.add_parser("generate-continuous",
                               help="continuous-token (MAR-style) generation: AR, MAR's multi-token mode or CSpD")
    icg.add_argument("--model", default="builtin:fashion-mnist-mar",
                     help="builtin:fashion-mnist-mar, a directory with mar.safetensors, kl.safetensors "
                          "(mar_draft.safetensors), or a MAR file (with --tokenizer)")
    icg.add_argument("--tokenizer", default=None, help="KL tokenizer when --model is a MAR file")
    add_draft_option(icg, "builtin", "the draft model for CSpD: a checkpoint, 'builtin' or 'none'")
    icg.add_argument("--method", default="ar", choices=tuple(CONTINUOUS_REGISTRY))
    icg.add_argument("--num-iter", type=int, default=None,
                     help="generation steps (default: the method's: one token a step; L / tokens_per_step for mar)")
    icg.add_argument("--cfg", type=float, default=CONTINUOUS_SAMPLING["cfg"], help="MAR's linearly ramped guidance")
    add_sampling_options(icg, temperature=CONTINUOUS_SAMPLING["temperature"], top_k=None, top_p=None)
    icg.add_argument("--diffusion-steps", type=int, default=CONTINUOUS_SAMPLING["diffusion_steps"])
    for name, kind in (("num_draft", int), ("prefill_ratio", float), ("inner_temperature", float)):
        icg.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None,
                         help=_param_help(CONTINUOUS_REGISTRY, "cspd", name))
    add_param_option(icg, "tokens_per_step=8 (see mmaccel methods --pipeline image-continuous)")
    _add_common(icg)
    icg.set_defaults(func=cmd_image_generate_continuous)
