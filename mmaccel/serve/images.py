"""`/v1/images/generations`: OpenAI's image request over the class-conditional image pipelines (next-token,
next-scale and continuous), with our `method`, `method_params`, `seed` and `cfg_scale` fields.

`prompt` names a class (a class name, case aside, or its index) and `n` images of it become `n` rows of a call.
Unseeded requests with equal options share calls (the call's seed is drawn at random); a request with a `seed`
is decoded in a call of its own, so its images are what the pipeline gives for `[class] * n` with that seed
however many requests the server holds.
"""

from __future__ import annotations

import base64
import io
import itertools
import random
import time
from dataclasses import dataclass
from typing import Any

from mmaccel.errors import check
from mmaccel.serve.batching import ModelWorker
from mmaccel.serve.fields import check_fields, method_params, number, optional_int, optional_str, params_of, positive_int

FIELDS = {"model", "prompt", "n", "response_format", "size", "user", "method", "method_params", "seed", "cfg_scale"}
# the keyword that carries the guidance scale, by pipeline
CFG_KEYWORD = {"next-token": "cfg_scale", "next-scale": "cfg_scale", "continuous": "cfg"}
_ALONE = itertools.count()              # a seeded request's own call key


@dataclass(frozen=True)
class ImageOptions:
    """What an image call is decoded with: requests with equal options share a call."""

    method: str
    params: tuple[tuple[str, Any], ...]
    cfg_scale: float | None
    seed: int | None
    alone: int | None = None            # set for seeded requests: a key no other request has


@dataclass
class ImageRequest:
    model: str
    prompt: str
    n: int
    size: str | None
    options: ImageOptions


@dataclass
class ImageResult:
    images: list                         # PIL images
    seed: int
    label: int


def parse_request(body: Any, default_method: str, max_rows: int) -> ImageRequest:
    """The request of a JSON body; InputError with one line for anything off."""
    check_fields(body, FIELDS, "model", "prompt")
    fmt = optional_str(body, "response_format") or "b64_json"
    check(fmt == "b64_json", f"response_format {fmt!r} is not supported: this server keeps no files; use b64_json")
    n = positive_int(body, "n", 1)
    check(n <= max_rows, f"n is {n}; this server decodes at most {max_rows} images per request")
    cfg = body.get("cfg_scale")
    if cfg is not None:
        cfg = number(body, "cfg_scale", low=0.0)
    seed = optional_int(body, "seed")
    check(seed is None or 0 <= seed < 2**63, f"seed must be in [0, 2**63), got {seed}")
    options = ImageOptions(optional_str(body, "method") or default_method, params_of(method_params(body)), cfg,
                           seed, None if seed is None else next(_ALONE))
    prompt = body["prompt"]
    check(isinstance(prompt, (str, int)) and not isinstance(prompt, bool) and str(prompt).strip(),
          "prompt must name a class: a class name or its index")
    return ImageRequest(body["model"], str(prompt).strip(), n, optional_str(body, "size"), options)


def label_of(pipeline, prompt: str) -> int:
    """The class index a prompt names (a class name, case aside, or an index)."""
    names = pipeline.class_names or ()
    if prompt.isdigit():
        return pipeline_labels(pipeline, [int(prompt)])[0]
    lowered = {name.lower(): name for name in names}
    check(prompt.lower() in lowered, f"prompt {prompt!r} names no class of this model; it takes a class index"
                                     + (f" or one of: {', '.join(names)}" if names else ""))
    return pipeline_labels(pipeline, [lowered[prompt.lower()]])[0]


def pipeline_labels(pipeline, labels: list) -> list[int]:
    from mmaccel.image.pipeline import check_labels

    classes = getattr(pipeline.model, "num_classes", None)
    if classes is None:
        classes = pipeline.model.config.num_classes
    return check_labels(labels, classes, pipeline.class_names)


def check_options(pipeline, options: ImageOptions) -> None:
    """Fail now, in one line, on an unknown method or parameter (before the request can fail a shared call)."""
    registry = pipeline.methods()
    check(options.method in registry, f"unknown method {options.method!r}; choose from {', '.join(registry)}")
    registry[options.method].make(dict(options.params))


def image_worker(name: str, pipeline, kind: str, *, max_rows: int, max_queue: int, on_call) -> ModelWorker:
    """The worker that draws one image model's requests: a call per batch of requests with equal options."""

    def run(options: ImageOptions, payloads: list[tuple[int, int]]) -> list[ImageResult]:
        labels = [label for label, n in payloads for _ in range(n)]
        seed = options.seed if options.seed is not None else random.randrange(2**31)
        guidance = {} if options.cfg_scale is None else {CFG_KEYWORD[kind]: options.cfg_scale}
        out = pipeline.generate(labels, options.method, seed=seed, **guidance, **dict(options.params))
        results, start = [], 0
        for label, n in payloads:
            results.append(ImageResult(out.images[start:start + n], seed, label))
            start += n
        return results

    return ModelWorker(name, run, max_rows=max_rows, max_queue=max_queue, on_call=on_call)


def render(request: ImageRequest, result: ImageResult) -> dict:
    """OpenAI's images response: `data` of base64 PNGs, and under `mmaccel` what drew them."""
    data = []
    for image in result.images:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        data.append({"b64_json": base64.b64encode(buffer.getvalue()).decode("ascii")})
    width, height = result.images[0].size
    return {"created": int(time.time()), "data": data, "size": f"{width}x{height}", "output_format": "png",
            "mmaccel": {"method": request.options.method, "params": dict(request.options.params),
                        "seed": result.seed, "class": result.label, "cfg_scale": request.options.cfg_scale}}
