"""Speech recognition: Whisper-style encoder-decoder ASR (real weights loaded offline) and, later,
CTC ASR, all decoded through the shared core."""
