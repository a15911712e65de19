"""The clients' weight versions behind a router: each is a checkpoint folder a client names
(AReaL's `/areal_update_weights {"model_path"}`), pushed into a server when the controller switches
that server's worker to it, through stock vLLM's dev-mode routes (`devpool.weights.update_steps`)."""

from __future__ import annotations

import asyncio

import httpx

from cadencerl.devpool.weights import WeightPushError, push_failed, update_steps


class WeightVersions:
    def __init__(self) -> None:
        self.paths: dict[int, str] = {}              # version -> checkpoint folder (version 0: the servers' own)
        self.pushing: list[asyncio.Task] = []

    def switched(self, client: httpx.AsyncClient, url: str, version: int) -> None:
        """The engines' hook: a worker takes `version`; its server gets the weights (a task)."""
        if version in self.paths:
            self.pushing.append(asyncio.get_running_loop().create_task(
                push(client, url, self.paths[version], version)))

    async def settle(self) -> None:
        """Every push under way finished; the first failure raised (`WeightPushError`)."""
        tasks, self.pushing = self.pushing, []
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result


async def push(client: httpx.AsyncClient, url: str, path: str, version: int) -> None:
    steps = update_steps(path, version)
    try:
        for route, args in steps[:-1]:
            await _post(client, url, route, args)
    finally:
        await _post(client, url, *steps[-1])


async def _post(client: httpx.AsyncClient, url: str, route: str, args: dict) -> None:
    try:
        response = await client.post(f"{url}{route}", **args)
    except httpx.HTTPError as exc:
        raise WeightPushError(f"weights: {route} failed on {url}: {exc}") from exc
    if response.status_code != 200:
        raise push_failed(url, route, response.status_code, response.text)
