"""Shared helpers for the cpu codegen tests.

``check`` compiles a hand-written fusion-group graph with the cpu codegen, runs it, and
compares every output with the eager codegen's. ``group_text`` writes such a graph.
``compiled`` wraps a function in ``torch.compile`` with torchloom's default pipeline (end
to end), ``codegens`` lists the codegen of each group it compiled. ``Counting`` counts
calls of eager's ops (those a library call replaces). The
codegen's cache directory is one per test session, so identical kernels build once.
"""

from __future__ import annotations

import contextlib
import re

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torchloom.api import parse_graph, verify
from torchloom.testing.reductions import group_text  # noqa: F401  (tests import it from here)
from torchloom.backend import torchloom_backend
from torchloom.tools import Compiler, EagerCodegen, load_plugins
from torchloom.runtime.executor import CompiledGraph

from torchloom_codegen_cpu import CpuCodegen


class Counting(TorchDispatchMode):
    """Counts the calls of ``ops`` (eager's op, where a library call should run instead)."""

    def __init__(self, *ops):
        super().__init__()
        self.ops, self.calls = ops, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func in self.ops
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def thread_count(n: int):
    """torch's (and so the kernels') thread count set to ``n`` inside, restored after."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(n)
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def registry():
    return load_plugins().registry


@pytest.fixture(scope="session")
def codegen(tmp_path_factory):
    return CpuCodegen(cache_dir=tmp_path_factory.mktemp("cpu-cache"), f16="compile")


@pytest.fixture(autouse=True)
def f16_compiled(monkeypatch):
    """These tests check the kernels f16 groups compile to, also where the compiler's f16
    conversions do not vectorize and the codegen would leave f16 groups to eager
    (test_cpu_f16_policy.py checks that rule)."""
    monkeypatch.setenv("TORCHLOOM_CPU_F16", "compile")


def compare(got, want, exact: bool = False, **tolerances) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        if exact:
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
        else:
            torch.testing.assert_close(g, w, equal_nan=True, **tolerances)


def as_accurate_as_eager(check, text: str, inputs, got, want) -> None:
    """Ill-conditioned chains (a difference of nearly equal values, a division by one)
    amplify one-ulp differences of libm functions past any fixed tolerance; there the result
    must be as close to the float64 result as eager's is (within 2x), and agree with eager
    on NaN and inf."""
    exact = check.reference(text.replace("f32[", "f64["), *[i.double() for i in inputs])
    for g, w, e in zip(got, want, exact):
        ok = closer_than_eager(g, w, e)
        assert ok.all(), (text, g[~ok], w[~ok])


def closer_than_eager(got, want, exact, rel: float = 1e-4, slack: float = 1e-6):
    """Elementwise: ``got`` is eager's ``want`` (NaN as NaN), or both ``want`` and the float64
    result ``exact`` are finite and ``got`` is within twice eager's distance of ``exact``
    (plus ``rel * |exact| + slack``)."""
    g, w, e = got.double(), want.double(), exact.double()
    finite = torch.isfinite(w) & torch.isfinite(e)
    same = (g == w) | (torch.isnan(g) & torch.isnan(w))
    return same | (finite & ((g - e).abs() <= 2 * (w - e).abs() + rel * e.abs() + slack))


def reduction_statement(op: str, value: str, shape, dtype: str, dim: int,
                        keep: bool) -> tuple[str, str]:
    """``%r = op(value) {dim = [dim], keepdim = keep}`` over ``shape`` (a statement of a
    random group) and the group result it gives, ``%r: <type>``."""
    out = list(shape)
    if keep:
        out[dim] = 1
    else:
        del out[dim]
    result = f"{dtype}[{', '.join(map(str, out))}]"
    return (f"%r = {op}({value}) {{dim = [{dim}], keepdim = {str(keep).lower()}}} : {result}",
            f"%r: {result}")


class Checker:
    def __init__(self, registry, codegen):
        self.registry, self.codegen = registry, codegen

    def compile(self, text: str) -> CompiledGraph:
        graph = parse_graph(text)
        verify(graph, self.registry)  # the hand-written types must be what torch infers
        compiled = CompiledGraph(graph, self.registry, [self.codegen, EagerCodegen()])
        assert [c.codegen for c in compiled.choices] == ["cpu"] * len(compiled.choices), [
            str(r) for c in compiled.choices for r in c.fallback_reasons]
        return compiled

    def source(self, text: str) -> str:
        """The C source the cpu codegen writes for the one group of ``text``."""
        return self.codegen.generate(self.compile(text).choices[0].node, self.registry).source

    def sources(self, compiler) -> list[str]:
        """The C source of every group a ``Compiler`` compiled, generated again."""
        return [self.codegen.generate(ch.node, self.registry).source
                for comp in compiler.compilations for ch in comp.compiled.choices]

    def reference(self, text: str, *inputs):
        return CompiledGraph(parse_graph(text), self.registry, [EagerCodegen()])(*inputs)

    def __call__(self, text: str, *inputs, exact: bool = False, **tolerances):
        """Run ``text`` on the cpu codegen and on eager; assert the outputs agree; return
        (cpu outputs, compiled graph)."""
        compiled = self.compile(text)
        got = compiled(*inputs)
        compare(got, self.reference(text, *inputs), exact, **tolerances)
        return got, compiled


@pytest.fixture
def check(registry, codegen):
    return Checker(registry, codegen)


def compiled(fn, tmp_path, dynamic=None):
    """(compiler, ``torch.compile(fn)`` through torchloom's default pipeline)."""
    compiler = Compiler("default", cache_dir=tmp_path, compile_cache=False, strict=True)
    torch._dynamo.reset()
    return compiler, torch.compile(fn, dynamic=dynamic, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))


def codegens(compiler) -> list[str]:
    """The codegen of each group ``compiler`` compiled, in order."""
    return [c.codegen for comp in compiler.compilations for c in comp.compiled.choices]


TREE = re.compile(r"(?:float|double|int\w*) \w+_lanes\[(\d+)\];(?:.|\n)*?"
                  r"for \(int64_t rb = 0; rb < (\d+); rb\+\+\)")


def tree_loops(source: str) -> list[tuple[int, int]]:
    """(lanes, blocks) of each row reduction whose lanes are combined as a tree (lanes.py)."""
    return [(int(a), int(b)) for a, b in TREE.findall(source)]


def softmax_text(dtype: str, rows: int, cols: int) -> str:
    """A fusion group of softmax over the rows of ``%a`` (amax, sub, exp, sum, div)."""
    return group_text(f"%a: {dtype}[{rows}, {cols}]", f"""
        %m = aten.amax.default(%a) {{dim = [-1], keepdim = true}} : {dtype}[{rows}, 1]
        %s = aten.sub.Tensor(%a, %m) : {dtype}[{rows}, {cols}]
        %e = aten.exp.default(%s) : {dtype}[{rows}, {cols}]
        %t = aten.sum.dim_IntList(%e) {{dim = [-1], keepdim = true}} : {dtype}[{rows}, 1]
        %y = aten.div.Tensor(%e, %t) : {dtype}[{rows}, {cols}]""",
                      f"%y: {dtype}[{rows}, {cols}]")
