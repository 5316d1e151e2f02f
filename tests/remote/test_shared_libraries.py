"""Built artifacts shared through the remote cache: the ``cpu`` codegen's libraries (and its
toolchain probe) in namespace ``artifact-cpu``, so a process whose fleet compiled a model
runs no C compiler; a forged or damaged library entry is rejected and rebuilt, never
loaded; a library over the size limit is not shared (said once); any codegen with
``with_artifacts`` gets the same store through the protocol."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import types
from pathlib import Path

import pytest
import torch
from torchloom.api import hookimpl, parse_graph
from torchloom.report.explain import explain
from torchloom.runtime.remote_cache import (RemoteArtifacts, RemoteCache, RemoteSettings,
                                            sign, verify_bytes)
from torchloom.tools import Compiler, EagerCodegen, load_plugins
from torchloom_codegen_cpu.toolchain import cpu_features, find_compiler, probe

from remote_children import (KEY, entries, explain_in_new_process, recording_cc, remote_warnings,
                             runs)

NS = "artifact-cpu"


def libraries(client) -> list[bytes]:
    """The Redis keys of shared libraries (the toolchain probe's record left out)."""
    return [k for k in entries(client, NS) if not k.decode().rpartition(":")[2]
            .startswith("toolchain-")]


def local_libraries(machine: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((machine / "cpu").glob("*.so"))}


@pytest.fixture
def cc_log(tmp_path, monkeypatch) -> Path:
    """``CC`` records each run of the C compiler in the file returned (see ``runs``)."""
    cc, log = recording_cc(tmp_path)
    monkeypatch.setenv("CC", str(cc))
    return log


@pytest.mark.slow
def test_second_process_runs_no_c_compiler(redis_url, redis_client, workload, tmp_path,
                                           cc_log):
    """Two processes, each with its own empty local cache: the first builds the libraries
    and shares them; the second loads them from Redis and never runs ``$CC`` (it records
    every run), with eager's results."""
    done = []
    for i in range(2):
        data = explain_in_new_process(redis_url, workload, tmp_path / f"process{i}")
        done.append((data, runs(cc_log)))
    (first, after_first), (second, after_second) = done
    builds = [r for r in after_first if "-shared" in r and "probe.c" not in r]
    assert builds and any("--version" in r for r in after_first)  # the first one compiled
    assert after_second == after_first  # the second ran no compiler at all
    assert len(libraries(redis_client)) == len(builds)
    mine, theirs = (local_libraries(tmp_path / f"process{i}") for i in range(2))
    assert len(theirs) == len(builds) and theirs == mine  # the same bytes, kept locally
    for name, data in theirs.items():  # each with the digest the loader checks
        digest = (tmp_path / "process1" / "cpu" / f"{name}.sha256").read_text()
        assert digest == hashlib.sha256(data).hexdigest()
    assert second["max_abs_error"] is not None and second["max_abs_error"] < 1e-5
    assert first["kernel_cache"]["remote_artifact_hits"] == 0
    assert second["kernel_cache"]["remote_artifact_hits"] == len(builds) + 1  # + the probe
    assert second["fusion_groups"] == first["fusion_groups"] > 0
    assert second["kernels"] == first["kernels"]


def _evil_library(tmp_path: Path, marker: Path) -> bytes:
    """A library that, loaded, writes ``marker`` (what loading a forged entry would run)."""
    source = tmp_path / "evil.c"
    source.write_text('#include <stdio.h>\n__attribute__((constructor)) static void pwn(void)'
                      f' {{ FILE* f = fopen("{marker}", "w"); if (f) {{ fputs("owned", f); '
                      'fclose(f); } }\n')
    out = tmp_path / "evil.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(source)], check=True)
    return out.read_bytes()


@pytest.mark.parametrize("damage", ["forged", "flipped byte", "signed, not a library"])
def test_bad_library_entry_is_rejected_and_rebuilt_never_loaded(
        fleet, workload, redis_client, tmp_path, cc_log, caplog, damage):
    fleet()
    explain(workload, cached=True)
    keys = libraries(redis_client)
    assert keys
    marker = tmp_path / "owned.txt"
    evil = _evil_library(tmp_path, marker)
    for k in keys:
        name = k.decode().rpartition(":")[2]
        if damage == "forged":  # a working library, signed without the fleet's key
            value = sign(b"not-the-key", NS, name, evil)
        elif damage == "flipped byte":
            value = redis_client.get(k)
            value = value[:-100] + bytes([value[-100] ^ 1]) + value[-99:]
        else:  # authentic (the key's holder wrote it) but no library
            value = sign(KEY.encode(), NS, name, b"\x7fELF not really")
        redis_client.set(k, value)
    machine = fleet()
    before = len(runs(cc_log))
    with caplog.at_level(logging.WARNING, logger="torchloom"):
        result = explain(workload, cached=True)
    assert not marker.exists()  # nothing of the bad entries ran
    assert result.data["max_abs_error"] is not None and result.data["max_abs_error"] < 1e-5
    rejected = [w for w in remote_warnings(caplog) if "rejected" in w]
    assert len(rejected) == len(keys) and all(NS in w for w in rejected)
    why = "does not load" if damage == "signed, not a library" else "HMAC mismatch"
    assert all(why in w for w in rejected)
    assert result.compiler.remote_cache.stats(NS)["errors"] == len(keys)
    assert result.data["kernel_cache"]["remote_errors"] == len(keys)  # what explain counts
    rebuilt = [r for r in runs(cc_log)[before:] if "-shared" in r]
    assert len(rebuilt) == len(keys)  # each rebuilt here
    mine = local_libraries(machine)
    for k in keys:  # and shared again, authentic: the bytes built here
        name = k.decode().rpartition(":")[2]
        assert verify_bytes(KEY.encode(), NS, name, redis_client.get(k)) == mine[f"{name}.so"]


def test_library_over_the_size_limit_is_not_shared_said_once(
        fleet, workload, redis_url, redis_client, cc_log, monkeypatch, caplog):
    fleet()
    explain(workload, cached=True)
    limit = min(len(redis_client.get(k)) for k in libraries(redis_client)) - 1
    redis_client.flushdb()
    monkeypatch.setenv("TORCHLOOM_REMOTE_CACHE", f"{redis_url}?max_entry_bytes={limit}")
    fleet()
    with caplog.at_level(logging.WARNING, logger="torchloom"):
        result = explain(workload, cached=True)
    said = [r.getMessage() for r in caplog.records if f"{NS}:" in r.getMessage()]
    assert len(said) == 1 and "over max_entry_bytes" in said[0]
    built = len(local_libraries(Path(os.environ["TORCHLOOM_CACHE_DIR"])))
    assert built >= 2 and result.compiler.remote_cache.stats(NS)["oversized"] == built
    assert libraries(redis_client) == []  # not shared; the small toolchain record is
    assert len(entries(redis_client, NS)) == 1
    fleet()
    before = len(runs(cc_log))
    data = explain(workload, cached=True).data  # builds its libraries, probes nothing
    assert data["max_abs_error"] is not None and data["max_abs_error"] < 1e-5
    assert [r for r in runs(cc_log)[before:] if "-shared" not in r or "probe.c" in r] == []
    assert len(runs(cc_log)[before:]) == built


def test_bad_toolchain_record_is_rejected_and_probed_again(redis_url, redis_client,
                                                          tmp_path, cc_log):
    remote = RemoteCache(RemoteSettings.parse(redis_url), KEY.encode())
    store = RemoteArtifacts(remote, NS)
    cc = find_compiler()
    first = probe(cc, tmp_path / "a", 60, store)  # probed here, and shared
    [key] = entries(redis_client, NS)
    name = key.decode().rpartition(":")[2]
    # --version, three builds (libmvec links; a library calling the interpreter links; one
    # without gcc's PRE, toolchain.NO_PRE) and on an AVX-512 CPU one build with 512-bit
    # vectors preferred (toolchain._width_flags) and one or two compiles to assembly (do
    # table reads gather? tables.py)
    probed = len(runs(cc_log))
    wide = sum("-mprefer-vector-width=512" in r.split() for r in runs(cc_log))
    assert wide == ("avx512f" in cpu_features())
    assert sum("-fno-tree-pre" in r.split() for r in runs(cc_log)) == 1
    assert name.startswith("toolchain-") and probed == 4 + wide + sum(
        "-S" in r.split() for r in runs(cc_log))
    assert probed in (4, 6, 7)
    assert probe(cc, tmp_path / "b", 60, store) == first and len(runs(cc_log)) == probed
    redis_client.set(key, sign(KEY.encode(), NS, name, b'{"version": "x", "flags": "-O0"}'))
    assert probe(cc, tmp_path / "c", 60, store) == first  # authentic, but no record:
    assert len(runs(cc_log)) == 2 * probed and remote.stats(NS)["errors"] == 1  # probed again
    shared = json.loads(verify_bytes(KEY.encode(), NS, name, redis_client.get(key)))
    assert shared["flags"] == list(first.flags)  # and shared again


def test_binary_entries_round_trip_and_are_authenticated(redis_url, redis_client):
    remote = RemoteCache(RemoteSettings.parse(redis_url), KEY.encode())
    blob = bytes(range(256)) * 3  # not UTF-8
    remote.put(NS, "lib", blob)
    assert remote.get_bytes(NS, "lib") == blob
    assert remote.get(NS, "lib") is None  # text is asked for: rejected, never decoded
    assert remote.stats(NS)["errors"] == 1
    other = RemoteCache(RemoteSettings.parse(redis_url), b"another key")
    assert other.get_bytes(NS, "lib") is None and other.stats(NS)["errors"] == 1
    redis_client.set(f"torchloom:{NS}:moved", redis_client.get(f"torchloom:{NS}:lib"))
    assert remote.get_bytes(NS, "moved") is None  # signed for another name


class Sharing(EagerCodegen):
    """An eager codegen that keeps one artifact per kernel in the store it is offered."""

    name = "sharing"

    def __init__(self, store=None, fail: bool = False):
        self.store, self.fail, self.offered = store, fail, []

    def with_artifacts(self, store):
        self.offered.append(store)
        if self.fail:
            raise RuntimeError("no sharing today")
        return Sharing(store)

    def load(self, kernel, registry):
        if self.store is not None and self.store.get("artifact") is None:
            self.store.put("artifact", b"\x00built\xff")
        return super().load(kernel, registry)


GRAPH = """graph @g(%x: f32[8]) {
  %a = torchloom.fusion_group(%x) : f32[8] region @r(%p: f32[8]) {
    %t = aten.exp.default(%p) : f32[8]
    return %t
  }
  return %a
}
"""


@pytest.mark.parametrize("fail", [False, True])
def test_any_codegen_is_offered_the_store_once(redis_url, tmp_path, monkeypatch, caplog,
                                               fail):
    monkeypatch.setenv("TORCHLOOM_REMOTE_CACHE_KEY", KEY)
    codegen = Sharing(fail=fail)
    module = types.ModuleType("sharing_plugin")
    module.torchloom_codegens = hookimpl(lambda: [codegen])
    plugins = load_plugins(entry_points=[], extra=[("sharing", module, "sharing", "1")])
    compiler = Compiler({"pipeline": {"codegen": "sharing"}}, plugins=plugins,
                        cache_dir=tmp_path, remote_cache=redis_url)
    x = torch.randn(8)
    with caplog.at_level(logging.WARNING, logger="torchloom"):
        for _ in range(2):
            comp = compiler.compile_graph(parse_graph(GRAPH))
            torch.testing.assert_close(comp.fn(x)[0], x.exp())
            assert [c.codegen for c in comp.compiled.choices] == ["sharing"]
    assert len(codegen.offered) == 1  # once per compiler, in the codegen's namespace
    cannot = [r.getMessage() for r in caplog.records if "cannot share" in r.getMessage()]
    assert len(cannot) == (1 if fail else 0)
    shared = compiler.remote_cache.get_bytes("artifact-sharing", "artifact")
    assert shared == (None if fail else b"\x00built\xff")
