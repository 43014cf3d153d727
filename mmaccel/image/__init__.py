"""Autoregressive image generation: tokenizers, models, acceleration methods, pipeline."""
