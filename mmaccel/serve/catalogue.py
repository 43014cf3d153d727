"""The models `mmaccel serve` can serve, by the id clients send as `model`, and how each is loaded."""

from __future__ import annotations

from dataclasses import dataclass

from mmaccel.errors import check

FAMILIES = ("speech", "image", "text")


@dataclass(frozen=True)
class ServedModel:
    """One model `mmaccel serve` can serve: the id clients name it by, its family, its pipeline and its source."""

    id: str            # what clients send as `model`
    family: str        # speech, image or text: the endpoints that take it
    pipeline: str      # the pipeline class that loads it (`load`)
    source: str        # what its pipeline's from_pretrained takes

    def load(self, device: str | None = None, precision: str = "fp32"):
        """Its pipeline (the weights come from the packages that carry them, as everywhere in mmaccel); a speech
        model at `precision` (`mmaccel.engine.precision`; the other families run as loaded)."""
        if self.pipeline == "whisper":
            from mmaccel.speech.pipeline import ASRPipeline

            return ASRPipeline.from_pretrained(self.source, device=device, precision=precision)
        if self.pipeline == "next-token":
            from mmaccel.image.pipeline import ImagePipeline as Pipeline
        elif self.pipeline == "next-scale":
            from mmaccel.image.scale_pipeline import ScalePipeline as Pipeline
        elif self.pipeline == "continuous":
            from mmaccel.image.continuous_pipeline import ContinuousPipeline as Pipeline
        else:
            from mmaccel.lm.pipeline import TextPipeline as Pipeline
        return Pipeline.from_pretrained(self.source, device=device)


CATALOGUE = {m.id: m for m in (
    ServedModel("whisper-base", "speech", "whisper", "builtin:base"),
    ServedModel("whisper-tiny.en", "speech", "whisper", "builtin:tiny.en"),
    ServedModel("llamagen-fashion-mnist", "image", "next-token", "builtin:fashion-mnist"),
    ServedModel("var-fashion-mnist", "image", "next-scale", "builtin:fashion-mnist-var"),
    ServedModel("mar-fashion-mnist", "image", "continuous", "builtin:fashion-mnist-mar"),
    ServedModel("smollm2-135m-instruct", "text", "text", "builtin:smollm2"),
)}
# the method registry (`mmaccel.registries.FAMILIES`) of each pipeline
REGISTRY_OF = {"whisper": "speech", "next-token": "image", "next-scale": "image-scale",
               "continuous": "image-continuous", "text": "text"}
# OpenAI clients often send whisper-1: it names the first speech model served
ALIASES = {"whisper-1": "speech"}
DEFAULT_MODELS = ("whisper-base", "llamagen-fashion-mnist", "smollm2-135m-instruct")


def served_models(ids: list[str] | tuple[str, ...]) -> list[ServedModel]:
    """The catalogue entries of `ids`, checked."""
    unknown = [i for i in ids if i not in CATALOGUE]
    check(not unknown, f"unknown model(s) {', '.join(unknown)}; mmaccel serve serves {', '.join(CATALOGUE)}")
    check(len(set(ids)) == len(ids) and ids, "--models names each model once, at least one")
    return [CATALOGUE[i] for i in ids]
