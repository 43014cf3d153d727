"""Whisfusion: a masked-diffusion text decoder on a frozen Whisper encoder."""
