"""The streaming VLM families: which adapter runs a Hugging Face model, how its chat turns read, and
loading one from a local directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from mmaccel.errors import InputError, check
from mmaccel.video.qwen_vl import QwenVLStream
from mmaccel.video.smolvlm import SmolVLMStream, image_marks
from mmaccel.video.stream_decoder import StreamDecoder

ADAPTERS = {"qwen2_vl": QwenVLStream, "qwen2_5_vl": QwenVLStream, "smolvlm": SmolVLMStream, "idefics3": SmolVLMStream}


@dataclass(frozen=True)
class ChatTurns:
    """A family's chat template as a stream needs it: a question closes the user turn the frames were in
    with `end` (which also ends an answer) and opens the assistant's turn with `assistant`; `user`
    opens the next user turn."""

    end: str
    assistant: str
    user: str


QWEN_TURNS = ChatTurns("<|im_end|>", "\n<|im_start|>assistant\n", "\n<|im_start|>user\n")
SMOLVLM_TURNS = ChatTurns("<end_of_utterance>", "\nAssistant:", "\nUser:")     # "User:<image>…<end_of_utterance>\nAssistant:"
CHAT_TURNS = {"qwen2_vl": QWEN_TURNS, "qwen2_5_vl": QWEN_TURNS, "smolvlm": SMOLVLM_TURNS, "idefics3": SMOLVLM_TURNS}


def _supported(model_type, where: str) -> str:
    check(model_type in ADAPTERS, f"{where} ({model_type}) is not a supported streaming VLM: expected model_type "
          f"one of {', '.join(ADAPTERS)}")
    return model_type


def stream_model(hf_model: nn.Module, tokenizer=None) -> StreamDecoder | QwenVLStream:
    """The streaming adapter for a Hugging Face VLM, chosen by `config.model_type`. SmolVLM / Idefics3 also
    need the checkpoint's Hugging Face `tokenizer`: their image marks are tokens, not config entries."""
    kind = _supported(getattr(getattr(hf_model, "config", None), "model_type", None), type(hf_model).__name__)
    if ADAPTERS[kind] is SmolVLMStream:
        return SmolVLMStream(hf_model, **image_marks(tokenizer))
    return QwenVLStream(hf_model)


def chat_turns(model_type: str) -> ChatTurns:
    """The chat turns of a supported family, by `config.model_type`."""
    return CHAT_TURNS[_supported(model_type, "this model")]


def load_stream_model(path, dtype: torch.dtype | None = None) -> nn.Module:
    """A local checkpoint directory (config.json + safetensors) of a supported family -> the HF model."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    path = Path(path)
    if not (path / "config.json").is_file():
        raise InputError(f"{path} is not a Hugging Face model directory (no config.json)")
    cfg = AutoConfig.from_pretrained(path, local_files_only=True)
    _supported(cfg.model_type, str(path))
    return AutoModelForImageTextToText.from_pretrained(path, dtype=dtype, local_files_only=True)
