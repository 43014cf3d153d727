"""`/v1/images/generations`: OpenAI's image request over the class-conditional image pipelines (next-token,
next-scale and continuous), with our `method`, `method_params`, `seed` and `cfg_scale` fields.

`prompt` names a class (a class name, case aside, or its index) and `n` images of it become `n` rows of a call.
Unseeded requests with equal options share calls (the call's seed is drawn at random); on the next-token pipeline
they join a call in progress as its rows end (`JoinedImages`), where the method can. A request with a `seed` is
decoded in a call of its own, so its images are what the pipeline gives for `[class] * n` with that seed however
many requests the server holds.
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
from mmaccel.serve.batching import Job, JoinedRows, Joining, ModelWorker
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
    """An image request as `parse_request` reads it: the model it names, the class its prompt names (not yet
    checked: `label_of`), the `n` images asked for, the size asked for (None or "auto": the model's own) and the
    options it is drawn with."""

    model: str
    prompt: str
    n: int
    size: str | None
    options: ImageOptions


@dataclass
class ImageResult:
    """What an image request is answered with: its `n` images, the seed of the call that drew them and their class
    index."""

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
    """`labels` (class indices or names) as class indices of `pipeline`'s model, checked (`check_labels`)."""
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


def image_worker(name: str, pipeline, kind: str, *, max_rows: int, max_queue: int, on_call,
                 continuous: bool = True) -> ModelWorker:
    """The worker that draws one image model's requests with equal options together: unseeded next-token requests
    in a call whose rows take waiting requests as they end (`continuous`, where the method can), the others in a
    call per batch of requests."""

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

    def joins(options: ImageOptions) -> bool:
        if options.seed is not None or not hasattr(pipeline, "generate_joined"):
            return False
        from mmaccel.image.methods import build_image_method

        resources, _ = pipeline.resources(2.0 if options.cfg_scale is None else options.cfg_scale)
        return build_image_method(options.method, **dict(options.params)).joins(resources)

    def run_joining(options: ImageOptions, joining: Joining) -> None:
        JoinedImages(pipeline, options, joining, max_rows).run()

    return ModelWorker(name, run, max_rows=max_rows, max_queue=max_queue, on_call=on_call,
                       joins=joins if continuous else None, run_joining=run_joining)


class JoinedImages(JoinedRows):
    """One continuous-batching call of image requests: a row per image, each job answered when its images are drawn
    (spare rows and the joining rule of `JoinedRows`)."""

    reserve = 0                     # an image request has no prompt tokens

    def __init__(self, pipeline, options: ImageOptions, joining: Joining, max_rows: int):
        self.pipeline, self.options = pipeline, options
        self.cfg = 2.0 if options.cfg_scale is None else options.cfg_scale
        self.seed = random.randrange(2**31)
        self.images: dict[int, list] = {}
        super().__init__(joining, max_rows)
        labels = [job.payload[0] for job, _ in self.first]
        self.labels = labels + [labels[0]] * (self.width - len(labels))
        self.limits = [pipeline.grid ** 2] * len(labels) + [1] * (self.width - len(labels))

    def units(self, job: Job) -> int:
        return job.payload[1]

    def opened(self, job: Job) -> None:
        self.images[id(job)] = [None] * job.payload[1]

    def closed(self, job: Job) -> None:
        del self.images[id(job)]

    def joiner(self, job: Job, unit: int):
        return self.pipeline.joiner(job.payload[0], self.cfg)

    def run(self) -> None:
        """Draw the call to its end (`generate_joined`), this object as its `RowFeed`."""
        guidance = {} if self.options.cfg_scale is None else {"cfg_scale": self.options.cfg_scale}
        self.pipeline.generate_joined(self.labels, self, self.options.method, seed=self.seed, **guidance,
                                      **dict(self.options.params))

    def finished(self, row: int, tokens: list[int], passes: list[int]) -> None:
        """`RowFeed.finished`: draw row `row`'s image; its job is answered once all its images are drawn."""
        if row not in self.table:                   # a spare row (opened empty), or a request that went away
            return
        job, i = self.table.pop(row)
        images = self.images[id(job)]
        images[i] = self.pipeline.image_of(tokens)
        if all(image is not None for image in images):
            del self.images[id(job)]
            self.joining.finish(job, ImageResult(images, self.seed, job.payload[0]))


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
