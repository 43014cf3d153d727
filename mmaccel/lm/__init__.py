"""Real small language models for the core benchmark (SmolLM2-135M-Instruct and its distilled draft)."""

from mmaccel.lm.smollm2 import (
    load_hf_causal_lm,
    load_smollm2,
    load_smollm2_draft,
    render_prompt,
)

__all__ = ["load_hf_causal_lm", "load_smollm2", "load_smollm2_draft", "render_prompt"]
