"""Autotune results shared through the remote cache: a Triton kernel that tunes writes its
result to Redis; a second process (empty local caches) loads the kernel and the result,
and runs the tuned config without tuning; a forged or invalid result is rejected once and
the kernel tunes again. Triton runs in its interpreter on the CPU; its benchmark timer is
replaced (no GPU to time), the rest is the real launcher."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from torchloom.api import parse_graph
from torchloom.tools import load_plugins
from torchloom.runtime.cache import KernelCache
from torchloom.runtime.remote_cache import RemoteCache, RemoteSettings, sign

pytest.importorskip("triton")

from torchloom_codegen_triton import TritonCodegen  # noqa: E402

KEY = b"fleet-secret"

GROUP = """\
graph @g(%x: f32[64, 256], %y: f32[64, 256]) {
  %a = torchloom.fusion_group(%x, %y) : f32[64] region @r(%p: f32[64, 256], %q: f32[64, 256]) {
    %s = aten.mul.Tensor(%p, %q) : f32[64, 256]
    %t = aten.sum.dim_IntList(%s) {dim = [1]} : f32[64]
    return %t
  }
  return %a
}
"""


@pytest.fixture
def setup(redis_url, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHLOOM_TRITON_CPU", "1")
    registry = load_plugins().registry
    group = parse_graph(GROUP).first
    inputs = (torch.randn(64, 256), torch.randn(64, 256))
    expected = (inputs[0] * inputs[1]).sum(1)
    machines = iter(range(10))

    def machine():
        """A kernel cache and a triton codegen with empty local directories."""
        root = tmp_path / f"machine{next(machines)}"
        remote = RemoteCache(RemoteSettings.parse(redis_url), KEY)
        return (KernelCache(root / "kernels", "fp", remote=remote),
                TritonCodegen(cache_dir=root, autotune=True, verbose=False), remote)
    return registry, group, inputs, expected, machine


def tune_on_first_call(kernel, tmp_path, monkeypatch) -> None:
    """Make the interpreter's launcher tune as on a GPU, the last candidate timing best."""
    import triton.testing
    calls = iter(range(100, 0, -1))
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, warmup, rep: next(calls))
    kernel.tune_path = tmp_path / f"tune-{id(kernel)}.json"  # this kernel's own record


def test_tuned_config_is_shared_and_applied(setup, tmp_path, monkeypatch, redis_client):
    registry, group, inputs, expected, machine = setup
    cache, codegen, _ = machine()
    kernel = cache.get_or_compile(codegen, group, registry)
    candidates = kernel.meta["configs"]
    assert len(candidates) > 1
    tune_on_first_call(kernel, tmp_path, monkeypatch)
    torch.testing.assert_close(kernel(*inputs)[0], expected, atol=1e-4, rtol=1e-4)  # any block order
    assert kernel.config == candidates[-1]
    assert len(list(redis_client.scan_iter("torchloom:tune:*"))) == 1

    cache, codegen, remote = machine()
    second = cache.get_or_compile(codegen, group, registry)
    assert (cache.compiles, cache.remote_hits) == (0, 1)
    assert second.config == candidates[-1] and second.tune_path is None  # no tuning here
    assert remote.stats("tune")["hits"] == 1
    torch.testing.assert_close(second(*inputs)[0], expected, atol=1e-4, rtol=1e-4)  # any block order


@pytest.mark.parametrize("bad", ["forged", "not a candidate"])
def test_bad_tuning_record_is_rejected_and_tuned_again(setup, tmp_path, monkeypatch,
                                                       redis_client, caplog, bad):
    registry, group, inputs, expected, machine = setup
    cache, codegen, _ = machine()
    kernel = cache.get_or_compile(codegen, group, registry)
    tune_on_first_call(kernel, tmp_path, monkeypatch)
    kernel(*inputs)
    (name,) = list(redis_client.scan_iter("torchloom:tune:*"))
    entry = name.decode().split(":")[2]
    record = {"config": {"XBLOCK": 3, "RBLOCK": 7, "num_warps": 1}}  # runs out of bounds
    redis_client.set(name, sign(b"not-the-key" if bad == "forged" else KEY, "tune", entry,
                                json.dumps(record)))
    cache, codegen, remote = machine()
    with caplog.at_level(logging.WARNING, logger="torchloom"):
        again = cache.get_or_compile(codegen, group, registry)
    rejected = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(rejected) == 1 and remote.stats("tune")["errors"] == 1
    assert again.config != record["config"] and again.on_tuned is not None
    tune_on_first_call(again, tmp_path, monkeypatch)
    torch.testing.assert_close(again(*inputs)[0], expected, atol=1e-4, rtol=1e-4)  # any block order
    # tuned here and written back: the entry is valid again
    cache, codegen, _ = machine()
    third = cache.get_or_compile(codegen, group, registry)
    assert third.config == kernel.meta["configs"][-1]
