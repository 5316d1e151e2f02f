"""Graph inputs written in place of ``copy_`` (codegen/buffers.py ``written_inputs``): a
mutated input kept in the graph (an optimizer step's parameters and states) is written by
the kernel computing its new value, and the copy goes, only where that is the same
program: nothing reads the input after the kernel, the kernel reads it only where it allows
writing over it, the value has no other reader, and dtype, shape and layout agree."""

from __future__ import annotations

import pytest
import torch

from torchloom.codegen.plan import build_function
from torchloom.ir import parse_graph
from torchloom.ir.graph import Graph
from torchloom.ops.aten import default_registry


@pytest.fixture(scope="module")
def registry():
    return default_registry()


class Kernel:
    """``into`` protocol kernel running its region with torch, writing given buffers."""

    def __init__(self, region: Graph, registry, inplace, fresh: bool = False):
        self.fn = build_function(region, registry).fn
        self.inplace = frozenset(inplace)
        self.fresh = fresh  # ignore the given buffers (as a kernel does for a bad layout)
        self.given: list[tuple] = []

    def __call__(self, *args):
        return self.fn(*args)

    def into(self, outs, *args):
        self.given.append(outs)
        results = self.fn(*args)  # every input read before any output is written
        if self.fresh:
            return results
        return tuple(r if o is None else o.copy_(r) for o, r in zip(outs, results))


def plan_of(text: str, registry, inplace=((0, 0),), fresh=False):
    kernels: dict[str, Kernel] = {}

    def kernel_for(node):
        kernels[node.region.name] = Kernel(node.region, registry, inplace, fresh)
        return kernels[node.region.name]
    return build_function(parse_graph(text), registry, kernel_for), kernels


def step(shape="64, 8", extra="", out="", last="", result=""):
    """p <- p - 0.1 * g, as aot_autograd keeps an input mutation: a group, then copy_.
    ``last``: a region line making ``%t2`` (of type ``result``) from ``%t1``, the group's
    result then; ``extra``: lines between the group and the copy."""
    t = f"f32[{shape}]"
    result = result or t
    tail = f"    {last}\n    return %t2" if last else "    return %t1"
    return f"""\
graph @g(%p: {t}, %g: {t}) {{
  %s = torchloom.fusion_group(%p, %g) : {result} region @k0(%in0: {t}, %in1: {t}) {{
    %t0 = aten.mul.Tensor(%in1) {{other = 0.1}} : {t}
    %t1 = aten.sub.Tensor(%in0, %t0) : {t}
{tail}
  }}
{extra}  %c = aten.copy_.default(%p, %s) : {t}
  return {out}
}}"""


@pytest.mark.parametrize("shape", ["64, 8", "3", "1, 5, 1"])
def test_the_kernel_writes_the_input_and_the_copy_goes(registry, shape):
    plan, k = plan_of(step(shape, out=""), registry)
    assert len(plan.reuse.elided) == 1 and "copy_" not in plan.source
    dims = tuple(int(d) for d in shape.split(", "))
    p, g = torch.randn(dims), torch.randn(dims)
    want = p - 0.1 * g
    before = p.data_ptr()
    assert plan.fn(p, g) == ()
    torch.testing.assert_close(p, want, rtol=0, atol=0)
    assert p.data_ptr() == before and k["k0"].given[-1][0] is p


def test_a_kernel_that_wrote_elsewhere_still_updates_the_input(registry):
    plan, _ = plan_of(step(out=""), registry, fresh=True)
    assert len(plan.reuse.elided) == 1
    p, g = torch.randn(64, 8), torch.randn(64, 8)
    want = p - 0.1 * g
    plan.fn(p, g)
    torch.testing.assert_close(p, want, rtol=0, atol=0)


@pytest.mark.parametrize("case", ["read_after", "value_returned", "copy_returned",
                                  "no_inplace_pair", "other_dtype", "broadcast"])
def test_the_copy_stays_where_eliding_it_would_change_the_program(registry, case):
    text, inplace, dims = step(out=""), ((0, 0),), (64, 8)
    if case == "read_after":  # the old values are read after the kernel
        text = step(extra="  %r = aten.neg.default(%p) : f32[64, 8]\n", out="%r")
    elif case == "value_returned":
        text = step(out="%s")
    elif case == "copy_returned":
        text = step(out="%c")
    elif case == "no_inplace_pair":  # the kernel reads p but may not write over it
        inplace = ()
    elif case == "other_dtype":  # copy_ converts f64 to the input's f32
        text = step(last="%t2 = aten._to_copy.default(%t1) {dtype = #f64} : f64[64, 8]",
                    result="f64[64, 8]")
    elif case == "broadcast":  # copy_ of a row into every row of p
        text = step(last="%t2 = aten.sum.dim_IntList(%t1) {dim = [0]} : f32[8]",
                    result="f32[8]")
    plan, _ = plan_of(text, registry, inplace)
    assert not plan.reuse.elided
    p, g = torch.randn(dims), torch.randn(dims)
    p0 = p.clone()
    result = plan.fn(p, g)
    new = p0 - 0.1 * g
    if case == "broadcast":
        new = new.sum(0).expand(64, 8)
    torch.testing.assert_close(p, new.to(p.dtype), rtol=1e-6, atol=1e-6)
    if case == "read_after":
        torch.testing.assert_close(result[0], -p0)  # the values before the update
    elif case in ("value_returned", "copy_returned"):
        torch.testing.assert_close(result[0], new)


@pytest.mark.parametrize("grad", [False, True])
def test_compiled_functions_that_write_their_inputs(grad):
    """Through ``torch.compile``: inputs written in place (kept in the graph for inference,
    aot_autograd's epilogue with gradients), read before and after, as eager writes them."""
    from torchloom.backend import torchloom_backend

    def f(p, m, g, s):
        old = p * 1.5  # the old value read beside the update
        m.mul_(0.9).add_(g, alpha=0.1)
        p.sub_(m * 0.5)
        s.add_(1)
        return old + p, m.sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=torchloom_backend)
    for shape in [(300, 257), (7,), (2, 3, 5)]:
        gen = torch.Generator().manual_seed(len(shape))
        inputs = [torch.randn(shape, generator=gen) for _ in range(3)] + [torch.zeros(())]
        ours = [t.clone() for t in inputs]
        with torch.set_grad_enabled(grad):
            want = f(*inputs)
            got = compiled(*ours)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
        for a, b in zip(ours, inputs):
            torch.testing.assert_close(a, b)
