"""CTranslate2 WhisperSpec variables -> a Hugging Face `WhisperForConditionalGeneration`.

The mapping only splits and renames tensors (CTranslate2's converter only fuses and renames them):
fused self-attention QKV -> q/k/v_proj, fused cross-attention KV -> k/v_proj, the all-zero key bias is
dropped (HF's k_proj has no bias), proj_out is tied to the token embedding.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np
import torch

from mmaccel.errors import InputError, check
from mmaccel.speech.whisper_vocab import WhisperTokens

GELU = 3  # CTranslate2 ActivationType.GELU (exact erf GELU, as in Whisper)


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
