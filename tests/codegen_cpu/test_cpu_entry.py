"""Kernels called through their CPython entry (entry.py) instead of ctypes, the ctypes
fallback for libraries without one, and the launcher's output allocation (strides as
``torch.empty`` gives them, at every size including 0)."""

from __future__ import annotations

import ctypes
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torchloom.api import parse_graph, symbols, verify
from torchloom.runtime.executor import CompiledGraph
from torchloom.tools import EagerCodegen

from torchloom_codegen_cpu import CpuCodegen, toolchain
from torchloom_codegen_cpu.entry import entry_source
from torchloom_codegen_cpu.launcher import _contiguous_source, launcher

from conftest import group_text

#: scalars of every kind as graph values (not attributes): each is a kernel argument
SCALARS = group_text("%x: f32[4, 8], %a: float, %n: int, %b: bool", """
    %y = aten.add.Tensor(%x, %a) : f32[4, 8]
    %z = aten.mul.Tensor(%y, %n) : f32[4, 8]
    %w = aten.mul.Tensor(%z, %b) : f32[4, 8]""", "%w: f32[4, 8]")


def _kernel(codegen, registry, text: str = SCALARS):
    graph = parse_graph(text)
    verify(graph, registry)
    return codegen.load(codegen.generate(next(iter(graph.nodes)), registry), registry)


def _reference(registry, text: str, *args):
    return CompiledGraph(parse_graph(text), registry, [EagerCodegen()])(*args)[0]


@pytest.mark.parametrize("a, n, b", [(1.5, 3, True), (-0.0, -7, False), (math.inf, 0, True),
                                     (math.nan, 2**40, True), (2, True, 1), (1e-310, -1, 0)])
def test_scalars_of_each_kind_reach_the_kernel(registry, codegen, a, n, b):
    kernel = _kernel(codegen, registry)
    assert "-DTL_PYENTRY" in codegen.toolchain().flags  # Linux: libraries may call Python
    assert isinstance(kernel.fn, type(len)), type(kernel.fn)  # a builtin, not ctypes
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    got = kernel(x, a, n, b)[0]
    torch.testing.assert_close(got, _reference(registry, SCALARS, x, a, n, b), equal_nan=True,
                               rtol=0, atol=0)


def test_bad_arguments_raise_python_errors(registry, codegen):
    kernel = _kernel(codegen, registry)
    x = torch.randn(4, 8)
    with pytest.raises(TypeError):
        kernel(x, "1.5", 3, True)  # a float argument that is not a number
    with pytest.raises(TypeError):
        kernel(x, 1.5, 3.5, True)  # an int argument given a float
    with pytest.raises(TypeError, match="takes 6 arguments"):
        kernel.fn(x.data_ptr(), 1.0)
    with pytest.raises((TypeError, OverflowError)):
        kernel(x, 1.5, 2**70, True)  # does not fit int64_t
    torch.testing.assert_close(kernel(x, 1.5, 3, True)[0], (x + 1.5) * 3)  # still works


def test_where_a_library_cannot_call_python_kernels_use_ctypes(registry, tmp_path,
                                                               monkeypatch):
    """A platform whose linker refuses a library's undefined interpreter symbols (macOS
    without ``-undefined dynamic_lookup``): the probe's entry build fails."""
    monkeypatch.setattr(toolchain, "ENTRY_HEAD", "#error no entries here\n")
    codegen = CpuCodegen(cache_dir=tmp_path)
    assert "-DTL_PYENTRY" not in codegen.toolchain().flags
    kernel = _kernel(codegen, registry)
    assert isinstance(kernel.fn, ctypes._CFuncPtr)
    x = torch.randn(4, 8)
    torch.testing.assert_close(kernel(x, 0.5, 2, True)[0], (x + 0.5) * 2)


def test_a_library_without_entries_is_called_through_ctypes(registry, codegen, tmp_path):
    """A library an earlier version built (the kernel alone, no ``tl_entry_`` symbol)."""
    graph = parse_graph(SCALARS)
    source = codegen.generate(next(iter(graph.nodes)), registry)
    path = toolchain.build(source.source, codegen.toolchain(), tmp_path, 60)
    kernel = launcher(ctypes.CDLL(str(path)), source.metadata)
    assert isinstance(kernel.fn, ctypes._CFuncPtr)
    x = torch.randn(4, 8)
    torch.testing.assert_close(kernel(x, 0.5, -2, True)[0], (x + 0.5) * -2)


def test_an_entry_is_only_written_for_a_kernel_name():
    meta = {"kernel": "k(); system(\"x\")", "inputs": [], "outputs": []}
    with pytest.raises(ValueError, match="not a kernel name"):
        entry_source(meta)
    with pytest.raises(KeyError):
        entry_source({"kernel": "k", "inputs": [{"scalar": "complex"}], "outputs": []})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5)), min_size=0, max_size=5))
def test_output_strides_are_torch_empty_s(dims):
    """Row-major strides of a shape with symbolic and int dims, sizes 0 included."""
    shape = [f"s{k}" if symbolic else n for k, (symbolic, n) in enumerate(dims)]
    texts = [symbols.python_source(d, lambda s: f"sym_{s}") for d in shape]
    values = {f"sym_s{k}": n for k, (symbolic, n) in enumerate(dims) if symbolic}
    strides = eval(_contiguous_source(texts, shape), {}, values)
    sizes = [n for _, n in dims]
    assert strides == torch.empty(sizes).stride()


def test_a_symbolic_kernel_allocates_as_torch_empty_at_size_0(registry, codegen):
    text = group_text("%x: f32[s0, 3, s1]", """
    %y = aten.exp.default(%x) : f32[s0, 3, s1]""", "%y: f32[s0, 3, s1]")
    kernel = _kernel(codegen, registry, text)
    for shape in ((0, 3, 4), (2, 3, 0), (0, 3, 0), (2, 3, 5), (1, 3, 1)):
        x = torch.randn(shape)
        got = kernel(x)[0]
        assert got.shape == x.shape and got.stride() == torch.empty(shape).stride()
        torch.testing.assert_close(got, x.exp())


class _Tagged(torch.Tensor):
    """A tensor subclass: the entry reads its pointer through ``data_ptr()``."""


@pytest.mark.parametrize("make", [
    lambda x: x,
    lambda x: torch.nn.Parameter(x.clone(), requires_grad=False),
    lambda x: x.clone().as_subclass(_Tagged),
    lambda x: torch.cat([torch.zeros(5), x.flatten()])[5:].view(4, 8),  # a storage offset
    lambda x: x.data_ptr(),  # an int, as the launcher passes a tensor it was given
], ids=["tensor", "parameter", "subclass", "offset", "int"])
def test_the_entry_reads_each_kind_of_pointer_argument(registry, codegen, make):
    """Torch's C reader for exact tensors and parameters, ``data_ptr()`` for anything
    else, the int itself for an int; a view's offset included."""
    kernel = _kernel(codegen, registry)
    assert kernel._tensors
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(5))
    out = torch.full((4, 8), float("nan"))
    given = make(x)  # (an int input: the output given as an int too)
    kernel.fn(given, 0.25, 3, True, out.data_ptr() if isinstance(given, int) else out, 1)
    torch.testing.assert_close(out, (x + 0.25) * 3, rtol=0, atol=0)
    torch.testing.assert_close(kernel(x, 0.25, 3, True)[0], (x + 0.25) * 3, rtol=0, atol=0)


@pytest.mark.parametrize("bad", [None, "x", [1.0], 1.5])
def test_the_entry_given_no_tensor_raises_that_object_s_error(registry, codegen, bad):
    kernel = _kernel(codegen, registry)
    out = torch.empty(4, 8)
    with pytest.raises(AttributeError, match="data_ptr"):
        kernel.fn(bad, 1.0, 2, True, out, 1)
    x = torch.randn(4, 8)
    with pytest.raises(AttributeError, match="data_ptr"):
        kernel.fn(x, 1.0, 2, True, bad, 1)
    torch.testing.assert_close(kernel(x, 1.0, 2, True)[0], (x + 1.0) * 2)  # still works


def test_a_tensor_without_storage_raises_instead_of_aborting(registry, codegen):
    """Under ``vmap`` the kernel is handed batched tensors (type ``torch.Tensor``, no
    storage): torch's C reader would throw through C frames and abort the process; the
    launcher reads given tensors with ``data_ptr()``, which raises."""
    kernel = _kernel(codegen, registry, group_text("%x: f32[8]", """
    %y = aten.exp.default(%x) : f32[8]""", "%y: f32[8]"))
    x = torch.randn(4, 8)
    torch.testing.assert_close(kernel(x[1])[0], x[1].exp())
    with pytest.raises(RuntimeError, match="storage"):
        torch.func.vmap(lambda t: kernel(t)[0])(x)
