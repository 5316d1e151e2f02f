"""Kernels a codegen builds in the background (runtime/tiered.py): the plan is made while the
build runs; under ``first_calls = "wait"`` the first call waits for it, under ``"eager"``
calls before it ends run the group op by op (eager's values, the kernel's layouts and
given buffers); a failed build leaves the group op by op, reported once; groups of symbolic
output sizes are resolved when the plan is made; a library function still building runs
the op itself under ``"eager"``."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from torchloom.api import laid_out_as
from torchloom.codegen.base import KernelSource
from torchloom.codegen.eager import EagerCodegen
from torchloom.errors import PipelineError
from torchloom.ir import parse_graph, print_graph
from torchloom.ops.aten import default_registry
from torchloom.plugins.pipelines import load_pipeline
from torchloom.runtime.cache import KernelCache
from torchloom.runtime.executor import CompiledGraph, build_function, library_calls
from torchloom.runtime.tiered import Tiered, TieredCall, first_calls_policy

# two groups; the first lays its output out column-major (as a kernel may), the second
# reads it and a transposed input
GRAPH = """\
graph @g(%x: f32[4, 8], %y: f32[4, 8]) {
  %a = torchloom.fusion_group(%x, %y) : f32[4, 8] strided[1, 4] region @g_a(%x0: f32[4, 8], %y0: f32[4, 8]) {
    %s = aten.add.Tensor(%x0, %y0) : f32[4, 8] strided[1, 4]
    return %s
  }
  %b = torchloom.fusion_group(%a) : f32[4, 8] region @g_b(%a0: f32[4, 8] strided[1, 4]) {
    %e = aten.exp.default(%a0) : f32[4, 8]
    %m = aten.mul.Tensor(%e) {other = 0.5} : f32[4, 8]
    return %m
  }
  return %a, %b
}
"""


def reference(x, y):
    a = x + y
    return a, (a.exp() * 0.5)


class Native:
    """The "built" kernel: the region op by op, outputs laid out as their types; counts."""

    inplace = frozenset()
    exact_layouts = True

    def __init__(self, region, registry):
        self.fn = build_function(region, registry).fn
        self.strides = [v.type.strides for v in region.outputs]  # (None: contiguous)
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        return tuple(_laid_out(r, s) for r, s in zip(self.fn(*args), self.strides))

    def into(self, outs, *args):
        return self(*args)


def _laid_out(r, strides):
    """``r`` laid out as a type's strides: contiguous (None), static, or ``[1, s0]``."""
    if strides is None:
        return r.contiguous()
    if all(isinstance(d, int) for d in strides):
        return laid_out_as(r, strides)
    return r.t().contiguous().t() if strides[0] == 1 else r.contiguous()


class Pending:
    """What ``load`` hands back while the build runs: ``ready()`` follows ``built``;
    ``resolve`` waits for it (or raises ``error``)."""

    inplace = frozenset()
    exact_layouts = True

    def __init__(self, native, built: threading.Event, error: Exception | None):
        self.native, self.built, self.error, self.resolved = native, built, error, 0

    def ready(self):
        return self.built.is_set()

    def resolve(self):
        self.resolved += 1
        self.built.wait(5)
        if self.error is not None:
            raise self.error
        return self.native

    def __call__(self, *args):
        return self.resolve()(*args)

    def into(self, outs, *args):
        return self.resolve().into(outs, *args)


class Background:
    """A codegen whose kernels build "in the background" until ``built`` is set."""

    name, version = "background", "1"

    def __init__(self, error: Exception | None = None):
        self.built = threading.Event()
        self.error = error
        self.natives: list[Native] = []
        self.pending: list[Pending] = []

    def supports(self, group, registry):
        return None

    def generate(self, group, registry):
        return KernelSource(self.name, print_graph(group.region))

    def load(self, kernel, registry):
        native = Native(parse_graph(kernel.source), registry)
        self.natives.append(native)
        self.pending.append(Pending(native, self.built, self.error))
        return self.pending[-1]


def compiled(cg, first_calls):
    registry = default_registry()
    return CompiledGraph(parse_graph(GRAPH), registry, [cg, EagerCodegen()], KernelCache(),
                         first_calls=first_calls)


def inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)


def check(got, x, y):
    want = reference(x, y)
    for g_, w in zip(got, want):
        torch.testing.assert_close(g_, w, rtol=0, atol=0)
    assert got[0].stride() == (1, 4)  # the kernel's layout, on either path


def test_wait_makes_the_plan_then_the_first_call_waits():
    cg = Background()
    c = compiled(cg, "wait")
    assert len(c.tiered) == 2 and all(p.resolved == 0 for p in cg.pending)  # not waited yet
    cg.built.set()
    x, y = inputs()
    check(c(x, y), x, y)
    assert [n.calls for n in cg.natives] == [1, 1]
    check(c(x, y), x, y)
    assert [n.calls for n in cg.natives] == [2, 2]
    assert all(p.resolved == 1 for p in cg.pending)  # resolved once, then called directly


def test_eager_runs_groups_op_by_op_until_the_build_ends():
    cg = Background()
    c = compiled(cg, "eager")
    x, y = inputs()
    for _ in range(2):
        check(c(x, y), x, y)
    assert [n.calls for n in cg.natives] == [0, 0]
    assert all(p.resolved == 0 for p in cg.pending)
    cg.built.set()
    check(c(x, y), x, y)
    assert [n.calls for n in cg.natives] == [1, 1]
    assert [c_.codegen for c_ in c.choices] == ["background", "background"]


def test_a_failed_build_leaves_the_group_op_by_op_and_says_so_once(caplog):
    cg = Background(RuntimeError("the compiler crashed"))
    c = compiled(cg, "eager")
    x, y = inputs()
    check(c(x, y), x, y)  # op by op: the build has not ended
    cg.built.set()  # ... and now it has, having failed
    with caplog.at_level(logging.WARNING, logger="torchloom"):
        for _ in range(3):
            check(c(x, y), x, y)
    assert [n.calls for n in cg.natives] == [0, 0]
    assert all(p.resolved == 1 for p in cg.pending)  # asked once, never again
    assert [c_.codegen for c_ in c.choices] == ["eager", "eager"]
    assert all("the compiler crashed" in str(c_.fallback_reasons[-1]) for c_ in c.choices)
    crashed = [r for r in caplog.records if "the compiler crashed" in r.getMessage()]
    assert len(crashed) == 1  # one distinct error, logged once


def test_the_op_by_op_path_writes_given_buffers_and_lays_out_the_others():
    registry = default_registry()
    region = next(iter(parse_graph(GRAPH).nodes)).region
    tiered = Tiered(Pending(None, threading.Event(), None),
                    lambda: build_function(region, registry).fn, ((1, 4),), wait=False,
                    on_failure=pytest.fail)
    x, y = inputs()
    buffer = torch.empty_strided((4, 8), (1, 4))
    (out,) = tiered.into((buffer,), x, y)
    assert out is buffer and torch.equal(out, x + y)
    (out,) = tiered.into((torch.empty(4, 8),), x, y)  # laid out otherwise: not used
    assert out.stride() == (1, 4) and torch.equal(out, x + y)
    xt = x.t().contiguous().t()  # the buffer given is an input read at the same elements
    (out,) = tiered.into((xt,), xt, y)
    assert out is xt and torch.equal(out, x + y)
    (out,) = tiered(x, y)
    assert out.untyped_storage().data_ptr() not in (
        x.untyped_storage().data_ptr(), y.untyped_storage().data_ptr())


def test_a_result_viewing_a_buffer_written_before_it_keeps_its_values():
    """Two outputs: the first written into the buffer of input x (an in-place pair), the
    second a view of x: writing the first must not change the second."""
    text = """\
graph @w(%x: f32[4, 8], %y: f32[4, 8]) {
  %a, %b = torchloom.fusion_group(%x, %y) : f32[4, 8], f32[8, 4] strided[1, 8] region @w_a(%x0: f32[4, 8], %y0: f32[4, 8]) {
    %s = aten.add.Tensor(%x0, %y0) : f32[4, 8]
    %t = aten.t.default(%x0) : f32[8, 4] strided[1, 8]
    return %s, %t
  }
  return %a, %b
}
"""
    registry = default_registry()
    region = next(iter(parse_graph(text).nodes)).region
    tiered = Tiered(Pending(None, threading.Event(), None),
                    lambda: build_function(region, registry).fn, ((8, 1), (1, 8)),
                    wait=False, on_failure=pytest.fail)
    x, y = inputs()
    want = (x + y, x.t().clone())
    a, b = tiered.into((x, None), x, y)
    assert a is x and torch.equal(a, want[0]) and torch.equal(b, want[1])


def test_an_output_that_is_an_input_is_copied_never_handed_back():
    """The plan may write into a kernel output's buffer later: the op by op path must not
    return a tensor it does not own (a view of an input)."""
    text = """\
graph @v(%x: f32[4, 8]) {
  %a = torchloom.fusion_group(%x) : f32[8, 4] strided[1, 8] region @v_a(%x0: f32[4, 8]) {
    %t = aten.t.default(%x0) : f32[8, 4] strided[1, 8]
    return %t
  }
  return %a
}
"""
    registry = default_registry()
    region = next(iter(parse_graph(text).nodes)).region
    tiered = Tiered(Pending(None, threading.Event(), None),
                    lambda: build_function(region, registry).fn, ((1, 8),), wait=False,
                    on_failure=pytest.fail)
    x = torch.randn(4, 8)
    (out,) = tiered(x)
    assert torch.equal(out, x.t()) and out.stride() == (1, 8)
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_groups_of_symbolic_sizes_are_resolved_when_the_plan_is_made():
    text = print_graph(parse_graph(GRAPH)).replace("f32[4, 8] strided[1, 4]", "f32[s0, 8] strided[1, s0]") \
        .replace("f32[4, 8]", "f32[s0, 8]")
    cg = Background()
    cg.built.set()
    registry = default_registry()
    c = CompiledGraph(parse_graph(text), registry, [cg, EagerCodegen()], KernelCache(),
                      first_calls="eager")
    assert c.tiered == [] and all(p.resolved == 1 for p in cg.pending)
    x, y = inputs()
    check(c(x, y), x, y)
    assert [n.calls for n in cg.natives] == [1, 1]


class Offers:
    """A codegen offering a library function for ``exp`` outside groups."""

    name, version = "offers", "1"

    def __init__(self):
        self.built = threading.Event()
        self.calls = 0

    def library_call(self, node, registry):
        if node.op != "aten.exp.default":
            return None
        offers = self

        class Fn:
            def ready(self):
                return offers.built.is_set()

            def __call__(self, x):
                offers.calls += 1
                return torch.exp(x)
        return Fn()


def test_a_library_function_still_building_runs_the_op_under_eager():
    graph = parse_graph("""\
graph @l(%x: f32[4]) {
  %e = aten.exp.default(%x) : f32[4]
  return %e
}
""")
    node = next(iter(graph.nodes))
    registry = default_registry()
    cg = Offers()
    call = library_calls(None, [cg], registry, "eager")(node)
    assert isinstance(call, TieredCall)
    x = torch.randn(4)
    assert torch.equal(call(x), x.exp()) and cg.calls == 0
    cg.built.set()
    assert torch.equal(call(x), x.exp()) and cg.calls == 1
    # under "wait" (and once built) the function itself is the call
    assert not isinstance(library_calls(None, [cg], registry, "wait")(node), TieredCall)
    assert not isinstance(library_calls(None, [cg], registry, "eager")(node), TieredCall)


def test_the_policy_is_checked_where_it_is_set(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHLOOM_FIRST_CALLS", raising=False)
    assert first_calls_policy(None) == "wait"
    assert first_calls_policy("eager") == "eager"
    monkeypatch.setenv("TORCHLOOM_FIRST_CALLS", "eager")
    assert first_calls_policy("wait") == "eager"
    monkeypatch.setenv("TORCHLOOM_FIRST_CALLS", "later")
    with pytest.raises(ValueError, match="TORCHLOOM_FIRST_CALLS is 'later'"):
        first_calls_policy("wait")
    path = tmp_path / "p.toml"
    path.write_text('[pipeline]\nname = "p"\n\n[runtime]\nfirst_calls = "soon"\n')
    with pytest.raises(PipelineError, match=r"p\.toml:5: first_calls = 'soon' must be one of "
                                            r"wait, eager"):
        load_pipeline(path)


def test_the_policy_is_read_from_a_pipeline_and_the_ones_extending_it(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHLOOM_FIRST_CALLS", raising=False)
    base = tmp_path / "base.toml"
    base.write_text('[pipeline]\nname = "base"\n\n[runtime]\nfirst_calls = "eager"\n')
    child = tmp_path / "child.toml"
    child.write_text(f'[pipeline]\nname = "child"\nextends = "{base}"\n')
    assert load_pipeline(base).pipeline.first_calls == "eager"
    assert load_pipeline(child).pipeline.first_calls == "eager"  # inherited
    child.write_text(f'[pipeline]\nname = "child"\nextends = "{base}"\n\n'
                     f'[runtime]\nfirst_calls = "wait"\n')
    assert load_pipeline(child).pipeline.first_calls == "wait"  # overridden
    assert load_pipeline("default").pipeline.first_calls == "wait"
