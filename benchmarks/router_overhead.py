"""A router's capacity: `cadencerl router` and the real `vllm-router`, side by side, on one fast stub.

The stub (benchmarks/fast_stub.py, raw uvloop + httptools) answers at once, so what is measured is
the routers' HTTP and decision work. Closed loop, driven by `wrk` (else an httpx client): for each
row (non-streaming or streaming `--stream-tokens` events, at each of `--connections`), every target
is measured in turn, `--rounds` times (medians), after a warm-up. Each row gives requests/s, p50,
p99, the router's CPU ms per request (user + system of its process tree, from /proc, over the
measured run), from `--probe-from` connections on the latency of requests on new connections, and
each figure's ratio to vllm-router's. `--servers N` gives every router N upstream servers (the one
stub on N ports), as a fleet would: what a decision costs with the fleet's size. Needs
`vllm-router==0.1.17` on PATH (the `bench` extra).

    .venv/bin/python benchmarks/router_overhead.py [--connections 1,64,256] [--rounds 3] [--processes 1,2]
        [--data-paths rust,python] [--servers N] [--extra 'NAME=COMMAND with {python} {port} {workers}']
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
BODY = {"model": "tiny", "prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 16, "stream": True}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A child process in its own process group, stopped (TERM, then KILL) on exit. It stays in the
    caller's session: under per-session scheduling (autogroup) a session of its own made it an equal
    of everything else on the machine, and a woken thread of it could wait seconds on the run queue
    (docs/internals.md, devpool)."""

    def __init__(self, args: list[str], log: Path, env: dict | None = None, tree: Path = ROOT) -> None:
        self.log = log.open("w")
        self.p = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, process_group=0,
                                  cwd=tree, env={**os.environ, "PYTHONPATH": str(tree), **(env or {})})

    def wait_http(self, url: str, timeout_s: float = 60.0, processes: int = 1) -> None:
        """Until `url` answers (a router of several processes: until all of them accept)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"{self.p.args[0]} exited; see {self.log.name}")
            try:
                r = httpx.get(url, timeout=2)
                if r.status_code < 500 and (processes == 1 or r.json().get("processes_up") == processes):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{url} did not answer in {timeout_s}s; see {self.log.name}")

    def stop(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(5)
        self.log.close()

    def __enter__(self) -> "Proc":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def vllm_router_binary() -> str | None:
    return shutil.which("vllm-router") or next(
        (str(p) for p in [Path(sys.executable).parent / "vllm-router"] if p.exists()), None)


def cadencerl_router(workers: list[str], port: int, policy: str, log: Path, *extra: str, tree: Path = ROOT) -> Proc:
    return Proc([sys.executable, "-m", "cadencerl.cli", "router", "--workers", ",".join(workers),
                 "--policy", policy, "--port", str(port), *extra], log, tree=tree)


def vllm_router(workers: list[str], port: int, log: Path, *extra: str) -> Proc:
    return Proc([vllm_router_binary(), "--worker-urls", *workers, "--port", str(port), "--host", "127.0.0.1",
                 "--prometheus-port", str(free_port()), "--log-level", "warning", *extra], log)


async def _closed_loop(url: str, concurrency: int, seconds: float, warmup: float, body: dict) -> dict:
    clients = [httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=25))
               for _ in range(-(-concurrency // 25))]
    latencies: list[float] = []
    errors = 0
    start = time.monotonic()
    measure_from, stop_at = start + warmup, start + warmup + seconds

    async def worker(c: httpx.AsyncClient) -> None:
        nonlocal errors
        while (t0 := time.monotonic()) < stop_at:
            try:
                async with c.stream("POST", "/v1/completions", json=body) as r:
                    async for _ in r.aiter_raw():
                        pass
                    ok = r.status_code == 200
            except httpx.HTTPError:
                ok = False
            if t0 >= measure_from:
                if ok:
                    latencies.append(time.monotonic() - t0)
                else:
                    errors += 1

    await asyncio.gather(*(worker(clients[i // 25]) for i in range(concurrency)))
    await asyncio.gather(*(c.aclose() for c in clients))
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3 if latencies else None
    return {"requests_per_s": round(len(latencies) / seconds, 1), "p50_ms": pick(0.5), "p99_ms": pick(0.99),
            "errors": errors}


WRK_SCRIPT = """wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
"""
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}


def _cpu_s(pid: int) -> float | None:
    """The CPU seconds so far (user + system) of the process and its children (a router's
    data-path processes), or None where /proc cannot tell."""
    stats = {}
    for path in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = path.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        stats[int(path.parent.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    if pid not in stats:
        return None
    tree, ticks = {pid}, 0
    for child, (parent, _) in sorted(stats.items()):
        if parent in tree:
            tree.add(child)
    ticks = sum(stats[p][1] for p in tree)
    return ticks / os.sysconf("SC_CLK_TCK")


def _wrk(url: str, connections: int, seconds: float, script: Path) -> dict:
    cmd = ["wrk", f"-t{min(2, connections)}", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency",
           "--timeout", "30s", "-s", str(script), f"{url}/v1/completions"]
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60).stdout
    row: dict = {"errors": 0}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in ("50%", "99%"):
            value = float(parts[1].rstrip("usm"))
            unit = parts[1][len(parts[1].rstrip("usm")):]
            row[f"p{parts[0][:-1]}_ms"] = value * _UNITS[unit]
        elif len(parts) > 2 and parts[1:3] == ["requests", "in"]:
            row["requests"] = int(parts[0])
        elif line.startswith("Requests/sec:"):
            row["requests_per_s"] = float(parts[1])
        elif "Non-2xx" in line or "Socket errors" in line:
            row["errors"] += sum(int(x.strip(",")) for x in parts if x.strip(",").isdigit())
    return row


class NewConnections(threading.Thread):
    """While wrk keeps its connections busy: a request on a fresh connection every `seconds / 40`,
    timed from connect to the reply's last byte (Connection: close), as a client that just came sees it."""

    def __init__(self, url: str, body: dict, seconds: float) -> None:
        super().__init__(daemon=True)
        host, port = url.removeprefix("http://").split(":")
        payload = json.dumps(body).encode()
        self.addr, self.seconds, self.times, self.failed = (host, int(port)), seconds, [], 0
        self.request = (b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (host.encode(), len(payload), payload))
        self.start()

    def run(self) -> None:
        end = time.monotonic() + self.seconds
        time.sleep(self.seconds / 20)           # wrk's connections first
        while time.monotonic() < end - 0.5:
            t0 = time.monotonic()
            try:
                with socket.create_connection(self.addr, timeout=30) as sock:
                    sock.sendall(self.request)
                    reply = b""
                    while chunk := sock.recv(65536):
                        reply += chunk
                ok = reply.startswith(b"HTTP/1.1 200")
            except OSError:
                ok = False
            if ok:
                self.times.append(time.monotonic() - t0)
            else:
                self.failed += 1
            time.sleep(max(0.0, self.seconds / 40 - (time.monotonic() - t0)))

    def result(self) -> dict:
        self.join()
        times = sorted(self.times)
        pick = lambda q: round(times[min(len(times) - 1, int(q * len(times)))] * 1e3, 2) if times else None
        return {"new_connection_p50_ms": pick(0.5), "new_connection_p99_ms": pick(0.99),
                "new_connection_max_ms": pick(1.0), "new_connection_failed": self.failed}


def measure(url: str, args, connections: int, stream: bool, pid: int | None = None) -> dict:
    """One closed-loop run; with `pid` (the router's), its CPU ms per request served in the run."""
    body = {**BODY, "stream": stream, "max_tokens": args.stream_tokens if stream else 16}
    if shutil.which("wrk") is None:
        return asyncio.run(_closed_loop(url, connections, args.seconds, args.warmup, body))
    script = args.logs / "post.lua"
    script.write_text(WRK_SCRIPT % json.dumps(body))
    _wrk(url, connections, args.warmup, script)
    probe = NewConnections(url, body, args.seconds) if connections >= args.probe_from else None
    before = None if pid is None else _cpu_s(pid)
    row = _wrk(url, connections, args.seconds, script)
    after = None if pid is None else _cpu_s(pid)
    if probe is not None:
        row.update(probe.result())
    served = row.pop("requests", 0)
    if before is not None and after is not None and served:
        row["router_cpu_ms_per_request"] = round((after - before) * 1e3 / served, 3)
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}


def ratios(rows: dict[str, dict], reference: str) -> dict[str, dict]:
    """Each target's figures over the reference's (vllm-router's), where both have them."""
    ref = rows.get(reference) or {}
    out = {}
    for name, row in rows.items():
        if name in (reference, "direct"):
            continue
        out[name] = {q: round(row[q] / ref[q], 3) for q in ("requests_per_s", "p50_ms", "p99_ms",
                                                              "router_cpu_ms_per_request", "new_connection_p99_ms")
                     if row.get(q) and ref.get(q)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", default="1,64,256", help="closed-loop connections of each row, comma-separated")
    ap.add_argument("--modes", default="plain,stream", help="plain (one JSON body) and/or stream (SSE)")
    ap.add_argument("--stream-tokens", type=int, default=64, help="events a streamed reply carries")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=1, help="every target measured once a round, in turn")
    ap.add_argument("--logs", type=Path, default=Path("/tmp/router_overhead"))
    ap.add_argument("--policies", default="misa+cache-aware,cache-aware",
                    help="the cadencerl router policies to measure, comma-separated")
    ap.add_argument("--probe-from", type=int, default=256,
                    help="at this many connections and more, also time requests on new connections")
    ap.add_argument("--processes", default="1",
                    help="the cadencerl router's --processes, comma-separated: each policy measured at each")
    ap.add_argument("--data-paths", default=None,
                    help="the cadencerl router's --data-path, comma-separated (rust, python): each policy on each "
                         "(default: the one `cadencerl router` takes here, rust where it is built)")
    ap.add_argument("--compare-tree", type=Path, action="append", default=[],
                    help="also the router of this source tree (e.g. an earlier commit's `git archive`), same policies")
    ap.add_argument("--servers", type=int, default=1,
                    help="upstream servers each router is given (one stub process listening on as many ports)")
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=COMMAND",
                    help="also this router, started by COMMAND with {python}, {port} and {workers} filled in "
                         "(another router, or another build of this one)")
    args = ap.parse_args()
    if args.data_paths is None:
        from cadencerl.router.settings import rust_data_path_built
        args.data_paths = "rust" if rust_data_path_built() else "python"
    if args.servers < 1:
        ap.error("--servers: at least 1")
    args.logs.mkdir(parents=True, exist_ok=True)
    stub_ports: list[int] = []
    while len(stub_ports) < args.servers:
        if (port := free_port()) not in stub_ports:
            stub_ports.append(port)
    stub = f"http://127.0.0.1:{stub_ports[0]}"
    servers = [f"http://127.0.0.1:{port}" for port in stub_ports]
    result: dict = {"seconds": args.seconds, "stream_tokens": args.stream_tokens, "rounds": args.rounds,
                    "servers": args.servers,
                    "loadavg": Path("/proc/loadavg").read_text().split()[:3], "rows": {}}
    with contextlib.ExitStack() as stack:
        ports = [arg for port in stub_ports for arg in ("--port", str(port))]
        stub_proc = stack.enter_context(Proc([sys.executable, "benchmarks/fast_stub.py", *ports],
                                             args.logs / "stub.log"))
        for url in servers:
            stub_proc.wait_http(f"{url}/health")
        targets: dict[str, tuple[str, int | None]] = {"direct": (stub, None)}
        for tree in [ROOT, *args.compare_tree]:
            at = "" if tree == ROOT else f" @{tree}"
            for policy, n, path in ((p, int(n), d) for p in args.policies.split(",")
                                    for n in args.processes.split(",") for d in args.data_paths.split(",")):
                if n > 1 and path != "python":
                    continue        # the Rust data path serves the port alone
                port = free_port()
                extra = (("--processes", str(n)) if n > 1 else ()) + ("--data-path", path)
                log = args.logs / f"cadencerl-{policy}{n}{path}{len(at)}.log"
                r = stack.enter_context(cadencerl_router(servers, port, policy, log,
                                                         *extra, tree=tree.resolve()))
                r.wait_http(f"http://127.0.0.1:{port}/health", processes=n)
                name = (f"cadencerl router ({policy}{f', {n} processes' if n > 1 else ''}"
                        f", data path in {path.capitalize()}){at}")
                targets[name] = (f"http://127.0.0.1:{port}", r.p.pid)
        for extra in args.extra:
            name, _, template = extra.partition("=")
            port = free_port()
            cmd = shlex.split(template.format(python=sys.executable, port=port, workers=",".join(servers)))
            r = stack.enter_context(Proc(cmd, args.logs / f"extra-{len(targets)}.log"))
            r.wait_http(f"http://127.0.0.1:{port}/health")
            targets[name] = (f"http://127.0.0.1:{port}", r.p.pid)
        reference = "vllm-router (cache_aware)"
        if vllm_router_binary() is None:
            result["vllm-router"] = "not installed (pip install vllm-router==0.1.17)"
        else:
            port = free_port()
            r = stack.enter_context(vllm_router(servers, port, args.logs / "vllm-router.log", "--policy", "cache_aware"))
            r.wait_http(f"http://127.0.0.1:{port}/health")
            targets[reference] = (f"http://127.0.0.1:{port}", r.p.pid)
        for mode in args.modes.split(","):
            for connections in (int(c) for c in args.connections.split(",")):
                runs: dict[str, list[dict]] = {name: [] for name in targets}
                for _ in range(args.rounds):
                    for name, (url, pid) in targets.items():
                        runs[name].append(measure(url, args, connections, mode == "stream", pid))
                rows = {name: _median(r) for name, r in runs.items()}
                result["rows"][f"{mode} c{connections}"] = {**rows, "ratio_to_vllm_router": ratios(rows, reference)}
                print(f"{mode} c{connections}: " + ", ".join(f"{n} {r.get('requests_per_s')}" for n, r in rows.items()),
                      file=sys.stderr)
    print(json.dumps(result, indent=2))


def _median(runs: list[dict]) -> dict:
    """Each figure's median over the rounds (errors: their sum)."""
    out = {}
    for key in {k for r in runs for k in r}:
        values = sorted(r[key] for r in runs if r.get(key) is not None)
        out[key] = sum(values) if key == "errors" else (values[len(values) // 2] if values else None)
    return out


if __name__ == "__main__":
    main()
