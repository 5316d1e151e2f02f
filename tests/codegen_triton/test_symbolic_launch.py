"""The symbolic launcher's choices that need a GPU to matter (launch.py), checked with
recording stand-ins for Triton's kernel objects (no GPU): autotuning once per size bucket
(and the fleet's record of every bucket), the compiled kernel's own launcher reused per
specialisation of the size arguments, and max-autotune's wider search per bucket."""

from __future__ import annotations

import json

import pytest
import torch
from torchloom.api import parse_graph

from conftest import group_text
from torchloom_codegen_triton import TritonCodegen
from torchloom_codegen_triton.launch import SymbolicLauncher


class _Recording:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.log.append((self.name, grid, kwargs))


class _Module:
    def __init__(self, meta, log):
        for v in meta["variants"]:
            setattr(self, v["kernel"], _Recording(log, v["kernel"]))
            if v.get("finish"):
                setattr(self, v["finish"]["kernel"], _Recording(log, "finish"))


def _row_sum_meta(registry, tmp_path) -> dict:
    text = group_text("%a: f32[s0, s1]", """
        %s = aten.sum.dim_IntList(%a) {dim = [-1]} : f32[s0]""", "%s: f32[s0]")
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=True)
    return codegen.generate(next(iter(parse_graph(text).nodes)), registry).metadata


def test_autotuning_is_keyed_by_size_bucket(registry, tmp_path, monkeypatch):
    import triton.testing
    benched = []
    monkeypatch.setattr(triton.testing, "do_bench",
                        lambda fn, warmup, rep: (fn(), benched.append(1), 1.0 + len(benched))[2])
    meta, log = _row_sum_meta(registry, tmp_path), []
    stem = tmp_path / "kfake"
    kernel = SymbolicLauncher(_Module(meta, log), meta, {"f32": torch.float32}, stem, False,
                              False)
    shared = []
    kernel.share_tuning(shared.append)
    kernel(torch.randn(40, 100))
    first = len(benched)
    candidates = kernel.candidates("fused_sum:64:128")
    assert first == len(candidates) > 1  # the first call of a bucket tunes it
    kernel(torch.randn(50, 120))  # rows 64, row length 128: the same bucket
    assert len(benched) == first
    kernel(torch.randn(40, 300))  # a longer row: another bucket, tuned once
    assert len(benched) == first + len(kernel.candidates("fused_sum:64:512"))
    files = sorted(p.name for p in tmp_path.glob("kfake.*.tune.json"))
    assert files == ["kfake.fused_sum-64-128.tune.json", "kfake.fused_sum-64-512.tune.json"]
    record = json.loads((tmp_path / files[0]).read_text())
    assert record["config"] == candidates[0]  # the first benchmarked was the fastest
    assert shared[-1] == {"buckets": kernel.tuned} and len(kernel.tuned) == 2
    # another process given the fleet's record tunes nothing
    other = SymbolicLauncher(_Module(meta, []), meta, {"f32": torch.float32},
                             tmp_path / "other", False, False)
    other.apply_tuning(shared[-1])
    other(torch.randn(33, 90))
    assert len(benched) == first + len(kernel.candidates("fused_sum:64:512"))
    with pytest.raises(ValueError):
        other.apply_tuning({"buckets": {"fused_sum:64:128": {"XBLOCK": 3}}})


def test_compiled_launchers_are_reused_per_specialisation(registry, tmp_path):
    """On a GPU the JIT path runs once per (variant, config, specialisation of the size
    arguments: equal to 1, multiple of 16); other calls take the compiled kernel's own
    launcher (a recording stand-in for Triton's kernel objects, no GPU)."""
    log = []

    class Jit:
        def __init__(self, label):
            self.label = label

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                if self.label == "fast":  # Triton's compiled kernel: a grid of three dims
                    grid[0], grid[1], grid[2]
                log.append((self.label, grid))
                return Jit("fast")
            return launch

    class Module:
        def __getattr__(self, name):
            return Jit("jit")

    text = group_text("%a: f32[s0, s1]", """
        %e = aten.exp.default(%a) : f32[s0, s1]""", "%e: f32[s0, s1]")
    meta = TritonCodegen(cache_dir=tmp_path, autotune=False).generate(
        next(iter(parse_graph(text).nodes)), registry).metadata
    kernel = SymbolicLauncher(Module(), meta, {"f32": torch.float32}, None, False, False)
    for rows, cols in [(3, 5), (7, 3), (1, 5), (32, 16), (3, 5), (16, 32)]:
        kernel(torch.randn(rows, cols))
    # (3, 5) and (7, 3) share a specialisation and a config; 1 and 16-multiples have
    # their own
    assert [label for label, _ in log] == ["jit", "fast", "jit", "jit", "fast", "fast"]
    assert {len(grid) for label, grid in log if label == "fast"} == {3}


def test_max_autotune_searches_every_launch_per_bucket(registry, tmp_path):
    text = group_text("%a: f32[s0, s1]", """
        %e = aten.exp.default(%a) : f32[s0, s1]""", "%e: f32[s0, s1]")
    meta = TritonCodegen(cache_dir=tmp_path, autotune=False).generate(
        next(iter(parse_graph(text).nodes)), registry).metadata
    plain, wide = (SymbolicLauncher(_Module(meta, []), meta, {"f32": torch.float32}, None,
                                    False, False, wide_search=w) for w in (False, True))
    bucket = "fused_exp:4096:1"
    assert plain.candidates(bucket)[0] == wide.candidates(bucket)[0]  # the default first
    assert len(wide.candidates(bucket)) > len(plain.candidates(bucket)) >= 2
