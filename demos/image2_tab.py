"""Image II tab: the other image worlds, each method next to its own model's AR with the same seed:
next-scale VAR with CoDe, continuous tokens (MAR) with CSpD and MAR's multi-token mode, and SJD2 on the
GPT fine-tuned for it. Every world samples with its built-in recipe (docs/models.md)."""

from __future__ import annotations

import operator
import time
from pathlib import Path

import gradio as gr
import torch

from demos.image_tab import MAX_BATCH, MIXED, class_labels, png_zip, shown
from demos.method_controls import Control, MethodControls
from demos.shared import SharedModel, choice, method_menu, number, ratio, reported_rows, shown_on_page
from mmaccel.image.continuous_methods import MAR_TOKENS_PER_STEP
from mmaccel.image.continuous_pipeline import BUILTIN_CONTINUOUS, ContinuousPipeline
from mmaccel.image.pipeline import BUILTIN_SJD2, FASHION_CLASSES, ImagePipeline
from mmaccel.image.scale_pipeline import BUILTIN_SCALE, ScalePipeline

BASELINE = "ar"                  # every method runs next to its own world's AR
# world -> (its AR, its pipeline family, the methods offered); the GPT world offers the method it was fine-tuned for
WORLDS = {"var": ("large VAR, next scale", "image-scale", method_menu(ScalePipeline.methods(), skip=(BASELINE,))),
          "mar": ("target MAR, one token a step", "image-continuous",
                  method_menu(ContinuousPipeline.methods(), skip=(BASELINE,))),
          "gpt": ("GPT fine-tuned for SJD2", "image", ("sjd2",))}
WORLD_OF = {method: world for world, (_, _, methods) in WORLDS.items() for method in methods}
# the parameters the page has a control for (the others keep their defaults); each shows its parameter's help
CONTROLS = {"draft_steps": Control("N (scales from the large VAR)", 7, 1, 9),
            "specialised": Control("refiner trained for this N (shipped for N = 6, 7; N = 8, 9 use N = 7's)", True),
            "num_draft": Control("draft tokens per target pass", 8, 1, 32),
            "tokens_per_step": Control("tokens per target step", MAR_TOKENS_PER_STEP, 1, 32),
            "window": Control("window (Jacobi drafts per pass)", 16, 1, 64),
            "steps": Control("denoising levels", 1, 1, 8),
            "coupled": Control("coupled noise (the same tokens as AR, not only the same law)", True)}
# the checkbox says "specialised": CoDe's training_free=False
METHOD_CONTROLS = MethodControls({m: WORLDS[w][1] for m, w in WORLD_OF.items()}, CONTROLS,
                                 bound={("code", "training_free"): ("specialised", operator.not_)})


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


def method_params(method: str, draft_steps, specialised, num_draft, tokens_per_step, window, steps, coupled) -> dict:
    """The method's own settings from the tab's controls (range-checked as the API may send anything)."""
    values = dict(zip(CONTROLS, (draft_steps, specialised, num_draft, tokens_per_step, window, steps, coupled)))
    return METHOD_CONTROLS.params(method, values)


def _identical(world: str, base, fast) -> tuple[str, str]:
    """(what is compared, how much of it the method shares with AR): leading scales for VAR, images otherwise."""
    if world == "var":        # CoDe keeps the large model's first N scales (same seed, same codes)
        scales = len(base.indices)
        same = next((k for k in range(scales) if not torch.equal(base.indices[k], fast.indices[k])), scales)
        return "leading scales identical to AR (all images)", f"{same} of {scales}"
    a, b = base.tokens, fast.tokens
    same = sum(bool(torch.equal(x, y)) for x, y in zip(a, b)) if a.shape == b.shape else 0
    return "images identical to AR", f"{same} of {len(base.labels)}"


def _stats_table(method: str, params: dict, base, fast, base_s: float, fast_s: float) -> str:
    world = WORLD_OF[method]
    rows = [("target passes (NFE)", base.stats.nfe, fast.stats.nfe),
            ("draft passes" if world != "var" else "small VAR passes", base.stats.draft_passes, fast.stats.draft_passes),
            ("NFE ratio (AR / method)", "1.00×",
             ratio(base.stats.nfe, fast.stats.nfe) if fast.stats.nfe else "∞ (no target pass)"),
            ("decode time (s)", f"{base_s:.2f}", f"{fast_s:.2f}"),
            ("speed-up (wall clock)", "1.00×", ratio(base_s, fast_s)),
            ("peak memory (MB)", f"{base.stats.peak_mem_mb:.0f}", f"{fast.stats.peak_mem_mb:.0f}")]
    rows += reported_rows(base.stats, fast.stats)           # KV cache, CSpD's fallbacks, ...
    what, same = _identical(world, base, fast)
    rows += [(what, "–", same), ("lossless", "–", METHOD_CONTROLS.lossless(method, params))]
    lines = [f"| | AR ({WORLDS[world][0]}) | {method} |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def build(models: dict[str, SharedModel], workdir: Path) -> None:
    """The tab's controls and events (call inside a gr.Blocks / gr.Tab)."""
    with gr.Row():
        with gr.Column(scale=1):
            class_name = gr.Dropdown([MIXED, *FASHION_CLASSES], value="Trouser", label="class", elem_id="image2-class")
            method = gr.Dropdown(list(WORLD_OF), value="code", label="method", elem_id="image2-method",
                                 info="; ".join(f"{', '.join(methods)}: {family}"
                                                for _, family, methods in WORLDS.values()))
            with gr.Group():
                controls = METHOD_CONTROLS.components("code")
            seed = gr.Number(0, precision=0, label="seed", minimum=0)
            batch = gr.Slider(1, MAX_BATCH, value=4, step=1, label="batch (images)", elem_id="image2-batch")
            run = gr.Button("Generate", variant="primary", elem_id="image2-run")
        with gr.Column(scale=2):
            about = gr.Markdown(METHOD_CONTROLS.plugin("code").summary, elem_id="image2-about")
            ar_gallery = gr.Gallery(label="AR", columns=MAX_BATCH // 2, format="png", elem_id="image2-ar",
                                    height=260, object_fit="contain")
            fast_gallery = gr.Gallery(label="method", columns=MAX_BATCH // 2, format="png", elem_id="image2-fast",
                                      height=260, object_fit="contain")
            stats = gr.Markdown(elem_id="image2-stats")
            files = gr.File(label="download the PNGs", elem_id="image2-files")

    method.change(lambda name: [*METHOD_CONTROLS.updates(name),
                                 METHOD_CONTROLS.plugin(name).summary if name in WORLD_OF else ""],
                  method, [*controls.values(), about], queue=False)

    @shown_on_page
    def generate(class_name, method, draft_steps, specialised, num_draft, tokens_per_step, window, steps, coupled,
                 seed, batch, request: gr.Request, progress=gr.Progress()):
        method = choice(method, "method", WORLD_OF)
        world = WORLD_OF[method]
        batch = number(batch, "batch", 1, MAX_BATCH, integer=True)
        seed = number(seed, "seed", 0, 2**31 - 1, integer=True)
        progress(0.0, desc=f"loading the {models[world].name} model")
        with models[world].use() as pipe:
            params = method_params(method, draft_steps, specialised, num_draft, tokens_per_step, window, steps, coupled)
            num_classes = pipe.model.config.num_classes if world == "mar" else pipe.model.num_classes
            labels = class_labels(class_name, batch, num_classes, pipe.class_names)
            names = [pipe.class_names[i] if pipe.class_names else str(i) for i in labels]
            # coupled SJD2 reads position-fixed noise: its AR twin reads the same noise one token a pass
            base_params = {"coupled": params["coupled"]} if world == "gpt" else {}
            progress(0.1, desc="AR")
            t0 = time.perf_counter()
            base = pipe.generate(labels, BASELINE, seed=seed, **base_params)
            base_s = time.perf_counter() - t0
            progress(0.5, desc=method)
            t0 = time.perf_counter()
            fast = pipe.generate(labels, method, seed=seed, **params)
            fast_s = time.perf_counter() - t0
        archive = png_zip(workdir, request, {"ar": base, method: fast}, names)
        captions = lambda out: [(shown(im), n) for im, n in zip(out.images, names)]  # noqa: E731
        return (gr.update(value=captions(base), label=f"AR: {WORLDS[world][0]}"),
                gr.update(value=captions(fast), label=method), _stats_table(method, params, base, fast, base_s, fast_s),
                archive)

    run.click(generate, [class_name, method, *controls.values(), seed, batch], [ar_gallery, fast_gallery, stats, files],
              api_name="image2")
