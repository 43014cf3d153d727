"""Image generators in their official checkpoint layouts, as mmaccel DecoderModels."""

from mmaccel.image.models.gpt import GPT_PRESETS, EarlyExitGPT, GPTConfig, LlamaGenGPT, gpt_config, load_gpt

__all__ = ["GPT_PRESETS", "EarlyExitGPT", "GPTConfig", "LlamaGenGPT", "gpt_config", "load_gpt"]
