"""A uvicorn server on 127.0.0.1 in a daemon thread: the runner of every test server (fake vLLM, router stubs).

The socket is bound before the thread starts, so `url` is known at construction and no port can be
taken by someone else between choosing it and serving on it.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


class ServerThread:
    """Serve `app` on a free port of 127.0.0.1 from `start()` until `stop()`; keyword options go to uvicorn."""

    def __init__(self, app, name: str = "test-server", **options) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        options.setdefault("log_level", "error")
        self.server = uvicorn.Server(uvicorn.Config(app, access_log=False, **options))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._socket]},
                                       name=f"{name}-{self.url}", daemon=True)

    def start(self, timeout_s: float = 20.0) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"server at {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(10)
        self._socket.close()
        if self.thread.is_alive():
            raise RuntimeError(f"server at {self.url} did not stop")
