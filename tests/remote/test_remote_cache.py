"""The shared compile and kernel cache in Redis (runtime/remote_cache.py), against a real
server (see conftest.py): a second process with an empty local cache compiles nothing;
entries are authenticated (a forged or damaged one is rejected, reported once and
rebuilt); a server that is down or does not answer costs one warning, never a compile."""

from __future__ import annotations

import json
import logging
import multiprocessing
import socket
import time

import pytest

from torchloom.errors import PipelineError
from torchloom.report.explain import explain, format_explain
from torchloom.runtime.remote_cache import (RemoteSettings, remote_cache_from, sign,
                                            verify)
from torchloom.testing.redis_server import free_port

from remote_children import (KEY, entries, explain_in_new_process, explain_on_new_machine,
                             remote_warnings)

CONCURRENT = 8  # processes compiling at once, forked from one that imported torch


@pytest.mark.slow
def test_second_process_compiles_nothing_the_fleet_compiled(redis_url, workload, tmp_path):
    """Two processes, each with its own empty local cache: the second loads every graph
    and kernel from Redis (``explain --json --cached``)."""
    runs = [explain_in_new_process(redis_url, workload, tmp_path / f"process{i}")
            for i in range(2)]
    first, second = runs
    assert first["compile_cache"] == {"hits": 0, "misses": 2, "remote_hits": 0,
                                      "remote_errors": 0}
    assert first["kernel_cache"]["compiles"] > 0
    assert second["compile_cache"] == {"hits": 2, "misses": 0, "remote_hits": 2,
                                       "remote_errors": 0}
    assert second["kernel_cache"]["compiles"] == 0
    assert second["kernel_cache"]["remote_hits"] == first["kernel_cache"]["compiles"]
    assert second["max_abs_error"] is not None and second["max_abs_error"] < 1e-5
    assert second["fusion_groups"] == first["fusion_groups"] > 0
    assert any("loaded from the compile cache" in n and "no pass ran" in n
               for n in second["notes"])
    assert not any("loaded from the compile cache" in n for n in first["notes"])


def test_explain_reports_compile_cache_and_remote_hits_in_process(fleet, workload):
    fleet()
    cold = explain(workload, cached=True).data
    fleet()  # a new machine: empty local cache
    warm = explain(workload, cached=True)
    assert cold["compile_cache"]["misses"] == 2
    assert warm.data["compile_cache"] == {"hits": 2, "misses": 0, "remote_hits": 2,
                                          "remote_errors": 0}
    assert warm.compiler.kernel_cache.compiles == 0
    assert "  compile cache: 2 hits (2 from the shared cache), 0 misses\n" in \
        format_explain(warm) + "\n"
    assert warm.data["kernel_cache"]["remote_hits"] > 0
    # kept locally too: a third run on that machine needs no Redis hit
    third = explain(workload, cached=True).data
    assert third["compile_cache"]["remote_hits"] == 0
    assert third["compile_cache"]["hits"] == 2
    # without --cached the compile cache is off and reported as null
    assert explain(workload).data["compile_cache"] is None


@pytest.mark.parametrize("namespace", ["graph", "kernel"])
def test_entry_forged_without_the_key_is_rejected_once_and_rebuilt(
        fleet, workload, redis_client, caplog, namespace):
    fleet()
    explain(workload, cached=True)
    keys = entries(redis_client, namespace)
    assert keys
    for k in keys:  # an attacker rewrites each entry's text and signs with another key
        _, ns, name = k.decode().split(":")
        text = verify(KEY.encode(), ns, name, redis_client.get(k))
        evil = text.replace("aten.gelu", "aten.relu").replace("gelu", "relu")
        redis_client.set(k, sign(b"not-the-key", ns, name, evil))
    fleet()
    with caplog.at_level(logging.WARNING, logger="torchloom"):
        result = explain(workload, cached=True)
    data = result.data
    assert data["max_abs_error"] is not None and data["max_abs_error"] < 1e-5
    rejected = [w for w in remote_warnings(caplog) if "rejected" in w]
    assert len(rejected) == len(keys)  # each entry reported once
    assert all("HMAC mismatch" in w for w in rejected)
    if namespace == "graph":
        assert data["compile_cache"]["remote_errors"] == len(keys)
        assert data["compile_cache"]["remote_hits"] == 0
    else:
        assert data["kernel_cache"]["remote_errors"] == len(keys)
        assert result.compiler.kernel_cache.compiles >= len(keys)
    for k in keys:  # rebuilt: the entry is authentic again
        _, ns, name = k.decode().split(":")
        json.loads(verify(KEY.encode(), ns, name, redis_client.get(k)))


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["flipped byte", "signed garbage", "unsigned"])
def test_damaged_entry_is_reported_once_and_rebuilt(fleet, workload, redis_client, caplog,
                                                    damage):
    fleet()
    explain(workload, cached=True)
    keys = entries(redis_client, "graph")
    for k in keys:
        _, ns, name = k.decode().split(":")
        value = redis_client.get(k)
        if damage == "flipped byte":
            value = value[:-20] + bytes([value[-20] ^ 1]) + value[-19:]
        elif damage == "signed garbage":  # authentic, but not a graph entry
            value = sign(KEY.encode(), ns, name, '{"format": 1, "ir": "graph @')
        else:
            value = value.split(b"\n", 1)[1]
        redis_client.set(k, value)
    fleet()
    with caplog.at_level(logging.WARNING, logger="torchloom"):
        data = explain(workload, cached=True).data
    assert data["compile_cache"] == {"hits": 0, "misses": 2, "remote_hits": 0,
                                     "remote_errors": len(keys)}
    assert len([w for w in remote_warnings(caplog) if "rejected" in w]) == len(keys)
    assert data["max_abs_error"] is not None and data["max_abs_error"] < 1e-5
    for k in keys:
        _, ns, name = k.decode().split(":")
        verify(KEY.encode(), ns, name, redis_client.get(k))


def _unusable_server_costs_one_warning(monkeypatch, url, workload, tmp_path, caplog):
    monkeypatch.setenv("TORCHLOOM_REMOTE_CACHE", url)
    monkeypatch.setenv("TORCHLOOM_REMOTE_CACHE_KEY", KEY)
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path / "local"))
    with caplog.at_level(logging.WARNING, logger="torchloom"):
        t0 = time.monotonic()
        first = explain(workload, cached=True).data
        seconds = time.monotonic() - t0
    assert [w for w in remote_warnings(caplog) if "unusable" in w] and len(
        remote_warnings(caplog)) == 1
    assert first["compile_cache"]["remote_errors"] == 1
    assert first["max_abs_error"] is not None and first["max_abs_error"] < 1e-5
    again = explain(workload, cached=True).data  # local caching still works
    assert again["compile_cache"]["hits"] == 2
    return seconds


def test_redis_down_means_local_caching_with_one_warning(monkeypatch, workload, tmp_path,
                                                         caplog):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    _unusable_server_costs_one_warning(monkeypatch, url, workload, tmp_path, caplog)


def test_server_that_never_answers_times_out_once(monkeypatch, workload, tmp_path, caplog):
    with socket.socket() as silent:  # accepts connections (backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0?timeout=0.3"
        seconds = _unusable_server_costs_one_warning(monkeypatch, url, workload, tmp_path,
                                                     caplog)
    assert seconds < 60


def test_redis_stopped_mid_run_degrades_to_local_with_one_warning(
        private_redis, monkeypatch, tmp_path, caplog):
    import torch

    from torchloom.compiler import Compiler
    stop, url = private_redis
    monkeypatch.setenv("TORCHLOOM_REMOTE_CACHE_KEY", KEY)
    compiler = Compiler("default", cache_dir=tmp_path / "local", remote_cache=f"{url}/0")
    x = torch.randn(4, 8)
    torch._dynamo.reset()
    with caplog.at_level(logging.WARNING, logger="torchloom"):
        first = torch.compile(lambda t: torch.nn.functional.gelu(t) * 2, backend="torchloom",
                              options={"compiler": compiler})
        torch.testing.assert_close(first(x), torch.nn.functional.gelu(x) * 2)
        assert compiler.remote_cache.stats("graph")["stores"] == 1
        stop()  # the server goes away between two compiles
        for f in (lambda t: t.sin().tanh(), lambda t: t.cos() * 3):  # still compiled,
            fn = torch.compile(f, backend="torchloom", options={"compiler": compiler})
            torch.testing.assert_close(fn(x), f(x))  # and cached locally
    torch._dynamo.reset()
    assert len(remote_warnings(caplog)) == 1 and "unusable" in remote_warnings(caplog)[0]
    assert compiler.graph_cache.remote_errors == 1
    assert compiler.graph_cache.stores == 3
    assert all(c.fallback_reason is None for c in compiler.compilations)


@pytest.mark.slow
def test_processes_compiling_at_once_against_one_redis(redis_url, workload, tmp_path):
    """Eight processes with empty local caches compile the same model at the same moment
    (they wait at a barrier): each gets eager's results, no entry any of them reads is
    rejected, and none logs a warning. The workers fork from a server that imported torch
    and torchloom once (an import each would cost a 2-core machine over a minute)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torchloom.report.explain", "remote_children"])
    with ctx.Manager() as manager, ctx.Pool(CONCURRENT) as pool:
        barrier = manager.Barrier(CONCURRENT)
        jobs = [(redis_url, str(workload), str(tmp_path / f"p{i}"), barrier)
                for i in range(CONCURRENT)]
        results = pool.map_async(explain_on_new_machine, jobs, chunksize=1).get(timeout=600)
    for data in results:
        assert data["max_abs_error"] is not None and data["max_abs_error"] < 1e-5
        assert data["compile_cache"]["remote_errors"] == 0
        assert data["kernel_cache"]["remote_errors"] == 0
        assert data["warnings"] == []
        assert data["fusion_groups"] > 0
    # the same compilation everywhere, whether from Redis or compiled here
    assert len({json.dumps([d["fusion_groups"], d["kernels"], d["fallbacks"]])
                for d in results}) == 1


def test_without_a_key_the_remote_cache_is_off_and_explain_says_so(
        monkeypatch, redis_url, redis_client, workload, tmp_path):
    monkeypatch.setenv("TORCHLOOM_REMOTE_CACHE", redis_url)
    monkeypatch.delenv("TORCHLOOM_REMOTE_CACHE_KEY", raising=False)
    result = explain(workload, cached=True)
    assert result.compiler.remote_cache is None
    assert any("TORCHLOOM_REMOTE_CACHE_KEY is not set" in n for n in result.data["notes"])
    assert entries(redis_client, "*") == []  # nothing written without a key


def test_ttl_and_entry_size_limit(fleet, monkeypatch, redis_url, workload, redis_client):
    fleet()
    monkeypatch.setenv("TORCHLOOM_REMOTE_CACHE", f"{redis_url}?ttl=120")
    explain(workload, cached=True)
    keys = entries(redis_client, "*")
    assert keys and all(0 < redis_client.ttl(k) <= 120 for k in keys)
    redis_client.flushdb()
    fleet()
    monkeypatch.setenv("TORCHLOOM_REMOTE_CACHE", f"{redis_url}?max_entry_bytes=200")
    data = explain(workload, cached=True).data
    assert entries(redis_client, "*") == []  # every entry is over 200 bytes: none shared
    assert data["compile_cache"]["remote_errors"] == 0


def test_settings_and_where_the_url_comes_from(tmp_path, monkeypatch, redis_url):
    s = RemoteSettings.parse("redis://h:1/2?ttl=0&max_entry_bytes=10&timeout=0.5")
    assert (s.url, s.ttl, s.max_entry_bytes, s.timeout) == ("redis://h:1/2", 0, 10, 0.5)
    secret = RemoteSettings.parse("redis://user:hunter2@h:1/0")
    assert secret.url == "redis://user:hunter2@h:1/0"  # the client needs it
    assert "hunter2" not in secret.shown and secret.shown == "redis://user:***@h:1/0"
    _, note = remote_cache_from("redis://:hunter2@h:1/0", {})  # messages never show it
    assert "hunter2" not in note and "redis://:***@h:1/0" in note
    for bad in ("http://h/0", "redis://h:1/0?ttl=x", "redis://h:1/0?size=3",
                "redis://h:1/0?timeout=0", "unix:///tmp/redis.sock"):
        with pytest.raises(ValueError):
            RemoteSettings.parse(bad)
    assert remote_cache_from(None, {}) == (None, None)
    cache, note = remote_cache_from(None, {"TORCHLOOM_REMOTE_CACHE": redis_url,
                                           "TORCHLOOM_REMOTE_CACHE_KEY": "k"})
    assert cache.settings.url == redis_url and note is None

    from torchloom.compiler import Compiler
    monkeypatch.setenv("TORCHLOOM_REMOTE_CACHE_KEY", KEY)
    monkeypatch.delenv("TORCHLOOM_REMOTE_CACHE", raising=False)
    pipeline = tmp_path / "p.toml"
    pipeline.write_text('[pipeline]\nname = "p"\ncodegen = "eager"\n\n'
                        f'[runtime]\nremote_cache = "{redis_url}?ttl=5"\n')
    assert Compiler(pipeline).remote_cache.settings.ttl == 5  # the pipeline's key
    monkeypatch.setenv("TORCHLOOM_REMOTE_CACHE", f"{redis_url}?ttl=6")
    assert Compiler(pipeline).remote_cache.settings.ttl == 6  # the environment first
    assert Compiler(pipeline, remote_cache=f"{redis_url}?ttl=7").remote_cache.settings.ttl == 7
    assert Compiler(pipeline, remote_cache=False).remote_cache is None
    with pytest.raises(PipelineError, match="unknown option"):
        Compiler(pipeline, remote_cache="redis://h:1/0?bogus=1")
    pipeline.write_text('[runtime]\nremote_cache = 3\n')
    with pytest.raises(PipelineError, match="remote_cache must be a string"):
        Compiler(pipeline)


def test_backend_option_remote_cache(fleet, redis_url, redis_client, monkeypatch):
    import torch

    from torchloom.compiler import Compiler
    fleet()
    monkeypatch.delenv("TORCHLOOM_REMOTE_CACHE")
    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2, backend="torchloom",
                       options={"remote_cache": redis_url})
    x = torch.randn(4, 8)
    torch.testing.assert_close(fn(x), torch.nn.functional.gelu(x) * 2)
    torch._dynamo.reset()
    assert entries(redis_client, "graph")  # the backend compiled through the shared cache
    assert Compiler("default").remote_cache is None  # only that backend was told


@pytest.mark.parametrize("query, why", [("timeout=abc", "timeout must be a number"),
                                        ("ttl=-5", "ttl must be 0 (for ever) or a positive"),
                                        ("timeout=0", "timeout must be positive"),
                                        ("max_entry_bytes=x", "must be a number"),
                                        ("colour=red", "unknown option(s) colour")])
@pytest.mark.parametrize("user", ["", "admin"])
def test_messages_about_a_bad_url_never_show_its_password(query, why, user):
    """Found by a hostile tester (issue 40): the password was in every such message."""
    url = f"redis://{user}:s3cretpw@host:6379/0?{query}"
    with pytest.raises(ValueError) as info:
        RemoteSettings.parse(url)
    assert "s3cretpw" not in str(info.value) and why in str(info.value)
    assert f"redis://{user}:***@host:6379/0" in str(info.value)
    from torchloom.compiler import _remote_cache
    from torchloom.errors import PipelineError
    with pytest.raises(PipelineError) as info:
        _remote_cache(url, None)
    assert "s3cretpw" not in str(info.value)
    assert RemoteSettings.parse(url.replace(query, "ttl=0")).ttl == 0  # 0 is allowed


def test_a_server_that_failed_is_not_asked_again_by_the_next_graphs(monkeypatch, tmp_path,
                                                                     caplog):
    """Found by a hostile tester (issue 40): each graph of a model (graph breaks) compiles
    with its own cache, and each asked the dead server again: a warning and a full timeout
    per graph. Now the first failure is the process's: one connection, one warning."""
    import threading

    import torch
    import torch._dynamo

    from torchloom.runtime.remote_cache import PROCESS_HEALTH

    def f(x):
        y = torch.tanh(x) * 2
        torch._dynamo.graph_break()
        y = torch.sigmoid(y) + 1
        torch._dynamo.graph_break()
        return torch.relu(y) - 1

    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        silent.settimeout(0.2)
        accepted, stop = [], threading.Event()

        def accept():
            while not stop.is_set():
                try:
                    accepted.append(silent.accept()[0])
                except OSError:
                    pass
        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0?timeout=0.4"
        monkeypatch.setenv("TORCHLOOM_REMOTE_CACHE", url)
        monkeypatch.setenv("TORCHLOOM_REMOTE_CACHE_KEY", KEY)
        monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path / "local"))
        torch._dynamo.reset()
        x = torch.randn(64)
        try:
            with caplog.at_level(logging.WARNING, logger="torchloom"):
                got = torch.compile(f, backend="torchloom")(x)
        finally:
            stop.set()
            thread.join()
            for conn in accepted:
                conn.close()
            PROCESS_HEALTH.answered(url)  # (other tests may use the port)
    torch.testing.assert_close(got, f(x))
    assert len([w for w in remote_warnings(caplog) if "unusable" in w]) == 1
    assert len(accepted) == 1


def test_server_health_retries_after_its_back_off():
    from torchloom.runtime.remote_cache import ServerHealth
    now = [100.0]
    health = ServerHealth(retry_after=60, clock=lambda: now[0])
    assert health.usable("redis://a") and health.failed("redis://a")
    assert not health.usable("redis://a") and health.usable("redis://b")
    now[0] += 59.9
    assert not health.usable("redis://a")
    now[0] += 0.2
    assert health.usable("redis://a")  # one retry ...
    assert not health.failed("redis://a") and not health.usable("redis://a")  # ... no news
    health.answered("redis://a")
    assert health.usable("redis://a") and health.failed("redis://a")  # news again
