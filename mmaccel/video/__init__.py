"""Video: frames in from files, arrays or live sources, decoded through the shared core."""
