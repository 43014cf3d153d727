"""ImagePipeline: a class-conditional LlamaGen GPT + its VQ tokenizer (+ drafter) and any image method.

>>> pipe = ImagePipeline.from_pretrained("builtin:fashion-mnist")
>>> out = pipe.generate([0, 7, 9], method="gsd", cfg_scale=2.0, seed=0)
>>> out.images[0].save("t-shirt.png"); out.stats.nfe
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mmaccel.core.methods import Method, Resources
from mmaccel.core.plugin import MethodPlugin
from mmaccel.core.sampling import CFG, Sampling
from mmaccel.core.speculative import Joiner, RowFeed
from mmaccel.core.stats import DecodeStats
from mmaccel.devices import check_same_device, resolve_device, resolve_dtype, use_cuda_graphs
from mmaccel.errors import InputError, ModelNotFoundError, check
from mmaccel.image.methods import IMAGE_REGISTRY, build_image_method
from mmaccel.image.models.gpt import LlamaGenGPT, load_gpt
from mmaccel.image.sjd2 import embedding_scale
from mmaccel.image.tokenizers.vq import VQModel, load_vq
from mmaccel.paths import assets_dir

BUILTIN = "builtin:fashion-mnist"
BUILTIN_SJD2 = "builtin:fashion-mnist-sjd2"     # the same with the GPT fine-tuned for SJD2
ASSETS = assets_dir()
BUILTIN_FILES = {"gpt": ASSETS / "fashion_gpt.safetensors", "vq": ASSETS / "fashion_vq.safetensors",
                 "draft": ASSETS / "fashion_gpt_draft.safetensors", "gpt_sjd2": ASSETS / "fashion_gpt_sjd2.safetensors"}
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                   "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")


@dataclass
class ImageOutput:
    """What every image pipeline's `generate` returns (`ScaleOutput` and `ContinuousOutput` add their own fields):
    the images, the tokens they decode from (`decode_pixels(tokens)` redraws them), the labels and the stats."""

    images: list                   # PIL images, one per label
    tokens: Tensor                 # [B, grid, grid] code indices (next-scale: [B, L]; continuous: [B, L, C])
    labels: list[int]
    stats: DecodeStats
    commit_pass: Tensor | None = None   # [B, grid, grid] the target pass that committed each token (1 = prefill)


def _find(directory: Path, stem: str) -> Path | None:
    for suffix in CHECKPOINT_SUFFIXES:
        if (directory / f"{stem}{suffix}").is_file():
            return directory / f"{stem}{suffix}"
    return None


def locate_checkpoints(name: str, builtins: dict[str, dict[str, Path]], stems: dict[str, str], *, what: str,
                       tokenizer: str | Path | None, tokenizer_arg: str, tokenizer_example: str = ""
                       ) -> tuple[dict[str, Path | None], bool]:
    """({role: checkpoint file or None}, built-in?) of an image pipeline. `stems` maps roles to file stems,
    model first and tokenizer second (both required), optional roles after. `name` is a key of `builtins`
    (role -> shipped file, all of which must exist), a directory holding `<stem>.(safetensors|pt|...)`
    files, or the model's checkpoint file with `tokenizer` (the `tokenizer_arg=` argument) its tokenizer."""
    model, tok = list(stems)[:2]
    if name in builtins:
        paths = dict(builtins[name])
        missing = [str(p) for p in paths.values() if not p.is_file()]
        if missing:
            raise ModelNotFoundError(f"the built-in {what} files are missing: {', '.join(missing)} "
                                     "(reinstall mmaccel, or train them: see docs/models.md)")
        return paths, True
    if name.startswith("builtin:"):
        raise ModelNotFoundError(f"unknown built-in {what} {name!r}; the built-in ones are "
                                 f"{' and '.join(repr(b) for b in builtins)}")
    path = Path(name)
    if path.is_dir():
        paths = {role: _find(path, stem) for role, stem in stems.items()}
        if tokenizer is not None:
            paths[tok] = Path(tokenizer)
        if paths[model] is None or paths[tok] is None:
            raise ModelNotFoundError(f"{path} must hold {stems[model]}.(safetensors|pt) and {stems[tok]}.(safetensors|pt) "
                                     "checkpoints")
        return paths, False
    if not path.exists():
        raise ModelNotFoundError(f"{what} checkpoint {path} not found")
    if tokenizer is None:
        raise InputError(f"{path} is a {what} checkpoint: pass its tokenizer too, {tokenizer_arg}=PATH{tokenizer_example}")
    return {**{role: None for role in stems}, model: path, tok: Path(tokenizer)}, False


def weights_fingerprint(*modules: torch.nn.Module | None) -> str:
    """A digest of the modules' weights (cache keys of derived results)."""
    digest = hashlib.sha256()
    for module in modules:
        for name, tensor in ({} if module is None else module.state_dict()).items():
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class ImagePipeline:
    """Class-conditional image generation; `method` picks the decoding algorithm (see
    `mmaccel.image.methods`). The drafter, when there is one, is guided with the same CFG scale."""

    def __init__(self, model: LlamaGenGPT, vq: VQModel, draft: LlamaGenGPT | None = None,
                 class_names: Sequence[str] | None = None):
        check(isinstance(model, LlamaGenGPT), f"model must be a LlamaGenGPT, got {type(model).__name__}")
        check(isinstance(vq, VQModel), f"vq must be a VQModel, got {type(vq).__name__}")
        check(model.vocab_size == vq.codebook_size, f"the GPT has {model.vocab_size} token ids but the tokenizer "
              f"has {vq.codebook_size} codes: they were not trained together")
        check(draft is None or draft.vocab_size == model.vocab_size, "the drafter's vocabulary differs from the target's")
        check_same_device([("target GPT", model), ("tokenizer", vq), ("drafter", draft)])
        self.model, self.vq, self.draft = model.eval(), vq.eval(), None if draft is None else draft.eval()
        self.class_names = tuple(class_names) if class_names is not None else None
        self.grid = model.config.grid_size

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path = BUILTIN, *, vq: str | Path | None = None,
                        draft: str | Path | None = "builtin", device: str | torch.device | None = None,
                        dtype: str | torch.dtype | None = None, cuda_graphs: bool = False) -> ImagePipeline:
        """`"builtin:fashion-mnist"` (the shipped Fashion-MNIST GPT, tokenizer and drafter;
        `"builtin:fashion-mnist-sjd2"`: with the GPT fine-tuned for SJD2 as the target), a directory
        holding `gpt.*` and `vq.*` (and optionally `draft.*`) checkpoints, or a GPT checkpoint file
        (an official `c2i_*.pt` too) with `vq=` its tokenizer (`vq_ds16_c2i.pt`). `draft` is a drafter
        checkpoint, "builtin" (the directory's or built-in one, if any) or None. `device`: cpu (default),
        cuda, cuda:N or auto; `dtype`: the GPTs' parameter dtype (default: the checkpoint's);
        `cuda_graphs`: replay the fixed-shape decode steps as CUDA graphs (a GPU only)."""
        device = resolve_device(device)
        dtype = resolve_dtype(dtype, device)
        use_cuda_graphs(cuda_graphs, device)
        name = str(name_or_path)
        builtins = {b: {"gpt": BUILTIN_FILES[g], "vq": BUILTIN_FILES["vq"], "draft": BUILTIN_FILES["draft"]}
                    for b, g in ((BUILTIN, "gpt"), (BUILTIN_SJD2, "gpt_sjd2"))}
        paths, builtin = locate_checkpoints(name, builtins, {"gpt": "gpt", "vq": "vq", "draft": "draft"},
                                            what="image model", tokenizer=vq, tokenizer_arg="vq",
                                            tokenizer_example=" (e.g. vq_ds16_c2i.pt)")
        gpt_path, vq_path, draft_path = paths["gpt"], paths["vq"], paths["draft"]
        names = FASHION_CLASSES if builtin else None
        if draft not in (None, "builtin"):
            draft_path = Path(draft)
        elif draft is None:
            draft_path = None
        if name == BUILTIN_SJD2 and dtype is None:
            dtype = torch.float32                                 # shipped in fp16, run as the benchmarks ran it
        model = load_gpt(gpt_path, dtype=dtype)
        tokenizer = load_vq(vq_path)
        drafter = load_gpt(draft_path, dtype=dtype) if draft_path is not None and Path(draft_path).exists() else None
        if draft not in (None, "builtin") and drafter is None:
            raise ModelNotFoundError(f"drafter checkpoint {draft_path} not found")
        use_cuda_graphs(cuda_graphs, device, model, drafter)
        return cls(model.to(device), tokenizer.to(device), None if drafter is None else drafter.to(device), names)

    def fingerprint(self) -> str:
        """A digest of the target, tokenizer and drafter weights (cache keys of derived results)."""
        return weights_fingerprint(self.model, self.vq, self.draft)

    # ---- inputs -------------------------------------------------------------------------------

    def labels(self, class_labels: Any) -> list[int]:
        """Class indices (or class names) -> a checked list of ints in [0, num_classes)."""
        return check_labels(class_labels, self.model.num_classes, self.class_names)

    def resources(self, cfg_scale: float) -> tuple[Resources, bool]:
        """(what methods may use, guided?) for one CFG scale: target and drafter CFG-wrapped when guided."""
        check(isinstance(cfg_scale, (int, float)) and not isinstance(cfg_scale, bool) and cfg_scale >= 0,
              f"cfg_scale must be a number >= 0, got {cfg_scale!r}")
        guided = cfg_scale != 1.0
        if guided and not self.model.config.has_null_class:
            raise InputError("this model was trained without label dropout, so it has no null class: use cfg_scale=1")
        wrap = (lambda m: CFG(m, cfg_scale)) if guided else (lambda m: m)
        draft = None
        if self.draft is not None:
            draft = wrap(self.draft) if guided and self.draft.config.has_null_class else self.draft
        extras = {"embeddings": self.model.tok_embeddings.weight, "embedding_scale": embedding_scale(self.model),
                  "row_stride": self.grid}          # Jacobi init "above": the token one image row up
        return Resources(model=wrap(self.model), draft=draft, latents=self.vq.codebook, extras=extras), guided

    # ---- generation ---------------------------------------------------------------------------

    @staticmethod
    def methods() -> dict[str, MethodPlugin]:
        """The methods `generate` runs: name -> plug-in (`mmaccel methods --pipeline image`)."""
        return IMAGE_REGISTRY

    def generate(self, class_labels: Any, method: str | Method = "ar", *, cfg_scale: float = 2.0,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                 **params: Any) -> ImageOutput:
        """One image per class label, decoded with `method` (a name from `methods()` or a Method) and its `params`.

        Guidance is LlamaGen's logits = u + cfg_scale * (c - u) (1 = no guidance); temperature 0 is greedy.
        """
        labels = self.labels(class_labels)
        gen = self._run(labels, method, cfg_scale, Sampling(temperature=temperature, top_k=top_k, top_p=top_p), seed,
                        params)
        tokens = torch.tensor(gen.tokens, dtype=torch.long).reshape(len(labels), self.grid, self.grid)
        passes = None if gen.commit_pass is None else torch.tensor(gen.commit_pass).reshape(tokens.shape)
        return ImageOutput(self.decode(tokens), tokens, labels, gen.stats, passes)

    def generate_joined(self, class_labels: Any, feed: RowFeed, method: str | Method = "ar", *, cfg_scale: float = 2.0,
                        temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                        **params: Any) -> DecodeStats:
        """`generate` as a call whose rows take waiting requests as they end (continuous batching): each row's
        image tokens go to `feed.finished` as the row ends (`image_of` draws them), and `feed.next` gives the
        joining classes (`joiner`). A method joins where its state is per row (`Method.joins`: ar, speculative,
        early-exit, ...); the noise is drawn afresh every step (never coupled)."""
        labels = self.labels(class_labels)
        gen = self._run(labels, method, cfg_scale, Sampling(temperature=temperature, top_k=top_k, top_p=top_p), seed,
                        params, feed)
        return gen.stats

    def joiner(self, label: int, cfg_scale: float = 2.0) -> Joiner:
        """A request for one image of class `label` that joins a call (`generate_joined`) of this `cfg_scale`."""
        label = self.labels([label])[0]
        return Joiner([], self.grid * self.grid, (label, self.model.num_classes) if cfg_scale != 1.0 else label)

    def image_of(self, tokens: list[int]):
        """The PIL image of one row's image tokens (a finished row of `generate_joined`)."""
        check(len(tokens) == self.grid * self.grid, f"an image takes {self.grid * self.grid} tokens, got {len(tokens)}")
        return self.decode(torch.tensor(tokens, dtype=torch.long).reshape(1, self.grid, self.grid))[0]

    def _run(self, labels: list[int], method: str | Method, cfg_scale: float, sampling: Sampling, seed: int,
             params: dict[str, Any], feed: RowFeed | None = None):
        built = build_image_method(method, **params)
        resources, guided = self.resources(cfg_scale)
        inputs = (labels, [self.model.num_classes] * len(labels)) if guided else labels
        return built.run(resources, inputs, max_new_tokens=self.grid * self.grid, sampling=sampling, seed=seed,
                         prompt_tokens=None if feed is None else [[] for _ in labels], feed=feed)

    @torch.inference_mode()
    def decode_pixels(self, tokens: Tensor) -> Tensor:
        """Code grids [B, h, w] -> images [B, 3, H, W] in [-1, 1]."""
        return self.vq.decode(tokens.to(self.vq.codebook.device)).clamp(-1, 1)

    def decode(self, tokens: Tensor) -> list:
        """Code grids [B, h, w] -> PIL images (`to_pil`)."""
        return to_pil(self.decode_pixels(tokens))


def check_labels(class_labels: Any, num_classes: int, class_names: Sequence[str] | None = None) -> list[int]:
    """Class indices (or class names) -> a checked list of ints in [0, num_classes)."""
    C = num_classes
    if isinstance(class_labels, (numbers.Integral, str)):
        class_labels = [class_labels]
    if isinstance(class_labels, Tensor):
        check(class_labels.dim() <= 1 and not class_labels.is_floating_point(), "class_labels must be a 1-D integer tensor")
        class_labels = class_labels.reshape(-1).tolist()
    check(isinstance(class_labels, (list, tuple, range)), f"class_labels must be a list of class indices, "
          f"got {type(class_labels).__name__}")
    check(len(class_labels) > 0, "class_labels is empty: pass at least one class index")
    out = []
    for label in class_labels:
        if isinstance(label, str):
            if class_names is None or label not in class_names:
                known = f"; known names: {', '.join(class_names)}" if class_names else ""
                raise InputError(f"unknown class label {label!r}{known}")
            label = class_names.index(label)
        if isinstance(label, bool) or not isinstance(label, numbers.Integral):
            raise InputError(f"unknown class label {label!r}: labels are class indices in [0, {C})")
        check(0 <= label < C, f"class label {label} out of range: this model has classes 0..{C - 1}")
        out.append(int(label))
    return out


def to_pil(pixels: Tensor) -> list:
    """Images [B, 3, H, W] in [-1, 1] -> PIL images: grey ("L") when the channels agree within 3/255 (a
    tokenizer trained on grey data), else RGB."""
    from PIL import Image

    x = ((pixels + 1) * 127.5).round().cpu()
    if x.shape[1] == 1 or float((x.amax(1) - x.amin(1)).max()) <= 3:
        return [Image.fromarray(img.mean(0).round().to(torch.uint8).numpy(), mode="L") for img in x]
    x = x.to(torch.uint8)
    return [Image.fromarray(img.permute(1, 2, 0).numpy(), mode="RGB") for img in x]
