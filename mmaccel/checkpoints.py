"""Checkpoint files: one reader, one container unwrapper, one strict layout check, one writer.

Every loader of an official layout (LlamaGen VQ and GPT, VAR, Whisper, ...) goes through the first
three, so a missing file, a corrupt file and a wrong layout give the same kind of one-line error
everywhere. `write_state_dict` and `read_configured` are the two sides of our own saves: whatever
container the suffix picks, the loader gets back the exact config, or the writer refuses the file.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mmaccel.errors import InputError, MMAccelError, ModelNotFoundError

CONTAINER_KEYS = ("model", "module", "state_dict")   # DDP, DeepSpeed, generic trainers
PREFIXES = ("module.", "_orig_mod.")                  # DDP wrapper, torch.compile wrapper


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return (lines[0] if lines else type(err).__name__)[:200]


def read_checkpoint(path: str | os.PathLike, what: str) -> tuple[Mapping, dict[str, str]]:
    """(checkpoint object, safetensors metadata) from a `.safetensors` or torch `.pt/.pth/.bin` file.

    Torch files are read with `weights_only=True`; official trainers also store their
    `argparse.Namespace` (LlamaGen's "args"), which is the one extra class allowed.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelNotFoundError(f"{what} not found: {path} (nothing is downloaded; pass the path of a local file)")
    if path.suffix == ".safetensors":
        from safetensors import safe_open
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                return {key: f.get_tensor(key) for key in f.keys()}, dict(f.metadata() or {})
        except Exception as err:  # safetensors raises its own error types for bad headers
            raise InputError(f"{path} is not a readable safetensors file: {_first_line(err)}") from None
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # any unreadable file is one user-facing error
        raise InputError(f"cannot read {path} as a {what} ({type(err).__name__}: {_first_line(err)})") from None
    if not isinstance(obj, Mapping):
        raise InputError(f"{path} holds a {type(obj).__name__}, not a checkpoint dict or state dict")
    return obj, {}


def unwrap_state_dict(obj: Mapping, source: str, drop: Sequence[str] = ()) -> dict[str, Tensor]:
    """The tensors inside an official container (`model`, `module`, `state_dict`, or top level), with a
    whole-dict `module.`/`_orig_mod.` prefix removed and derived entries (names or suffixes in `drop`) dropped."""
    for key in CONTAINER_KEYS:
        if isinstance(obj.get(key), Mapping):
            obj = obj[key]
            break
    bad = [k for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, Tensor)]
    if bad or not obj:
        raise InputError(f"{source} is not a state dict: expected tensors under one of {CONTAINER_KEYS} or at the top "
                         f"level, found keys {sorted(map(str, obj))[:5]}")
    state = dict(obj)
    for prefix in PREFIXES:
        if all(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items()}
    return {k: v for k, v in state.items() if not any(k == d or k.endswith(d) for d in drop)}


def check_layout(expected: Mapping[str, Tensor], state: Mapping[str, Tensor], source: str, layout: str) -> None:
    """Raise `InputError` naming the first missing / unexpected keys or wrong shapes of `state`."""
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        parts = ([f"{len(missing)} missing key(s), first: {', '.join(missing[:3])}"] if missing else []) + \
                ([f"{len(unexpected)} unexpected key(s), first: {', '.join(unexpected[:3])}"] if unexpected else [])
        raise InputError(f"{source} does not match the {layout} layout ({'; '.join(parts)}); check the model size/config")
    wrong = [f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in expected.items()
             if tuple(state[k].shape) != tuple(v.shape)]
    if wrong:
        raise InputError(f"{source} has {len(wrong)} tensor(s) of the wrong shape for the {layout} layout, first: "
                         f"{'; '.join(wrong[:3])}; pass the matching config")


def read_configured(source: str | os.PathLike | Mapping, config_key: str, what: str,
                    drop: Sequence[str] = ()) -> tuple[dict[str, Tensor], dict | None, str]:
    """(state dict, the config `write_state_dict` stored or None, a name for errors) of a checkpoint path or
    an in-memory state dict. The config is read from `config_key` in a safetensors header or from "config"
    next to "model" in a torch container; `drop` as in `unwrap_state_dict`."""
    if isinstance(source, Mapping):
        name, obj, meta = "the given state dict", source, {}
    else:
        name = os.fspath(source)
        obj, meta = read_checkpoint(source, what)
    stored = json.loads(meta[config_key]) if config_key in meta else obj.get("config")
    return unwrap_state_dict(obj, name, drop), dict(stored) if isinstance(stored, Mapping) else None, name


def _unrecoverable(state: Mapping[str, Tensor], config: Mapping, infer: Callable[[Mapping[str, Tensor]], Any]) -> str:
    """Why `infer(state)` does not give back `config` ("" when it does): the fields it gets wrong, or its error."""
    try:
        inferred = asdict(infer(state))
    except MMAccelError as err:
        return f"its config cannot be recovered from the tensors (loading would fail: {_first_line(err)})"
    wrong = [k for k, v in config.items() if inferred.get(k) != v]
    if not wrong:
        return ""
    return (f"{', '.join(f'{k}={config[k]!r}' for k in wrong)} cannot be recovered from the tensors (they read as "
            f"{', '.join(f'{k}={inferred.get(k)!r}' for k in wrong)})")


def write_state_dict(module: torch.nn.Module, path: str | os.PathLike, config_key: str, config: Mapping,
                     dtype: torch.dtype | None = None, *, infer: Callable[[Mapping[str, Tensor]], Any] | None = None,
                     metadata: Mapping[str, str] | None = None) -> Path:
    """Write `module`'s state dict (floating tensors cast to `dtype` when given) so that `read_configured`
    gives back `config`. Returns the path. The container follows the suffix:

    - `.safetensors`: `config` as JSON under `config_key` in the header, next to any `metadata` strings;
    - any other suffix with `infer` (the loader's config inference from tensor shapes): a bare torch state
      dict, the official VAR `.pth` layout. It carries no config, so it is written only when `infer` of the
      tensors gives back `config` exactly; otherwise an `InputError` names the fields it would lose;
    - any other suffix without `infer`: `{"model": state_dict, "config": config}`, LlamaGen's official
      container (its loaders read "model") with the config next to the weights."""
    path = Path(path)
    state = {k: v.detach().to(dtype if dtype is not None and v.is_floating_point() else v.dtype).contiguous()
             for k, v in module.state_dict().items()}
    config = dict(config)
    if path.suffix != ".safetensors" and infer is not None:
        lost = _unrecoverable(state, config, infer)
        if lost:
            raise InputError(f"cannot write {path} as a bare state dict, which carries no config: {lost}; "
                             "save as .safetensors, which stores the config")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file
        save_file(state, str(path), metadata={**(metadata or {}), config_key: json.dumps(config)})
    elif infer is not None:
        torch.save(state, path)
    else:
        torch.save({"model": state, "config": config}, path)
    return path
