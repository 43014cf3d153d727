"""Scripts that train the tiny image models shipped under `mmaccel/assets/`."""
