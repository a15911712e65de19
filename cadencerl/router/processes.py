"""A router run as several processes (`--processes N`): the decision owner starts and stops the others.

Process 0 serves the port as a single router does and owns every decision (`owner.py`); processes
1 .. N-1 (`helper.py`) accept on the same port (SO_REUSEPORT: the kernel spreads connections) once
each is connected to the owner. A data-path process whose owner goes away stops; one that dies is
logged by the owner and its requests released.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
import tempfile

import uvicorn

from cadencerl.router.app import GeneratingRoutes
from cadencerl.router.owner import DecisionOwner

SETTINGS_ENV = "CADENCERL_ROUTER_PROCESS_SETTINGS"     # a data-path process's settings, as JSON
START_TIMEOUT_S = 60.0


class OwnerServer(uvicorn.Server):
    """uvicorn's server for process 0: the data-path processes start once it serves, stop before it does."""

    def __init__(self, config: uvicorn.Config, routes: GeneratingRoutes, port: int, private: socket.socket) -> None:
        super().__init__(config)
        self.routes, self.port, self.private = routes, port, private
        self.dir = tempfile.mkdtemp(prefix="cadencerl-router-")
        self.owner = DecisionOwner(routes, os.path.join(self.dir, "decisions.sock"))
        self.procs: list[asyncio.subprocess.Process] = []

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.should_exit:
            return
        await self.owner.start()
        settings = self.routes.state.service.settings
        env = {**os.environ, SETTINGS_ENV: settings.model_copy(update={"journal": None, "port": self.port})
               .model_dump_json()}
        owner_url = "http://127.0.0.1:%d" % self.private.getsockname()[1]
        for index in range(1, settings.processes):
            self.procs.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "cadencerl.router.helper", str(index), self.owner.path, owner_url, env=env))
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
        while self._ready() < len(self.procs) and asyncio.get_running_loop().time() < deadline:
            if any(p.returncode is not None for p in self.procs):
                break
            await asyncio.sleep(0.05)
        if self._ready() < len(self.procs):
            print("router: a data-path process did not start; see its error above", file=sys.stderr)
            self.should_exit = True

    def _ready(self) -> int:
        return sum(h.ready for h in self.owner.helpers)

    async def shutdown(self, sockets=None) -> None:
        await self._stop_helpers()
        await super().shutdown(sockets)
        shutil.rmtree(self.dir, ignore_errors=True)

    async def _stop_helpers(self) -> None:
        self.owner.closing = True
        for proc in self.procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await self.owner.stop()
