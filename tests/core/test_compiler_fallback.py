"""Compiler.compile_fx never crashes the user's program on an internal error."""

from __future__ import annotations

import logging

import torch

import torchloom.compiler as compiler_mod
from torchloom.compiler import Compiler


def test_internal_error_while_building_falls_back_to_eager(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("boom in the runtime builder")

    monkeypatch.setattr(compiler_mod, "CompiledGraph", broken)
    compiler = Compiler("none")

    def fn(x):
        return torch.sin(x) * 2

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="torchloom", options={"compiler": compiler})
    x = torch.randn(5)
    with caplog.at_level(logging.WARNING, logger="torchloom"):
        torch.testing.assert_close(compiled(x), fn(x))
    torch._dynamo.reset()
    reasons = [c.fallback_reason for c in compiler.compilations]
    assert reasons and all("internal error while compiling: RuntimeError: boom" in r
                           for r in reasons)
    assert any("running graph0 eagerly" in rec.getMessage() for rec in caplog.records)
