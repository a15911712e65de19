"""vLLM servers launched by Ray: one actor per worker of a scenario's pool, placed by accelerator type.

Ray is what RL frameworks already use to place rollout engines: each worker gets a placement group
of its TP devices on a node advertising its accelerator type (a Ray custom resource), and its actor
owns the vLLM server as a subprocess that dies with it. Actors are named and detached, so `pool up`
and `pool down` may be separate processes. Ray is an optional extra, imported inside functions only.
Why this shape: docs/internals.md, "devpool".
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cadencerl.devpool.local_pool import LocalPool, PoolConfig, PoolError, longest_model_len, vllm_python
from cadencerl.devpool.server_env import pythonpath
from cadencerl.devpool.server_specs import ServerSpec

RESOURCE_PREFIX = "accelerator_type:"
NAMESPACE = "cadencerl"
ACTOR_PREFIX = "cadencerl-vllm-"


def accelerator_resource(accelerator: str) -> str:
    """The Ray custom resource a node advertises for each device of this accelerator type."""
    return f"{RESOURCE_PREFIX}{accelerator}"


class VLLMServerActor:
    """Runs one vLLM server on the actor's node (wrapped by `ray.remote` when the pool starts)."""

    def __init__(self, index: int, spec: ServerSpec, model_dir: str, python: str, max_model_len: int,
                 start_timeout_s: float, state_root: str | None = None, cpu_quota: bool = False) -> None:
        import ray

        self.index, self.spec = index, spec
        self.node_id = ray.get_runtime_context().get_node_id()
        self.state_dir = Path(tempfile.mkdtemp(prefix=f"cadencerl-ray-{index}-", dir=state_root))
        config = PoolConfig(num_workers=1, kv_tokens=spec.kv_tokens, max_num_seqs=spec.max_num_seqs,
                            max_model_len=min(max_model_len, longest_model_len(spec.kv_tokens)),
                            model_dir=Path(model_dir),
                            python=python, start_timeout_s=start_timeout_s, host=ray.util.get_node_ip_address(),
                            die_with_parent=True, cpu_shares=(spec.cpu_share,) if cpu_quota else None)
        self.pool = LocalPool(self.state_dir, config)

    def start(self) -> dict:
        """Start the server and wait until it is healthy; what the driver needs to reach and watch it."""
        server = self.pool.start()[0]
        return {"index": self.index, "url": server.url, "pid": server.pid, "node_id": self.node_id,
                "accelerator": self.spec.accelerator, "log": server.log_path}

    def url(self) -> str:
        return self.pool.urls[0]

    def stop(self) -> None:
        self.pool.stop()
        shutil.rmtree(self.state_dir, ignore_errors=True)


@dataclass(frozen=True)
class RayServer:
    """A server of the pool as the driver sees it."""

    index: int
    name: str
    accelerator: str
    url: str
    pid: int
    node_id: str


class RayPool:
    """`up()` starts one actor-owned server per spec and returns them; `down()` removes them all."""

    def __init__(self, specs: Sequence[ServerSpec], *, model_dir: Path, address: str | None = None,
                 python: str | None = None, max_model_len: int = 2048, cpus_per_server: float = 1.0,
                 start_timeout_s: float = 300.0, namespace: str = NAMESPACE, prefix: str = ACTOR_PREFIX,
                 state_root: Path | None = None, cpu_quotas: bool = False) -> None:
        self.specs, self.model_dir, self.address = list(specs), Path(model_dir).resolve(), address
        self.python, self.max_model_len, self.cpus = vllm_python(python), max_model_len, cpus_per_server
        self.start_timeout_s, self.namespace, self.prefix = start_timeout_s, namespace, prefix
        self.state_root = None if state_root is None else str(state_root)   # servers' logs (default: temp)
        self.cpu_quotas = cpu_quotas   # cap CPU stand-ins of slower types (ServerSpec.cpu_share; needs root)
        self.servers: list[RayServer] = []

    def up(self) -> list[RayServer]:
        """Place and start every server; on any failure remove what was started and raise PoolError."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        connect(self.address, self.namespace)
        if running := discover(self.address, self.namespace, self.prefix):     # before anything is made:
            where = self.address or "auto"                                      # a failed up removes its prefix's
            raise PoolError(f"ray: the cluster already runs this pool's servers ({', '.join(running)}); use them "
                            f"(`cadencerl run --ray {where}`) or stop them first (`cadencerl pool down --ray {where}`)")
        actor_cls = ray.remote(VLLMServerActor)
        try:
            actors, groups = [], []
            for i, spec in enumerate(self.specs):
                resource = accelerator_resource(spec.accelerator)
                group = placement_group([{"CPU": self.cpus, resource: spec.tp}], name=f"{self.prefix}{i}",
                                        lifetime="detached")
                groups.append((group, resource))
                actors.append(actor_cls.options(
                    name=f"{self.prefix}{i}", namespace=self.namespace, lifetime="detached", max_restarts=0,
                    num_cpus=self.cpus, resources={resource: spec.tp},
                    scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
                ).remote(i, spec, str(self.model_dir), self.python, self.max_model_len, self.start_timeout_s,
                         self.state_root, self.cpu_quotas))
            for group, resource in groups:
                if not group.wait(timeout_seconds=60):
                    raise PoolError(f"ray: no node offers {{CPU: {self.cpus}, {resource}}} for a placement group; "
                                    f"start nodes with `ray start --resources '{{\"{resource}\": N}}'`")
            infos = ray.get([a.start.remote() for a in actors], timeout=self.start_timeout_s + 60)
        except BaseException as exc:
            self.down()
            if isinstance(exc, PoolError):
                raise
            raise PoolError(f"ray: servers failed to start: {exc}") from exc
        self.servers = [RayServer(x["index"], f"{self.prefix}{x['index']}", x["accelerator"], x["url"], x["pid"],
                                  x["node_id"]) for x in infos]
        return list(self.servers)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def alive(self, timeout_s: float = 10.0) -> list[bool]:
        """Whether each server's actor still answers (False once its node is lost)."""
        import ray

        out = []
        for s in self.servers:
            try:
                ray.get(ray.get_actor(s.name, namespace=self.namespace).url.remote(), timeout=timeout_s)
                out.append(True)
            except Exception:  # noqa: BLE001 - any failure to answer is a lost server
                out.append(False)
        return out

    def down(self) -> list[str]:
        """Stop and remove this pool's actors and placement groups (also ones of an earlier `up`)."""
        names = down(self.address, self.namespace, self.prefix, count=len(self.specs))
        self.servers = []
        return names


def connect(address: str | None, namespace: str = NAMESPACE) -> None:
    """Join the Ray cluster at `address` (None or "auto": the running one), once per process.

    Ray workers get this checkout on their PYTHONPATH so the actor class is importable there."""
    import ray

    if ray.is_initialized():
        return
    host, _, port = (address or "").rpartition(":")
    if host and port.isdigit() and "://" not in address:   # Ray itself retries a dead GCS for ~13 minutes
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
        except (OSError, OverflowError) as exc:
            raise ConnectionError(f"no Ray cluster answers at {address} ({exc})") from None
    try:
        ray.init(address=address or "auto", namespace=namespace, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": pythonpath()}})
    except ConnectionError as exc:       # Ray's own advice names its flag (--address), not ours
        said = str(exc).split(". ")[0].rstrip(".")[:120]     # its first sentence: what it found
        raise ConnectionError(f"no Ray cluster answers at {address or 'auto'} ({said}): start one "
                              "(`ray start --head`), or give its address as --ray HOST:PORT") from None


def attach(names: Sequence[str], address: str | None = None, namespace: str = NAMESPACE,
           timeout_s: float = 30.0) -> list[str]:
    """URLs of servers owned by named Ray actors (launched here or by another framework): each
    actor must answer `url()`."""
    import ray

    connect(address, namespace)
    urls = []
    for name in names:
        try:
            actor = ray.get_actor(name, namespace=namespace)
        except ValueError:
            raise PoolError(f"ray_actors: no actor named {name!r} in the cluster's namespace {namespace!r}") from None
        urls.append(ray.get(actor.url.remote(), timeout=timeout_s))
    return urls


def discover(address: str | None = None, namespace: str = NAMESPACE, prefix: str = ACTOR_PREFIX) -> list[str]:
    """Names of this pool's server actors in the cluster, in worker order."""
    import ray

    connect(address, namespace)
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == namespace and a["name"].startswith(prefix)]
    return sorted(names, key=lambda n: int(n[len(prefix):]) if n[len(prefix):].isdigit() else 1 << 30)


def down(address: str | None = None, namespace: str = NAMESPACE, prefix: str = ACTOR_PREFIX,
         count: int = 0, timeout_s: float = 60.0) -> list[str]:
    """Stop every server actor named `prefix*` (each stops its vLLM server first), then remove the
    actors and their placement groups; returns the actor names removed."""
    import ray
    from ray.util import get_placement_group, remove_placement_group

    connect(address, namespace)
    names = discover(address, namespace, prefix)
    actors = [ray.get_actor(n, namespace=namespace) for n in names]
    for actor, ref in [(a, a.stop.remote()) for a in actors]:
        try:
            ray.get(ref, timeout=timeout_s)
        except Exception:  # noqa: BLE001 - a lost actor's server died with it
            pass
        ray.kill(actor, no_restart=True)
    indices = {int(n[len(prefix):]) for n in names if n[len(prefix):].isdigit()} | set(range(count))
    for i in sorted(indices):
        try:
            remove_placement_group(get_placement_group(f"{prefix}{i}"))
        except ValueError:
            pass                        # none by that name
    return names
