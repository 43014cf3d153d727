"""Image II tab: the other image worlds, each method next to its own model's AR with the same seed:
next-scale VAR with CoDe, continuous tokens (MAR) with CSpD and MAR's multi-token mode, and SJD2 on the
GPT fine-tuned for it. Every world samples with its built-in recipe (mmaccel/assets/README.md)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import gradio as gr
import torch

from demos.image_tab import MAX_BATCH, MIXED, class_labels, png_zip, shown
from demos.shared import SharedModel, choice, number, ratio, reported_rows, shown_on_page
from mmaccel.image.continuous_pipeline import BUILTIN_CONTINUOUS, MAR_TOKENS_PER_STEP, ContinuousPipeline
from mmaccel.image.pipeline import BUILTIN_SJD2, FASHION_CLASSES, ImagePipeline
from mmaccel.image.scale_pipeline import BUILTIN_SCALE, ScalePipeline

# method -> (world, what it is, lossless against that world's AR)
METHODS = {
    "code": ("var", "CoDe: the large VAR draws the first N scales, the small one the rest", "no (the refiner's scales)"),
    "ar-small": ("var", "the small VAR alone", "no (another model)"),
    "cspd": ("mar", "CSpD: the draft MAR proposes, the target accepts by the diffusion heads' density ratio",
             "no (the reference's inner temperature 42 relaxes the density ratio; README)"),
    "mar": ("mar", "MAR's multi-token mode: several tokens per target step", "no (another sampling order)"),
    "ar-draft": ("mar", "the draft MAR alone", "no (another model)"),
    "sjd2": ("gpt", "SJD2: a Jacobi window denoised from embedding noise, verified by the fine-tuned GPT", "yes"),
}
WORLDS = {"var": "large VAR, next scale", "mar": "target MAR, one token a step", "gpt": "GPT fine-tuned for SJD2"}
# the controls each method reads; the others are hidden while it is selected
CONTROLS = {"code": ("draft_steps", "specialised"), "ar-small": (), "cspd": ("num_draft",),
            "mar": ("tokens_per_step",), "ar-draft": (), "sjd2": ("window", "steps", "coupled")}


def image2_models(device: str | None = None) -> dict[str, SharedModel]:
    """The three worlds' pipelines, each loaded on its first request (built-in models)."""
    def var() -> ScalePipeline:
        pipe = ScalePipeline.from_pretrained(BUILTIN_SCALE, device=device)
        pipe.generate([0], "ar", seed=0)              # warm-up: first-call costs stay out of the speed-up
        return pipe

    def mar() -> ContinuousPipeline:
        pipe = ContinuousPipeline.from_pretrained(BUILTIN_CONTINUOUS, device=device)
        pipe.generate([0], "ar", num_iter=4, seed=0)
        return pipe

    def gpt() -> ImagePipeline:
        pipe = ImagePipeline.from_pretrained(BUILTIN_SJD2, device=device)
        pipe.generate([0], "ar", seed=0)
        return pipe

    return {"var": SharedModel("next-scale VAR", var), "mar": SharedModel("continuous-token MAR", mar),
            "gpt": SharedModel("SJD2 GPT", gpt)}


def method_params(method: str, draft_steps, specialised, num_draft, tokens_per_step, window, steps, coupled,
                  seq_len: int) -> dict:
    """The method's own settings from the tab's controls (range-checked as the API may send anything)."""
    values = {"draft_steps": lambda: number(draft_steps, "N (scales from the large VAR)", 1, 9, integer=True),
              "specialised": lambda: bool(specialised),
              "num_draft": lambda: number(num_draft, "draft tokens", 1, 32, integer=True),
              "tokens_per_step": lambda: number(tokens_per_step, "tokens per step", 1, 32, integer=True),
              "window": lambda: number(window, "window", 1, 64, integer=True),
              "steps": lambda: number(steps, "denoising levels", 1, 8, integer=True),
              "coupled": lambda: bool(coupled)}
    params = {key: values[key]() for key in CONTROLS[method]}
    if "specialised" in params:                   # the refiner trained for this N, else the plain small VAR
        params["training_free"] = not params.pop("specialised")
    if "tokens_per_step" in params:
        params["num_iter"] = math.ceil(seq_len / params.pop("tokens_per_step"))
    return params


def _identical(world: str, base, fast) -> tuple[str, str]:
    """(what is compared, how much of it the method shares with AR): leading scales for VAR, images otherwise."""
    if world == "var":        # CoDe keeps the large model's first N scales (same seed, same codes)
        scales = len(base.indices)
        same = next((k for k in range(scales) if not torch.equal(base.indices[k], fast.indices[k])), scales)
        return "leading scales identical to AR (all images)", f"{same} of {scales}"
    a, b = base.tokens, fast.tokens
    same = sum(bool(torch.equal(x, y)) for x, y in zip(a, b)) if a.shape == b.shape else 0
    return "images identical to AR", f"{same} of {len(base.labels)}"


def _stats_table(method: str, base, fast, base_s: float, fast_s: float) -> str:
    world, _, lossless = METHODS[method]
    rows = [("target passes (NFE)", base.stats.nfe, fast.stats.nfe),
            ("draft passes" if world != "var" else "small VAR passes", base.stats.draft_passes, fast.stats.draft_passes),
            ("NFE ratio (AR / method)", "1.00×",
             ratio(base.stats.nfe, fast.stats.nfe) if fast.stats.nfe else "∞ (no target pass)"),
            ("decode time (s)", f"{base_s:.2f}", f"{fast_s:.2f}"),
            ("speed-up (wall clock)", "1.00×", ratio(base_s, fast_s)),
            ("peak memory (MB)", f"{base.stats.peak_mem_mb:.0f}", f"{fast.stats.peak_mem_mb:.0f}")]
    rows += reported_rows(base.stats, fast.stats)           # KV cache, CSpD's fallbacks, ...
    what, same = _identical(world, base, fast)
    rows += [(what, "–", same), ("lossless", "–", lossless)]
    lines = [f"| | AR ({WORLDS[world]}) | {method} |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def build(models: dict[str, SharedModel], workdir: Path) -> None:
    """The tab's controls and events (call inside a gr.Blocks / gr.Tab)."""
    with gr.Row():
        with gr.Column(scale=1):
            class_name = gr.Dropdown([MIXED, *FASHION_CLASSES], value="Trouser", label="class", elem_id="image2-class")
            method = gr.Dropdown(list(METHODS), value="code", label="method", elem_id="image2-method",
                                 info="code, ar-small: next-scale VAR; cspd, mar, ar-draft: continuous tokens; "
                                      "sjd2: the fine-tuned GPT")
            with gr.Group():
                draft_steps = gr.Slider(1, 9, value=7, step=1, label="N: scales drawn by the large VAR")
                specialised = gr.Checkbox(True, label="refiner trained for this N (shipped for N = 6, 7; N = 8, 9 use N = 7's)")
                num_draft = gr.Slider(1, 32, value=8, step=1, label="draft tokens per target pass", visible=False)
                tokens_per_step = gr.Slider(1, 32, value=MAR_TOKENS_PER_STEP, step=1, label="tokens per target step",
                                            visible=False)
                window = gr.Slider(1, 64, value=16, step=1, label="window (Jacobi drafts per pass)", visible=False)
                steps = gr.Slider(1, 8, value=1, step=1, label="denoising levels", visible=False)
                coupled = gr.Checkbox(True, label="coupled noise (the same tokens as AR, not only the same law)",
                                      visible=False)
            seed = gr.Number(0, precision=0, label="seed", minimum=0)
            batch = gr.Slider(1, MAX_BATCH, value=4, step=1, label="batch (images)", elem_id="image2-batch")
            run = gr.Button("Generate", variant="primary", elem_id="image2-run")
        with gr.Column(scale=2):
            about = gr.Markdown(METHODS["code"][1], elem_id="image2-about")
            ar_gallery = gr.Gallery(label="AR", columns=MAX_BATCH // 2, format="png", elem_id="image2-ar",
                                    height=260, object_fit="contain")
            fast_gallery = gr.Gallery(label="method", columns=MAX_BATCH // 2, format="png", elem_id="image2-fast",
                                      height=260, object_fit="contain")
            stats = gr.Markdown(elem_id="image2-stats")
            files = gr.File(label="download the PNGs", elem_id="image2-files")

    controls = {"draft_steps": draft_steps, "specialised": specialised, "num_draft": num_draft,
                "tokens_per_step": tokens_per_step, "window": window, "steps": steps, "coupled": coupled}
    method.change(lambda name: [gr.update(visible=c in CONTROLS.get(name, ())) for c in controls]
                  + [METHODS[name][1] if name in METHODS else ""], method, [*controls.values(), about], queue=False)

    @shown_on_page
    def generate(class_name, method, draft_steps, specialised, num_draft, tokens_per_step, window, steps, coupled,
                 seed, batch, request: gr.Request, progress=gr.Progress()):
        method = choice(method, "method", METHODS)
        world = METHODS[method][0]
        batch = number(batch, "batch", 1, MAX_BATCH, integer=True)
        seed = number(seed, "seed", 0, 2**31 - 1, integer=True)
        progress(0.0, desc=f"loading the {models[world].name} model")
        with models[world].use() as pipe:
            seq_len = pipe.model.config.seq_len if world == "mar" else 0
            params = method_params(method, draft_steps, specialised, num_draft, tokens_per_step, window, steps,
                                   coupled, seq_len)
            num_classes = pipe.model.config.num_classes if world == "mar" else pipe.model.num_classes
            labels = class_labels(class_name, batch, num_classes, pipe.class_names)
            names = [pipe.class_names[i] if pipe.class_names else str(i) for i in labels]
            # coupled SJD2 reads position-fixed noise: its AR twin reads the same noise one token a pass
            base_params = {"coupled": params["coupled"]} if world == "gpt" else {}
            progress(0.1, desc="AR")
            t0 = time.perf_counter()
            base = pipe.generate(labels, "ar", seed=seed, **base_params)
            base_s = time.perf_counter() - t0
            progress(0.5, desc=method)
            t0 = time.perf_counter()
            fast = pipe.generate(labels, method, seed=seed, **params)
            fast_s = time.perf_counter() - t0
        archive = png_zip(workdir, request, {"ar": base, method: fast}, names)
        captions = lambda out: [(shown(im), n) for im, n in zip(out.images, names)]  # noqa: E731
        return (gr.update(value=captions(base), label=f"AR: {WORLDS[world]}"),
                gr.update(value=captions(fast), label=method), _stats_table(method, base, fast, base_s, fast_s), archive)

    run.click(generate, [class_name, method, draft_steps, specialised, num_draft, tokens_per_step, window, steps, coupled,
                         seed, batch], [ar_gallery, fast_gallery, stats, files], api_name="image2")
