"""`mmaccel` command line: generate, image, asr, bench, eval, demo (the web app), compare, methods."""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path

from mmaccel.devices import add_device_option
from mmaccel.errors import InputError, MMAccelError
from mmaccel.progress import say


def _param(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"method parameters are KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _method_specs(text: str | None):
    from mmaccel.bench.harness import MethodSpec

    if not text:
        return None
    specs = [MethodSpec("ar")]
    for item in text.split(","):  # name or name:key=value:key=value
        name, *kvs = item.strip().split(":")
        if name and name != "ar":
            specs.append(MethodSpec(name, dict(_param(kv) for kv in kvs), label=item.strip() if kvs else None))
    return specs


def cmd_generate(args) -> int:
    from mmaccel.lm.pipeline import TextPipeline

    pipe = TextPipeline.from_pretrained(args.model, draft=args.draft, device=args.device, cuda_graphs=args.cuda_graphs)
    out = pipe.generate(args.prompt, args.method, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        top_k=args.top_k, top_p=args.top_p, seed=args.seed, **dict(args.param))
    for text in out.texts:
        print(text)
    say(json.dumps(out.stats.to_dict()))
    return 0


def _labels(text: str) -> list:
    """'0,1,2' or 'Sneaker,Bag' -> [0, 1, 2] / ['Sneaker', 'Bag'] (names are resolved by the pipeline)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    return [int(t) if t.lstrip("-").isdigit() else t for t in items]


def _write_images(out, directory: Path) -> int:
    """One PNG per generated image (`NNN_class<label>.png`, paths on stdout), the stats as JSON on stderr."""
    directory.mkdir(parents=True, exist_ok=True)
    for i, (image, label) in enumerate(zip(out.images, out.labels)):
        path = directory / f"{i:03d}_class{label}.png"
        image.save(path)
        print(path)
    say(json.dumps(out.stats.to_dict()))
    return 0


def cmd_image_generate_scale(args) -> int:
    from mmaccel.image.scale_pipeline import ScalePipeline

    labels = _labels(args.labels)
    if not labels:
        raise InputError("--labels is empty: pass class indices such as --labels 0,1,2")
    refiner = None if args.refiner == "none" else args.refiner
    pipe = ScalePipeline.from_pretrained(args.model, vq=args.vq, refiner=refiner, patch_nums=args.patch_nums,
                                         num_heads=args.num_heads, device=args.device)
    out = pipe.generate(labels, args.method, draft_steps=args.draft_steps, cfg_scale=args.cfg_scale,
                        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                        training_free=not args.specialised, refiner_cfg=args.refiner_cfg,
                        refiner_temperature=args.refiner_temperature)
    return _write_images(out, Path(args.out))


def cmd_image_generate_continuous(args) -> int:
    from mmaccel.image.continuous_pipeline import ContinuousPipeline

    labels = _labels(args.labels)
    if not labels:
        raise InputError("--labels is empty: pass class indices such as --labels 0,1,2")
    draft = None if args.draft == "none" else args.draft
    pipe = ContinuousPipeline.from_pretrained(args.model, tokenizer=args.tokenizer, draft=draft, device=args.device)
    out = pipe.generate(labels, args.method, num_iter=args.num_iter, cfg=args.cfg, temperature=args.temperature,
                        diffusion_steps=args.diffusion_steps, num_draft=args.num_draft, prefill_ratio=args.prefill_ratio,
                        inner_temperature=args.inner_temperature, seed=args.seed)
    return _write_images(out, Path(args.out))


def cmd_image_generate(args) -> int:
    from mmaccel.image.pipeline import ImagePipeline

    labels = _labels(args.labels)
    if not labels:
        raise InputError("--labels is empty: pass class indices such as --labels 0,1,2")
    pipe = ImagePipeline.from_pretrained(args.model, vq=args.vq, draft=args.draft, device=args.device,
                                         cuda_graphs=args.cuda_graphs)
    out = pipe.generate(labels, args.method, cfg_scale=args.cfg_scale, temperature=args.temperature,
                        top_k=args.top_k, top_p=args.top_p, seed=args.seed, **dict(args.param))
    return _write_images(out, Path(args.out))


def cmd_asr_transcribe(args) -> int:
    from mmaccel.speech.pipeline import ASRPipeline, draft_option, heads_option

    asr = ASRPipeline.from_pretrained(args.model, heads=heads_option(args.heads), draft=draft_option(args.draft),
                                      assistant=args.assistant, device=args.device, cuda_graphs=args.cuda_graphs)
    out = asr.transcribe(list(args.files), args.method, batch_size=args.batch_size, language=args.language,
                         encoder=args.encoder, **dict(args.param))
    failed = 0
    for t in out.transcripts:
        if t.error is not None:
            failed += 1
            print(f"{t.source}\tERROR: {t.error}")
        else:
            print(f"{t.source}\t{t.text}")
    summary = {"method": out.method, "audio_s": round(out.audio_s, 3), "rtfx": round(out.rtfx, 3), **out.stats.to_dict()}
    say(json.dumps(summary))
    return 1 if failed else 0


def _print_transcripts(rows: list[tuple[str, str | None, str]]) -> int:
    """(source, error, text) per input, tab-separated; exit status 1 when any input failed."""
    for source, error, text in rows:
        print(f"{source}\tERROR: {error}" if error is not None else f"{source}\t{text}")
    return 1 if any(error is not None for _, error, _ in rows) else 0


def cmd_asr_ctc(args) -> int:
    from mmaccel.speech.ctc.pipeline import CTCPipeline

    pipe = CTCPipeline.from_pretrained(args.model, lm=args.lm, lm_weight=args.lm_weight,
                                       insertion_bonus=args.insertion_bonus)
    out = pipe.transcribe(list(args.files), args.method, beam=args.beam, boost=args.boost or None,
                          boost_weight=args.boost_weight,
                          exit=None if args.exit_threshold is None else ("entropy", args.exit_threshold))
    say(json.dumps({"method": args.method, "audio_s": round(out.audio_seconds, 3), "rtfx": round(out.rtfx, 3),
                      "time_s": {k: round(v, 4) for k, v in out.seconds.items()},
                      **({"exit_layers": out.exit_layers} if out.exit_layers else {})}))
    return _print_transcripts([(f, None, t.text) for f, t in zip(args.files, out.transcripts)])


def cmd_asr_whisfusion(args) -> int:
    from mmaccel.speech.whisfusion.pipeline import WhisfusionPipeline

    pipe = WhisfusionPipeline.from_pretrained(args.model, device=args.device)
    out = pipe.transcribe(list(args.files), candidates=args.candidates, steps=args.steps,
                          temperature=args.temperature, select=args.select, batch_size=args.batch_size, seed=args.seed)
    say(json.dumps({"method": out.method, "audio_s": round(out.audio_s, 3), "rtfx": round(out.rtfx, 3),
                      **out.stats.to_dict()}))
    return _print_transcripts([(t.source, t.error, t.text) for t in out.transcripts])


def cmd_bench(args) -> int:
    from mmaccel.bench import SUITES
    from mmaccel.bench.harness import markdown_table, run_suite, write_results
    from mmaccel.bench.report import update_readme

    if args.suite == "report":
        changed = update_readme(Path(args.readme), Path(args.dir))
        print(f"{args.readme}: {'updated' if changed else 'already up to date'}")
        return 0
    if args.threads is not None:
        import torch

        if args.threads < 1:
            raise InputError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.suite == "image-fid":
        return _bench_image_fid(args)
    if args.suite == "kernels":
        return _bench_kernels(args)
    if args.suite not in SUITES:
        raise InputError(f"unknown benchmark suite {args.suite!r}; choose from {', '.join(SUITES)}, image-fid, kernels "
                         "or report")
    extra = {}
    for option, minimum in (("samples", 2), ("inception_samples", 0), ("model", None), ("heads", None),
                            ("draft", None), ("device", None), ("cuda_graphs", None), ("split", None)):
        # suite-specific options
        value, flag = getattr(args, option), "--" + option.replace("_", "-")
        if value is None or value is False:
            continue
        if option not in inspect.signature(SUITES[args.suite]).parameters:
            raise InputError(f"{flag} does not apply to the {args.suite!r} suite")
        if minimum is not None and value < minimum:
            raise InputError(f"{flag} must be >= {minimum}, got {value}")
        extra[option] = value
    suite = SUITES[args.suite](quick=args.quick, methods=_method_specs(args.methods), **extra)
    doc = run_suite(suite, log=lambda m: say(m))
    doc["command"] = " ".join(["mmaccel bench", args.suite] + (["--quick"] if args.quick else [])
                              + ([f"--methods {args.methods}"] if args.methods else [])
                              + ([f"--threads {args.threads}"] if args.threads is not None else [])
                              + [f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in extra.items()])
    out = Path(args.out) if args.out else Path("benchmarks") / f"{args.suite}{'-quick' if args.quick else ''}.json"
    paths = write_results(doc, out, suite.primary_quality)
    if suite.artifacts is not None:
        paths += suite.artifacts(out)
    print(markdown_table(doc))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _bench_image_fid(args) -> int:
    from mmaccel.bench.image_fid import markdown, run_image_fid
    from mmaccel.bench.image_suite import DEFAULT_METHODS, FULL_SAMPLES

    if args.inception_samples is not None or args.quick:
        raise InputError("image-fid takes --samples (and --methods), not --inception-samples or --quick")
    samples = FULL_SAMPLES if args.samples is None else args.samples
    if samples < 2:
        raise InputError(f"--samples must be >= 2, got {samples}")
    methods = _method_specs(args.methods) or DEFAULT_METHODS
    model = args.model or "builtin:fashion-mnist"
    doc = run_image_fid(methods, samples, log=lambda m: say(m), model=model)
    doc["command"] = " ".join(["mmaccel bench image-fid"] + ([f"--model {args.model}"] if args.model else [])
                              + ([f"--methods {args.methods}"] if args.methods else [])
                              + ([f"--threads {args.threads}"] if args.threads is not None else [])
                              + ([f"--samples {args.samples}"] if args.samples is not None else []))
    default_out = {"builtin:fashion-mnist": "image_fid.json", "builtin:fashion-mnist-sjd2": "image-sjd2_fid.json",
                   "builtin:fashion-mnist-mar": "image-continuous_fid.json"}.get(model, "image-scale_fid.json")
    out = Path(args.out) if args.out else Path("benchmarks") / default_out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(f"# Benchmark `image-fid`\n\n`{doc['command']}`\n\n"
                                      f"Config: `{json.dumps(doc['config'])}`\n\n{markdown(doc)}")
    print(markdown(doc))
    print(f"wrote {out}, {out.with_suffix('.md')}")
    return 0


def _bench_kernels(args) -> int:
    from mmaccel.bench.kernels_suite import markdown, run_kernels

    given = [f"--{o.replace('_', '-')}" for o in ("methods", "samples", "inception_samples", "model", "heads", "draft",
                                                  "cuda_graphs") if getattr(args, o) not in (None, False)]
    if given:
        raise InputError(f"kernels takes --quick, --device and --out, not {', '.join(given)}")
    doc = run_kernels(args.device or "cpu", quick=args.quick, log=lambda m: say(m))
    doc["command"] = " ".join(["mmaccel bench kernels"] + (["--quick"] if args.quick else [])
                              + ([f"--device {args.device}"] if args.device else []))
    out = Path(args.out) if args.out else Path("benchmarks") / f"kernels{'-quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(f"# Benchmark `kernels`\n\n`{doc['command']}`\n\n{doc['device']}, torch {doc['torch']}, "
                                      f"Triton {doc['triton']}, {doc['date']}\n\nConfig: `{json.dumps(doc['config'])}`"
                                      f"\n\n{markdown(doc)}")
    print(markdown(doc))
    print(f"wrote {out}, {out.with_suffix('.md')}")
    return 0


def cmd_demo(args) -> int:
    """The web app (demos/): Gradio tabs for image, speech and text on the embedded defaults."""
    try:
        from demos.app import main as app_main
    except ImportError as err:
        raise InputError(f"the web app needs gradio and the demos package of an mmaccel checkout ({err}); "
                         "run `make demo` in the repository") from None
    return app_main(args.app_args)


def cmd_compare(args) -> int:
    """The main job on the embedded defaults, in the terminal: image methods next to AR on the
    Fashion-MNIST GPT (a sample grid and the table), the core methods on the real small LM, then
    Whisper base on the real LibriVox clips (greedy vs the best lossless method)."""
    from mmaccel.bench import SUITES
    from mmaccel.bench.harness import markdown_table, run_suite
    from mmaccel.bench.image_suite import DEMO_METHODS, sample_grid
    from mmaccel.image.pipeline import ImagePipeline

    log = lambda m: say(m)  # noqa: E731
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pipe = ImagePipeline.from_pretrained("builtin:fashion-mnist")
    grid = sample_grid(pipe, DEMO_METHODS, out / "image_grid.png")
    print(f"wrote {grid} (one row of samples per method, same labels and seed)")
    print("\n## Image methods (built-in Fashion-MNIST GPT, quick run)\n")
    print(markdown_table(run_suite(SUITES["image"](quick=True, methods=DEMO_METHODS, pipeline=pipe), log=log)))
    print("\n## Core methods (SmolLM2-135M, greedy, quick run)\n")
    print(markdown_table(run_suite(SUITES["core"](quick=True), log=log)))
    _demo_speech()
    return 0


def _demo_speech() -> None:
    """Greedy vs the best lossless methods (heads only, and with the draft decoder) on the real
    LibriVox clips with the built-in Whisper base."""
    from mmaccel.metrics.wer import corpus_wer
    from mmaccel.speech.data import real_utterances
    from mmaccel.speech.pipeline import ASRPipeline

    asr = ASRPipeline.from_pretrained("builtin:base")
    utts = [u for u in real_utterances() if u.id.startswith("librivox")]
    # the fastest lossless settings at batch 1 in benchmarks/asr_base_eagle.json
    methods = {"greedy": {}}
    if asr.heads.eagle is not None:
        methods["eagle"] = {"k": 8, "stop_below": 0.5}
    if asr.draft is not None:
        methods["speculative"] = {"k": 8, "stop_below": 0.8, "siblings": 2}
    if len(methods) == 1:
        methods["ngram"] = {"k": 3}
    runs = {}
    for name, kw in methods.items():
        asr.transcribe([utts[0].audio_filepath], name, **kw)                      # warm-up
        runs[name] = asr.transcribe([u.audio_filepath for u in utts], name, batch_size=1, **kw)
    base = runs["greedy"]
    names = list(runs)
    print(f"\n## Speech: Whisper base on {len(utts)} LibriVox clips, batch 1 ({' vs '.join(names)})\n")
    print("| clip | " + " | ".join(names) + " |\n|" + "---|" * (len(names) + 1))
    for i, u in enumerate(utts):
        cells = [runs[n].texts[i] + ("" if runs[n].texts[i] == base.texts[i] else " (differs)") for n in names]
        print(f"| {u.id.split('-')[-1]} | " + " | ".join(cells) + " |")
    refs = [u.text for u in utts]
    print("\n| method | WER % | decoder passes / token | decoder time (s) | RTFx | identical to greedy |\n|---|---|---|---|---|---|")
    for name, out in runs.items():
        print(f"| {name} | {100 * corpus_wer(refs, out.texts).wer:.2f} | {1 / out.stats.mean_accepted:.3f} | "
              f"{out.stats.time_s['decode']:.2f} | {out.rtfx:.2f} | "
              f"{sum(a == b for a, b in zip(out.texts, base.texts))}/{len(utts)} |")
    for name in names[1:]:
        fast = runs[name]
        print(f"\ndecoder speed-up of {name}: {base.stats.time_s['decode'] / fast.stats.time_s['decode']:.2f}x; "
              f"end to end: {base.wall_s / fast.wall_s:.2f}x")


def cmd_methods(args) -> int:
    from mmaccel.core.methods import REGISTRY, build_method
    from mmaccel.image.methods import IMAGE_REGISTRY
    from mmaccel.speech.methods import ASR_REGISTRY

    for title, registry in (("text (mmaccel generate)", REGISTRY), ("image (mmaccel image generate)", IMAGE_REGISTRY),
                            ("speech (mmaccel asr transcribe)", ASR_REGISTRY)):
        print(f"\n{title}\n\n| method | lossless | needs | what |\n|---|---|---|---|")
        for name in registry:
            m = build_method(name, registry)
            print(f"| {name} | {'yes' if m.lossless else 'no (budgeted)'} | {m.needs or 'target only'} | {m.description} |")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmaccel", description="Fast autoregressive generation on one decoding core.")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text with the built-in LM (or a local HF model) and a method")
    g.add_argument("prompt", nargs="+")
    g.add_argument("--model", default="builtin:smollm2")
    g.add_argument("--draft", default="builtin", help="draft model directory, 'builtin' or 'none'")
    g.add_argument("--method", default="ar")
    g.add_argument("--param", type=_param, action="append", default=[], metavar="KEY=VALUE",
                   help="method parameter, e.g. --param k=4 (repeatable)")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    add_device_option(g)
    g.set_defaults(func=cmd_generate)

    image = sub.add_parser("image", help="class-conditional image generation")
    image_sub = image.add_subparsers(dest="image_command", required=True)
    ig = image_sub.add_parser("generate", help="generate one PNG per class label")
    ig.add_argument("--model", default="builtin:fashion-mnist",
                    help="builtin:fashion-mnist, builtin:fashion-mnist-sjd2 (the GPT fine-tuned for SJD2), a directory "
                    "with gpt.* and vq.*, or a GPT checkpoint (with --vq)")
    ig.add_argument("--vq", default=None, help="tokenizer checkpoint when --model is a GPT file")
    ig.add_argument("--draft", default="builtin", help="drafter checkpoint, 'builtin' or 'none'")
    ig.add_argument("--method", default="ar")
    ig.add_argument("--labels", required=True, help="comma-separated class indices (or class names)")
    ig.add_argument("--param", type=_param, action="append", default=[], metavar="KEY=VALUE",
                    help="method parameter, e.g. --param window=8 (repeatable)")
    ig.add_argument("--cfg-scale", type=float, default=2.0)
    ig.add_argument("--temperature", type=float, default=1.0)
    ig.add_argument("--top-k", type=int, default=0)
    ig.add_argument("--top-p", type=float, default=1.0)
    ig.add_argument("--seed", type=int, default=0)
    ig.add_argument("--out", required=True, help="directory for the PNGs")
    add_device_option(ig)
    ig.set_defaults(func=cmd_image_generate)
    from mmaccel.image.scale_pipeline import SCALE_METHODS, SCALE_SAMPLING

    isg = image_sub.add_parser("generate-scale", help="next-scale (VAR) generation, plain or CoDe: one PNG per label")
    isg.add_argument("--model", default="builtin:fashion-mnist-var",
                     help="builtin:fashion-mnist-var, a directory with var.*, vq.* (refiner.*), or a VAR file (with --vq)")
    isg.add_argument("--vq", default=None, help="multi-scale tokenizer when --model is a VAR file (vae_ch160v4096z32.pth)")
    isg.add_argument("--refiner", default="builtin", help="the small VAR for CoDe: a checkpoint, 'builtin' or 'none'")
    isg.add_argument("--method", default="ar", choices=SCALE_METHODS)
    isg.add_argument("--draft-steps", type=int, default=None, help="code: scales the large VAR draws (default 6)")
    isg.add_argument("--specialised", action="store_true", help="code: hand off to the refiner specialised for N (or for the latest earlier N)")
    isg.add_argument("--refiner-cfg", type=float, default=None, help="code: the refiner's guidance (default: --cfg-scale)")
    isg.add_argument("--refiner-temperature", type=float, default=None,
                     help="code: the refiner's temperature (default: --temperature)")
    isg.add_argument("--labels", required=True, help="comma-separated class indices (or class names)")
    isg.add_argument("--cfg-scale", type=float, default=SCALE_SAMPLING["cfg_scale"], help="VAR's ramped guidance")
    isg.add_argument("--temperature", type=float, default=SCALE_SAMPLING["temperature"])
    isg.add_argument("--top-k", type=int, default=SCALE_SAMPLING["top_k"])
    isg.add_argument("--top-p", type=float, default=SCALE_SAMPLING["top_p"])
    isg.add_argument("--patch-nums", type=int, nargs="+", default=None, help="the scale schedule of an official tokenizer")
    isg.add_argument("--num-heads", type=int, default=None, help="heads of a VAR file whose count cannot be inferred")
    isg.add_argument("--seed", type=int, default=0)
    isg.add_argument("--out", required=True, help="directory for the PNGs")
    add_device_option(isg)
    isg.set_defaults(func=cmd_image_generate_scale)
    from mmaccel.image.continuous_pipeline import CONTINUOUS_METHODS, CONTINUOUS_SAMPLING

    icg = image_sub.add_parser("generate-continuous",
                               help="continuous-token (MAR-style) generation: AR, MAR's multi-token mode or CSpD")
    icg.add_argument("--model", default="builtin:fashion-mnist-mar",
                     help="builtin:fashion-mnist-mar, a directory with mar.safetensors, kl.safetensors "
                          "(mar_draft.safetensors), or a MAR file (with --tokenizer)")
    icg.add_argument("--tokenizer", default=None, help="KL tokenizer when --model is a MAR file")
    icg.add_argument("--draft", default="builtin", help="the draft model for CSpD: a checkpoint, 'builtin' or 'none'")
    icg.add_argument("--method", default="ar", choices=CONTINUOUS_METHODS)
    icg.add_argument("--labels", required=True, help="comma-separated class indices (or class names)")
    icg.add_argument("--num-iter", type=int, default=None, help="generation steps (default: one token a step; L/4 for mar)")
    icg.add_argument("--cfg", type=float, default=CONTINUOUS_SAMPLING["cfg"], help="MAR's linearly ramped guidance")
    icg.add_argument("--temperature", type=float, default=CONTINUOUS_SAMPLING["temperature"])
    icg.add_argument("--diffusion-steps", type=int, default=CONTINUOUS_SAMPLING["diffusion_steps"])
    icg.add_argument("--num-draft", type=int, default=None, help="cspd: drafts per verification (default 8)")
    icg.add_argument("--prefill-ratio", type=float, default=None, help="cspd: share of steps the target runs first (0.15)")
    icg.add_argument("--inner-temperature", type=float, default=None, help="cspd: density flattening (42; 1 = exact)")
    icg.add_argument("--seed", type=int, default=0)
    icg.add_argument("--out", required=True, help="directory for the PNGs")
    add_device_option(icg)
    icg.set_defaults(func=cmd_image_generate_continuous)

    asr = sub.add_parser("asr", help="speech recognition with Whisper")
    asr_sub = asr.add_subparsers(dest="asr_command", required=True)
    at = asr_sub.add_parser("transcribe", help="print one transcript per audio file (tab-separated after the path)")
    at.add_argument("files", nargs="+", help="audio files (wav, flac, ogg, mp3, ...); > 30 s is chunked")
    at.add_argument("--model", default="builtin:base", help="builtin:base, builtin:tiny.en or a local HF Whisper directory")
    at.add_argument("--heads", default="auto",
                    help="heads file(s), comma-separated (Medusa / exit / block / EAGLE), 'auto' (the shipped ones) or 'none'")
    at.add_argument("--draft", default="auto",
                    help="draft decoder file for speculative/tree, 'auto' (shipped draft) or 'none'")
    at.add_argument("--assistant", default=None,
                    help="another Whisper for speculative-cross (builtin:tiny.en or a local HF Whisper directory)")
    at.add_argument("--method", default="greedy")
    at.add_argument("--param", type=_param, action="append", default=[], metavar="KEY=VALUE",
                    help="method parameter, e.g. --param depth=4 (repeatable)")
    at.add_argument("--batch-size", type=int, default=8)
    at.add_argument("--language", default="en", help="language code for multilingual models")
    at.add_argument("--encoder", default="fp32", choices=("fp32", "bf16", "int8"),
                    help="encoder precision: fp32 (the model as loaded) or cheaper bf16 / int8 (may change transcripts; "
                         "int8 fails on noisy audio, prefer bf16)")
    add_device_option(at)
    at.set_defaults(func=cmd_asr_transcribe)

    ac = asr_sub.add_parser("ctc", help="CTC transcription: greedy or batched beam search with an LM and boosting")
    ac.add_argument("files", nargs="+", help="audio files; > 30 s is cut into windows")
    ac.add_argument("--model", default="builtin:ctc-base",
                    help="builtin:ctc-base, a WhisperCTC directory or a transformers Wav2Vec2ForCTC directory")
    ac.add_argument("--method", default="beam", choices=("greedy", "beam"))
    ac.add_argument("--beam", type=int, default=16)
    ac.add_argument("--lm", default=None, help="ARPA n-gram over the model's labels (characters for builtin:ctc-base)")
    ac.add_argument("--lm-weight", type=float, default=0.5)
    ac.add_argument("--insertion-bonus", type=float, default=0.0)
    ac.add_argument("--boost", action="append", default=[], metavar="PHRASE", help="phrase to boost (repeatable)")
    ac.add_argument("--boost-weight", type=float, default=1.0)
    ac.add_argument("--exit-threshold", type=float, default=None,
                    help="encoder early exit: leave after the first exit head whose mean entropy is below this")
    ac.set_defaults(func=cmd_asr_ctc)

    aw = asr_sub.add_parser("whisfusion", help="parallel masked-diffusion decoding (Whisfusion) on a Whisper encoder")
    aw.add_argument("files", nargs="+", help="audio files; > 30 s is chunked")
    aw.add_argument("--model", default="builtin:whisfusion-tiny.en", help="builtin:whisfusion-tiny.en or a saved directory")
    aw.add_argument("--candidates", type=int, default=8, help="K candidate transcripts decoded side by side")
    aw.add_argument("--steps", type=int, default=4, help="refinement steps (decoder passes)")
    aw.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of candidates 1..K-1")
    aw.add_argument("--select", default="rover", choices=("rover", "confidence"))
    aw.add_argument("--batch-size", type=int, default=8)
    aw.add_argument("--seed", type=int, default=0)
    add_device_option(aw)
    aw.set_defaults(func=cmd_asr_whisfusion)

    b = sub.add_parser("bench", help="run a benchmark suite (or `report` to refresh the README tables)")
    b.add_argument("suite", help="core | image | image-scale | image-continuous | image-fid | asr | asr-nar | ctc | video | kernels | report")
    b.add_argument("--quick", action="store_true", help="reduced run (same code path, fewer samples)")
    b.add_argument("--out", help="JSON path (Markdown and PNG are written beside it)")
    b.add_argument("--methods", help="comma-separated methods, e.g. 'speculative:k=6,ngram'")
    b.add_argument("--samples", type=int, default=None, help="image suite: samples per method for the quality scores (full run: 5008)")
    b.add_argument("--inception-samples", type=int, default=None,
                   help="image suite: of those, how many the (slow) Inception FID scores (full run: 300)")
    b.add_argument("--model", default=None, help="asr suite: builtin:base (default), builtin:tiny.en or a Whisper directory; "
                   "video suite: builtin:moving-fashion (default) or a Qwen-VL directory with words.json; "
                   "ctc suite: builtin:ctc-base (default), a WhisperCTC or a Wav2Vec2ForCTC directory; "
                   "asr-nar suite: builtin:whisfusion-tiny.en (default) or a Whisfusion directory; "
                   "image suite: builtin:fashion-mnist (default) or builtin:fashion-mnist-sjd2 (the GPT fine-tuned "
                   "for SJD2); image-fid: those two, builtin:fashion-mnist-var (the image-scale samples) or "
                   "builtin:fashion-mnist-mar (the image-continuous samples)")
    b.add_argument("--split", default=None, choices=("in-domain", "ood"),
                   help="speech suites (asr, asr-nar, ctc): the held-out in-domain set (default) or the out-of-domain one")
    b.add_argument("--heads", default=None,
                   help="asr suite: heads file(s), comma-separated, 'auto' (the shipped ones, default) or 'none'")
    b.add_argument("--draft", default=None, help="asr suite: draft decoder file, 'auto' (default) or 'none'")
    add_device_option(b, default=None)
    b.add_argument("--threads", type=int, default=None,
                   help="CPU threads for the run (default: torch's, one per core); recorded with the results")
    b.add_argument("--readme", default="README.md")
    b.add_argument("--dir", default="benchmarks")
    b.set_defaults(func=cmd_bench)

    d = sub.add_parser("demo", add_help=False,
                       help="the web app: image, speech, text and video tabs on the embedded models (demo --help for options)")
    d.set_defaults(func=cmd_demo)

    c = sub.add_parser("compare", help="in the terminal: AR vs the accelerated methods on the embedded default models")
    c.add_argument("--out", default="runs/demo", help="directory for the sample grid")
    c.set_defaults(func=cmd_compare)

    from mmaccel.eval.cli import add_eval_parser
    add_eval_parser(sub)
    m = sub.add_parser("methods", help="list the decoding methods")
    m.set_defaults(func=cmd_methods)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if argv[:1] == ["demo"]:                 # the app parses its own options (--host, --port, --share, ...)
        args, _ = parser.parse_known_args(["demo"])
        args.app_args = argv[1:]
    else:
        args = parser.parse_args(argv)
    if getattr(args, "draft", None) == "none":
        args.draft = None
    try:
        return args.func(args)
    except MMAccelError as err:
        say(f"mmaccel: error: {err}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
