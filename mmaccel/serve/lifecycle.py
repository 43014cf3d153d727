"""Stopping without dropping requests: on SIGTERM (or SIGINT) the server answers new requests 503 while the ones in
flight finish, then uvicorn shuts down as usual (a second signal stops it at once)."""

from __future__ import annotations

import threading
import time

import uvicorn

DRAIN_POLL_S = 0.05


class GracefulServer(uvicorn.Server):
    """uvicorn's server over an app of `create_app`: the first exit signal starts draining (`Server.draining`), and
    the exit itself follows once no request is in flight, or after `drain_timeout_s`."""

    def __init__(self, config: uvicorn.Config, drain_timeout_s: float):
        super().__init__(config)
        self.drain_timeout_s = drain_timeout_s
        self._draining: threading.Thread | None = None

    def handle_exit(self, sig, frame) -> None:
        """uvicorn's signal handler: the first signal starts draining and exits once no request is in flight (or
        after `drain_timeout_s`); a later one, or one while uvicorn is already exiting, is uvicorn's own."""
        state = self.config.app.state.server
        if self._draining is not None or self.should_exit:
            super().handle_exit(sig, frame)
            return
        state.draining = True
        self._draining = threading.Thread(target=self._drain, args=(state, sig, frame), daemon=True)
        self._draining.start()

    def _drain(self, state, sig, frame) -> None:
        deadline = time.monotonic() + self.drain_timeout_s
        while state.in_flight > 0 and time.monotonic() < deadline:
            time.sleep(DRAIN_POLL_S)
        super().handle_exit(sig, frame)
