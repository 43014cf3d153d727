"""The models `mmaccel serve` can serve, by the id clients send as `model`, and how each is loaded."""

from __future__ import annotations

from dataclasses import dataclass

from mmaccel.errors import check


@dataclass(frozen=True)
class ServedModel:
    id: str            # what clients send as `model`
    family: str        # the pipeline family (`mmaccel.registries.FAMILIES`)
    source: str        # what its pipeline's from_pretrained takes

    def load(self, device: str | None = None):
        """Its pipeline (the weights come from the packages that carry them, as everywhere in mmaccel)."""
        from mmaccel.speech.pipeline import ASRPipeline

        return ASRPipeline.from_pretrained(self.source, device=device)


CATALOGUE = {m.id: m for m in (ServedModel("whisper-base", "speech", "builtin:base"),
                                ServedModel("whisper-tiny.en", "speech", "builtin:tiny.en"))}
# OpenAI clients often send whisper-1: it names the first speech model served
ALIASES = {"whisper-1": "speech"}
DEFAULT_MODELS = ("whisper-base",)


def served_models(ids: list[str] | tuple[str, ...]) -> list[ServedModel]:
    """The catalogue entries of `ids`, checked."""
    unknown = [i for i in ids if i not in CATALOGUE]
    check(not unknown, f"unknown model(s) {', '.join(unknown)}; mmaccel serve serves {', '.join(CATALOGUE)}")
    check(len(set(ids)) == len(ids) and ids, "--models names each model once, at least one")
    return [CATALOGUE[i] for i in ids]
