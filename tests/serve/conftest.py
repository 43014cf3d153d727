"""What the server tests share: a pipeline whose calls can be held (so requests queue behind a call, with no
timing), waits on other threads that fail rather than hang, and a loopback uvicorn for the official client."""

import socket
import threading
import time
from contextlib import contextmanager

WAIT_S = 120


class Gated:
    """A pipeline recording how many inputs each call of `method` decodes; while `hold` is clear a call waits."""

    def __init__(self, pipeline, method: str):
        self.pipeline, self.method, self.batches, self.hold = pipeline, method, [], threading.Event()
        self.hold.set()

    def __getattr__(self, name):
        attr = getattr(self.pipeline, name)
        if name != self.method:
            return attr

        def held(inputs, *args, **kwargs):
            self.batches.append(len(inputs))
            assert self.hold.wait(WAIT_S)
            return attr(inputs, *args, **kwargs)

        return held


def until(condition) -> None:
    """Wait for `condition()` (another thread's progress), failing rather than hanging after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the server"
        time.sleep(0.01)


@contextmanager
def served(app):
    """`app` under uvicorn on a free loopback port: yields its base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    until(lambda: server.started)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(WAIT_S)
