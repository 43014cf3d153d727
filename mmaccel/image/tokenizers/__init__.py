"""Image tokenizers in the official checkpoint layouts (LlamaGen VQ-16)."""

from mmaccel.image.tokenizers.vq import VQConfig, VQModel, infer_vq_config, load_vq, save_vq

__all__ = ["VQConfig", "VQModel", "infer_vq_config", "load_vq", "save_vq"]
