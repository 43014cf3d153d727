"""Real-time factors as the Open ASR Leaderboard defines them.

RTFx = Σ audio seconds / Σ transcription seconds, where a transcription's time starts before
feature extraction (the audio is already in memory) and ends after the text is decoded; warm-up
calls are excluded. RTF = 1 / RTFx. Higher RTFx is faster.
"""

from __future__ import annotations

from mmaccel.errors import check


def rtfx(audio_seconds: float, wall_seconds: float) -> float:
    check(audio_seconds > 0, f"audio duration must be > 0 s, got {audio_seconds}")
    check(wall_seconds > 0, f"wall time must be > 0 s, got {wall_seconds}")
    return audio_seconds / wall_seconds
