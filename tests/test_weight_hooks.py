"""The real path's weight-update hook, without a server: what an in-place update asks of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cadencerl.admission.misa import Admitted, MisaT
from cadencerl.config import ConfigError, builtin_scenario
from cadencerl.devpool.weights import WeightPusher, WeightVersions
from cadencerl.engine.backend import EngineBackend, takes_keep_kv
from cadencerl.policies.routers import CacheAware
from cadencerl.runs.real import assemble


def pusher(tmp_path: Path) -> WeightPusher:
    base = tmp_path / "base"
    base.mkdir()
    (base / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")   # an empty header
    return WeightPusher(WeightVersions(base, tmp_path / "versions"))


@pytest.mark.parametrize("keep_kv, pause", [(False, {"mode": "abort", "clear_cache": "true"}),
                                            (True, {"mode": "keep", "clear_cache": "false"})])
def test_the_pusher_pauses_as_the_update_asks(tmp_path, monkeypatch, keep_kv, pause):
    """Keeping the requests needs clear_cache=false: vLLM clears on true even with mode=keep, which
    preempts every running request."""
    push = pusher(tmp_path)
    posts = []
    monkeypatch.setattr(push, "_post", lambda url, route, **kw: posts.append((route, kw)))
    push(0, "http://127.0.0.1:9", 0, keep_kv=keep_kv)
    assert posts[0] == ("/pause", {"params": pause})
    assert [route for route, _ in posts] == ["/pause", "/collective_rpc", "/update_weight_version", "/resume"]
    push.close()


def test_the_backend_hands_keep_kv_on_only_when_asked():
    calls = []
    backend = EngineBackend(["http://127.0.0.1:9"], "tiny", object(),
                            weight_update=lambda *a, **kw: calls.append((a, kw)))
    backend.set_version(0, 1)
    backend.set_version(0, 2, keep_kv=True)
    assert calls == [((0, "http://127.0.0.1:9", 1), {}), ((0, "http://127.0.0.1:9", 2), {"keep_kv": True})]


def test_a_hook_that_cannot_keep_kv_is_refused_before_a_run_that_updates_in_place(tmp_path):
    assert takes_keep_kv(pusher(tmp_path)) and not takes_keep_kv(lambda worker, url, version: None)
    s = builtin_scenario("cpu-pair")
    router = CacheAware(version_switch="in-place")
    assert router.updates_in_place and Admitted(MisaT(s.workload.target_mix()), router).updates_in_place
    assert not CacheAware(version_switch="interrupt").updates_in_place
    with pytest.raises(ConfigError, match="weight_update: cache-aware updates its workers in place.*keep_kv"):
        assemble(s, router, ["http://127.0.0.1:9"], [], object(), weight_update=lambda worker, url, version: None)


def test_a_run_puts_a_server_an_earlier_run_left_on_another_version_back_on_the_base(tmp_path, monkeypatch):
    """Its first samples, tagged version 0, came from the earlier run's last weights."""
    push = pusher(tmp_path)
    reported = {"http://a": "default", "http://b": "3", "http://c": "0"}
    posts = []
    monkeypatch.setattr(push, "server_version", lambda url: reported[url])
    monkeypatch.setattr(push, "_post", lambda url, route, **kw: posts.append((url, route, kw)))
    push.start_at_base(list(reported))
    assert {url for url, _, _ in posts} == {"http://b"}
    assert ("http://b", "/update_weight_version", {"json": {"new_version": "0"}}) in posts
    assert push.pushes[0].worker == 1 and push.pushes[0].version == 0
    push.close()
