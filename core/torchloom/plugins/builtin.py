"""The core's built-in plugin: dce, cse, canonicalize and the eager codegen, registered
through the same hooks as any installed plugin."""

from __future__ import annotations

from torchloom.plugins.hookspecs import hookimpl


@hookimpl
def torchloom_passes():
    from torchloom.passes.builtin.canonicalize import Canonicalize
    from torchloom.passes.builtin.cse import CommonSubexpressionElimination
    from torchloom.passes.builtin.dce import DeadCodeElimination
    return [DeadCodeElimination, CommonSubexpressionElimination, Canonicalize]


@hookimpl
def torchloom_codegens():
    from torchloom.codegen.eager import EagerCodegen
    return [EagerCodegen()]
