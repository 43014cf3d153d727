"""Image tab: class-conditional generation on the built-in Fashion-MNIST GPT, AR next to a method with
the same seed: images, target passes, speed-up, TV spent, and where each token was committed."""

from __future__ import annotations

import time
import zipfile
from pathlib import Path

import gradio as gr
import numpy as np

from demos.method_controls import Control, MethodControls
from demos.render import pass_heatmap
from demos.shared import SharedModel, choice, method_help, method_menu, number, ratio, reported_rows, shown_on_page
from mmaccel.image.methods import build_image_method
from mmaccel.image.pipeline import FASHION_CLASSES, ImagePipeline, check_labels

BASELINE = "ar"                  # every method runs next to AR with the same seed
# what the built-in GPT's pipeline offers methods (`ImagePipeline.resources`); sjd2 is on the Image II tab, with
# the GPT fine-tuned for it
LOADED = ("draft", "latents", "embeddings", "embedding_scale")
METHODS = method_menu(ImagePipeline.methods(), LOADED, skip=(BASELINE, "sjd2"))
# the parameters the page has a control for (the others keep their defaults); each shows its parameter's help
CONTROLS = {"window": Control("window (Jacobi drafts per pass)", 8, 1, 32),
            "row_window": Control("Jacobi window per image row (0 = none)", 0, 0, 15),
            "k": Control("k (drafts per pass)", 4, 1, 8),
            "delta": Control("δ (LANTERN's TV budget)", 0.1, 0, 0.5, 0.01),
            "s": Control("s (ZipAR: a row starts s tokens behind the one above)", 4, 1, 16),
            "coupled": Control("coupled noise", False),
            "grouped": Control("grouped acceptance (GSD clusters; ZipAR needs window ≥ 1)", False)}
# ZipAR's window is per image row, where 0 (none) is allowed: a slider of its own
METHOD_CONTROLS = MethodControls({m: "image" for m in METHODS}, CONTROLS,
                                 bound={("zipar", "window"): "row_window"})
MIXED = "all classes, in turn"
MAX_BATCH = 8
DISPLAY_SCALE = 3                      # the 64-px samples are shown 3x larger (nearest neighbour)


def image_model(source: str, device: str | None = None) -> SharedModel:
    def load() -> ImagePipeline:
        pipe = ImagePipeline.from_pretrained(source, device=device)
        pipe.generate([0], "ar", seed=0)          # warm-up: first-call costs stay out of the speed-up
        return pipe

    return SharedModel("image", load)


def method_params(method: str, window, row_window, k, delta, s, coupled, grouped) -> dict:
    """The method's own settings from the tab's controls (range-checked as the API may send anything)."""
    values = dict(zip(CONTROLS, (window, row_window, k, delta, s, coupled, grouped)))
    return METHOD_CONTROLS.params(method, values)


def class_labels(class_name, batch: int, num_classes: int, names) -> list[int]:
    """The batch's class indices from the class control: every class in turn (MIXED) or the chosen one `batch`
    times. `names`: the model's class names (None: the built-in names are offered, and a name is an error)."""
    class_name = choice(class_name, "class", (MIXED, *(names or FASHION_CLASSES)))
    if class_name == MIXED:
        return [i % num_classes for i in range(batch)]
    return check_labels([class_name] * batch, num_classes, names)     # an unknown name is a clear InputError


def shown(image):
    return image.resize((image.width * DISPLAY_SCALE, image.height * DISPLAY_SCALE), resample=0)


def png_zip(workdir: Path, request, runs: dict, names: list[str]) -> str:
    """Every image of `runs` ({method: output}) as a PNG, zipped in a fresh folder of the request's session."""
    directory = workdir / (getattr(request, "session_hash", None) or "api") / str(time.time_ns())
    directory.mkdir(parents=True, exist_ok=True)
    archive = directory / "samples.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for method, out in runs.items():
            for i, (image, name) in enumerate(zip(out.images, names)):
                path = directory / f"{method}_{i:02d}_{name.replace('/', '-').replace(' ', '_')}.png"
                image.save(path)
                zf.write(path, path.name)
    return str(archive)


def _tv_spent(method: str, params: dict, fast, lossless: bool) -> str:
    if lossless:
        return "0 (lossless)"
    if method == "zipar" and not params.get("grouped"):
        return "not bounded (ZipAR changes the context a token sees, not its acceptance)"
    tv = np.array(fast.stats.deviation_per_row)
    tokens = fast.tokens[0].numel()
    if params.get("coupled"):
        return f"{tv.mean():.1f} tokens swapped per image of {tokens} (max {tv.max():.0f})"
    return f"TV {tv.mean():.3f} per image, summed over its {tokens} tokens ({tv.mean() / tokens:.4f} per token)"


def _stats_table(method: str, params: dict, base, fast, base_s: float, fast_s: float, lossless: bool) -> str:
    per_pass = lambda out: out.stats.new_tokens / len(out.labels) / out.stats.nfe  # noqa: E731
    rows = [("target passes (NFE)", base.stats.nfe, fast.stats.nfe),
            ("NFE ratio (AR / method)", "1.00×", ratio(base.stats.nfe, fast.stats.nfe)),
            ("tokens per pass (per image)", f"{per_pass(base):.2f}", f"{per_pass(fast):.2f}"),
            ("decode time (s)", f"{base_s:.2f}", f"{fast_s:.2f}"),
            ("speed-up (wall clock)", "1.00×", ratio(base_s, fast_s)),
            *reported_rows(base.stats, fast.stats),
            ("TV spent", "0", _tv_spent(method, params, fast, lossless))]
    lines = [f"| | AR | {method} |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def build(model: SharedModel, workdir: Path) -> None:
    """The tab's controls and events (call inside a gr.Blocks / gr.Tab)."""
    with gr.Row():
        with gr.Column(scale=1):
            class_name = gr.Dropdown([MIXED, *FASHION_CLASSES], value="Sneaker", label="class", elem_id="image-class")
            method = gr.Dropdown(list(METHODS), value="zipar", label="method", elem_id="image-method")
            with gr.Group():
                controls = METHOD_CONTROLS.components("zipar")
            about = gr.Markdown(method_help(ImagePipeline.methods()["zipar"]), elem_id="image-method-help")
            cfg_scale = gr.Slider(1, 5, value=2, step=0.25, label="CFG scale")
            temperature = gr.Slider(0, 1.5, value=1.0, step=0.05, label="temperature (0 = greedy)")
            seed = gr.Number(0, precision=0, label="seed", minimum=0)
            batch = gr.Slider(1, MAX_BATCH, value=4, step=1, label="batch (images)", elem_id="image-batch")
            run = gr.Button("Generate", variant="primary", elem_id="image-run")
        with gr.Column(scale=2):
            ar_gallery = gr.Gallery(label="AR", columns=MAX_BATCH // 2, format="png", elem_id="image-ar", height=260,
                                    object_fit="contain")
            fast_gallery = gr.Gallery(label="method", columns=MAX_BATCH // 2, format="png", elem_id="image-method",
                                      height=260, object_fit="contain")
            stats = gr.Markdown(elem_id="image-stats")
            with gr.Row():
                ar_heat = gr.Image(label="AR: pass per token (first image)", format="png", elem_id="image-ar-heat")
                fast_heat = gr.Image(label="method: pass per token (first image)", format="png", elem_id="image-heat")
            files = gr.File(label="download the PNGs", elem_id="image-files")

    method.change(lambda name: [*METHOD_CONTROLS.updates(name),
                                 method_help(ImagePipeline.methods()[name]) if name in METHODS else ""],
                  method, [*controls.values(), about], queue=False)

    @shown_on_page
    def generate(class_name, method, window, row_window, k, delta, s, coupled, grouped, cfg_scale, temperature, seed, batch,
                 request: gr.Request, progress=gr.Progress()):
        method = choice(method, "method", METHODS)
        params = method_params(method, window, row_window, k, delta, s, coupled, grouped)
        batch = number(batch, "batch", 1, MAX_BATCH, integer=True)
        sampling = {"cfg_scale": number(cfg_scale, "CFG scale", 1, 10), "temperature": number(temperature, "temperature", 0, 2),
                    "seed": number(seed, "seed", 0, 2**31 - 1, integer=True)}
        progress(0.0, desc="loading the image model")
        with model.use() as pipe:
            labels = class_labels(class_name, batch, pipe.model.num_classes, pipe.class_names)
            progress(0.1, desc="AR")
            t0 = time.perf_counter()
            base = pipe.generate(labels, BASELINE, **sampling)
            base_s = time.perf_counter() - t0
            progress(0.5, desc=method)
            t0 = time.perf_counter()
            fast = pipe.generate(labels, method, **sampling, **params)
            fast_s = time.perf_counter() - t0
            lossless = build_image_method(method, **params).lossless
            names = [pipe.class_names[i] if pipe.class_names else str(i) for i in labels]
        progress(0.9, desc="drawing")
        heat = [None if out.commit_pass is None else pass_heatmap(out.commit_pass[0].numpy(), f"{name}: {out.stats.nfe} passes")
                for name, out in (("AR", base), (method, fast))]
        archive = png_zip(workdir, request, {"ar": base, method: fast}, names)
        captions = lambda out: [(shown(im), n) for im, n in zip(out.images, names)]  # noqa: E731
        return (captions(base), gr.update(value=captions(fast), label=method),
                _stats_table(method, params, base, fast, base_s, fast_s, lossless), heat[0],
                gr.update(value=heat[1], label=f"{method}: pass per token (first image)"), archive)

    run.click(generate, [class_name, method, *controls.values(), cfg_scale, temperature, seed, batch],
              [ar_gallery, fast_gallery, stats, ar_heat, fast_heat, files], api_name="image")

