"""The plan's buffer reuse (codegen/buffers.py): kernel outputs written into buffers that
died before them, in place where the kernel allows it, never into a buffer someone else
may still read; and boxed plans that free their inputs after the last use."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchloom.codegen.buffers import MIN_BYTES
from torchloom.codegen.plan import build_function
from torchloom.ir import parse_graph
from torchloom.ir.graph import FUSION_GROUP, Graph
from torchloom.ir.types import TensorType
from torchloom.ops.aten import default_registry

N = 256  # f32[256, 256] is 256 KB: just large enough to be reused
T = TensorType((N, N), "f32")
assert T.nbytes() >= MIN_BYTES


@pytest.fixture(scope="module")
def registry():
    return default_registry()


class CopyingKernel:
    """A kernel with the ``into`` protocol: runs the group with torch, then copies each
    result into the buffer given for it (so any in-place pair is safe for it)."""

    def __init__(self, region: Graph, registry, inplace=()):
        self.fn = build_function(region, registry).fn
        self.inplace = frozenset(inplace)
        self.given: list[tuple] = []  # the buffers each call was given
        self.returned: list[tuple] = []

    def __call__(self, *args):
        out = self.fn(*args)
        self.returned.append(out)
        return out

    def into(self, outs, *args):
        self.given.append(outs)
        results = self.fn(*args)
        out = tuple(r if o is None else o.copy_(r) for o, r in zip(outs, results))
        self.returned.append(out)
        return out


def kernels_for(registry, inplace=(), store=None):
    store = store if store is not None else {}

    def kernel_for(node):
        store[node.region.name] = CopyingKernel(node.region, registry, inplace)
        return store[node.region.name]
    return kernel_for, store


def chain(ops: list[str]) -> str:
    """x -> one group per op, each reading the previous group's output."""
    lines, prev = [f"graph @g(%x: f32[{N}, {N}]) {{"], "x"
    for i, op in enumerate(ops):
        lines += [f"  %v{i} = torchloom.fusion_group(%{prev}) : f32[{N}, {N}] "
                  f"region @k{i}(%in0: f32[{N}, {N}]) {{",
                  f"    %t0 = aten.{op}.default(%in0) : f32[{N}, {N}]",
                  "    return %t0", "  }"]
        prev = f"v{i}"
    return "\n".join(lines + [f"  return %{prev}", "}"])


def test_dead_buffer_is_written_by_a_later_group(registry):
    # v0 dies at k1 (its reader): k2's output goes into v0's buffer, not a fresh one
    g = parse_graph(chain(["exp", "neg", "sin"]))
    kernel_for, k = kernels_for(registry)
    plan = build_function(g, registry, kernel_for)
    assert plan.reuse.count == 1
    x = torch.randn(N, N)
    (out,) = plan.fn(x)
    torch.testing.assert_close(out, x.exp().neg().sin())
    assert out.data_ptr() == k["k0"].returned[-1][0].data_ptr()  # the same memory
    assert k["k2"].given[-1][0] is k["k0"].returned[-1][0]


def test_in_place_only_where_the_kernel_allows_it(registry):
    g = parse_graph(chain(["exp", "neg", "sin"]))
    kernel_for, k = kernels_for(registry, inplace={(0, 0)})
    plan = build_function(g, registry, kernel_for)
    assert plan.reuse.count == 2  # k1 writes v0 in place, k2 writes v1 in place
    x = torch.randn(N, N)
    (out,) = plan.fn(x)
    torch.testing.assert_close(out, x.exp().neg().sin())
    assert k["k1"].given[-1][0] is k["k0"].returned[-1][0]
    assert out.data_ptr() == k["k0"].returned[-1][0].data_ptr()
    assert out.data_ptr() != x.data_ptr()  # the input is the user's, never written


def test_no_reuse_of_small_buffers_inputs_outputs_or_viewed_storage(registry):
    small = parse_graph(chain(["exp", "neg", "sin"]).replace(f"{N}, {N}", "4, 4"))
    assert build_function(small, registry, kernels_for(registry, {(0, 0)})[0]).reuse.count == 0
    # v0 is returned: nothing may write it, whatever dies
    g = parse_graph(chain(["exp", "neg", "sin"]).replace("return %v2", "return %v2, %v0"))
    assert build_function(g, registry, kernels_for(registry, {(0, 0)})[0]).reuse.count == 1
    plan = build_function(g, registry, kernels_for(registry, {(0, 0)})[0])
    assert all(d.name != "v0" for ds in plan.reuse.into.values() for d in ds if d)
    # v0 is read through a view by the last group: its storage lives until then
    viewed = parse_graph(f"""\
graph @g(%x: f32[{N}, {N}]) {{
  %v0 = torchloom.fusion_group(%x) : f32[{N}, {N}] region @k0(%in0: f32[{N}, {N}]) {{
    %t0 = aten.exp.default(%in0) : f32[{N}, {N}]
    return %t0
  }}
  %w = aten.t.default(%v0) : f32[{N}, {N}] strided[1, {N}]
  %v1 = torchloom.fusion_group(%x) : f32[{N}, {N}] region @k1(%in0: f32[{N}, {N}]) {{
    %t0 = aten.neg.default(%in0) : f32[{N}, {N}]
    return %t0
  }}
  %v2 = torchloom.fusion_group(%v1, %w) : f32[{N}, {N}] region @k2(%in0: f32[{N}, {N}], %in1: f32[{N}, {N}] strided[1, {N}]) {{
    %t0 = aten.add.Tensor(%in0, %in1) : f32[{N}, {N}]
    return %t0
  }}
  return %v2
}}""")
    kernel_for, k = kernels_for(registry)
    plan = build_function(viewed, registry, kernel_for)
    assert plan.reuse.count == 0  # v0 (via %w) and v1 both die at k2: nothing died before
    x = torch.randn(N, N)
    torch.testing.assert_close(plan.fn(x)[0], x.neg() + x.exp().t())


def _viewed_then_read(view: str, view_type: str, reads: str = "%w") -> str:
    """k0 -> a view of its output -> k1 (exp) reading it, the view's shape out."""
    count = reads.count("%")
    params = ", ".join(f"%in{i}: {t}" for i, t in enumerate(
        [view_type, f"f32[{N}, {N}]"][:count]))
    shape = view_type.split(" strided")[0]
    return f"""\
graph @g(%x: f32[{N}, {N}]) {{
  %v0 = torchloom.fusion_group(%x) : f32[{N}, {N}] region @k0(%in0: f32[{N}, {N}]) {{
    %t0 = aten.neg.default(%in0) : f32[{N}, {N}]
    return %t0
  }}
  %w = {view} : {view_type}
  %v1 = torchloom.fusion_group({reads}) : {shape} region @k1({params}) {{
    %t0 = aten.exp.default(%in0) : {shape}
    return %t0
  }}
  return %v1
}}"""


@pytest.mark.parametrize("view, view_type, reads, in_place", [
    # all of v0, each element in its place: written over v0 (the LM head's bias add)
    ("aten.view.default(%v0) {size = [1, 256, 256]}", f"f32[1, {N}, {N}]", "%w", True),
    ("aten.view.default(%v0) {size = [128, 512]}", "f32[128, 512]", "%w", True),
    # transposed: element k elsewhere; a slice: part of v0 only
    ("aten.t.default(%v0)", f"f32[{N}, {N}] strided[1, {N}]", "%w", False),
    ("aten.slice.Tensor(%v0) {dim = 0, start = 0, end = 128}", f"f32[128, {N}]", "%w", False),
    # the kernel reads v0 beside the view: two inputs of one storage
    ("aten.view.default(%v0) {size = [1, 256, 256]}", f"f32[1, {N}, {N}]", "%w, %v0", False),
])
def test_in_place_through_a_view_of_all_of_a_buffer(registry, view, view_type, reads,
                                                     in_place):
    g = parse_graph(_viewed_then_read(view, view_type, reads))
    kernel_for, k = kernels_for(registry, inplace={(0, 0)})
    plan = build_function(g, registry, kernel_for)
    assert plan.reuse.count == (1 if in_place else 0)
    x = torch.randn(N, N)
    (out,) = plan.fn(x)
    fresh = build_function(g, registry).fn(x)[0]
    torch.testing.assert_close(out, fresh, atol=0, rtol=0)
    assert (out.data_ptr() == k["k0"].returned[-1][0].data_ptr()) == in_place


def test_donated_input_is_reused_and_others_are_not(registry):
    g = parse_graph(f"""\
graph @g(%x: f32[{N}, {N}], %s: f32[{N}, {N}]) {{
  %v0 = torchloom.fusion_group(%s, %x) : f32[{N}, {N}] region @k0(%in0: f32[{N}, {N}], %in1: f32[{N}, {N}]) {{
    %t0 = aten.mul.Tensor(%in0, %in1) : f32[{N}, {N}]
    return %t0
  }}
  %v1 = torchloom.fusion_group(%v0) : f32[{N}, {N}] region @k1(%in0: f32[{N}, {N}]) {{
    %t0 = aten.exp.default(%in0) : f32[{N}, {N}]
    return %t0
  }}
  return %v1
}}""")
    for donated in ((), (0,), (1,)):
        kernel_for, k = kernels_for(registry)
        plan = build_function(g, registry, kernel_for, donated=donated)
        assert plan.reuse.count == len(donated)
        inputs = [torch.randn(N, N), torch.randn(N, N)]
        keep = [x.clone() for x in inputs]
        (out,) = plan.fn(*inputs)
        torch.testing.assert_close(out, (keep[0] * keep[1]).exp())
        for i, x in enumerate(inputs):  # only the donated input's memory is written
            assert (out.data_ptr() == x.data_ptr()) == (i in donated)
            if i not in donated:
                torch.testing.assert_close(x, keep[i])


def test_dense_buffer_of_another_shape_is_given_viewed_in_the_output_shape(registry):
    """Dense buffers of one dtype and element count are interchangeable (issue 41: a
    cross entropy's ``f32[1, N, C]`` gradient over the saved ``f32[N, C]``
    log-probabilities): the writer gets the dead buffer viewed in its output's shape,
    in place (k1 over the donated %s) and dead before it (the mm over k0's %v0)."""
    g = parse_graph(f"""\
graph @g(%x: f32[{N}, {N}], %s: f32[{N}, {N}]) {{
  %v0 = torchloom.fusion_group(%x) : f32[1, {N}, {N}] region @k0(%in0: f32[{N}, {N}]) {{
    %t0 = aten.exp.default(%in0) : f32[{N}, {N}]
    %t1 = aten.view.default(%t0) {{size = [1, {N}, {N}]}} : f32[1, {N}, {N}]
    return %t1
  }}
  %v1 = torchloom.fusion_group(%s, %v0) : f32[1, {N}, {N}] region @k1(%in0: f32[{N}, {N}], %in1: f32[1, {N}, {N}]) {{
    %t0 = aten.view.default(%in0) {{size = [1, {N}, {N}]}} : f32[1, {N}, {N}]
    %t1 = aten.add.Tensor(%t0, %in1) : f32[1, {N}, {N}]
    return %t1
  }}
  %w = aten.view.default(%v1) {{size = [{N}, {N}]}} : f32[{N}, {N}]
  %m = aten.mm.default(%w, %x) : f32[{N}, {N}]
  return %m
}}""")
    kernel_for, k = kernels_for(registry, inplace={(0, 0)})
    plan = build_function(g, registry, kernel_for, donated=(1,))
    assert plan.reuse.count == 2
    x, s = torch.randn(N, N) / 16, torch.randn(N, N)
    keep = s.clone()
    (m,) = plan.fn(x, s)
    torch.testing.assert_close(m, (keep + x.exp()) @ x)
    given = k["k1"].given[-1][0]
    assert given.shape == (1, N, N) and given.data_ptr() == s.data_ptr()  # s, viewed
    assert m.shape == (N, N) and m.data_ptr() == k["k0"].returned[-1][0].data_ptr()


def test_an_aten_op_writes_into_a_buffer_dead_before_it(registry):
    # mm(v0, x) -> m; mm(m, x) -> n: n may take v0's buffer (dead since the first mm) but
    # never m's (the second mm reads it while writing)
    g = parse_graph(f"""\
graph @g(%x: f32[{N}, {N}]) {{
  %v0 = torchloom.fusion_group(%x) : f32[{N}, {N}] region @k0(%in0: f32[{N}, {N}]) {{
    %t0 = aten.exp.default(%in0) : f32[{N}, {N}]
    return %t0
  }}
  %m = aten.mm.default(%v0, %x) : f32[{N}, {N}]
  %n = aten.mm.default(%m, %x) : f32[{N}, {N}]
  return %n
}}""")
    kernel_for, k = kernels_for(registry)
    plan = build_function(g, registry, kernel_for)
    assert plan.reuse.count == 1 and [d.name for d in plan.reuse.into[2]] == ["v0"]
    assert "t0 = f2(t1, a0, out=t0)" in plan.source  # the second mm: torch.ops.aten.mm.out
    x = torch.randn(N, N) / 16
    (n,) = plan.fn(x)
    torch.testing.assert_close(n, x.exp() @ x @ x)
    assert n.data_ptr() == k["k0"].returned[-1][0].data_ptr()
    # autograd recording the call (an input requiring grad): the op allocates, as out=
    # overloads refuse to be recorded
    x.requires_grad_()
    (n,) = plan.fn(x)
    assert n.grad_fn is not None and n.data_ptr() != k["k0"].returned[-1][0].data_ptr()
    torch.testing.assert_close(n, x.exp() @ x @ x)


def test_boxed_plan_frees_an_input_after_its_last_use(registry):
    g = parse_graph(chain(["exp", "neg"]))
    seen = []

    def kernel_for(node):
        kernel = CopyingKernel(node.region, registry)
        if node.region.name == "k1":  # k1 runs after k0, the last reader of %x
            def check(*args):
                gc.collect()
                seen.append(probe() is None)
                return kernel(*args)
            return check
        return kernel
    plan = build_function(g, registry, kernel_for, boxed=True)
    x = torch.randn(N, N)
    probe = weakref.ref(x)
    args = [x]
    del x
    (out,) = plan.boxed(args)
    assert args == [] and seen == [True]
    # the unboxed entry runs the same body; its caller keeps the input
    x = torch.randn(N, N)
    torch.testing.assert_close(plan.fn(x)[0], x.exp().neg())


def test_an_op_is_not_given_a_buffer_laid_out_otherwise_than_its_type(registry):
    """A kernel that does not promise exact layouts may return an output laid out otherwise
    than its type says (this fake kernel runs ``exp`` over a transposed input with torch and
    returns it transposed, typed dense). An ``mm`` given that dead buffer as ``out=`` would
    take its layout, while the plan's view fold trusts an ``mm``'s result to be dense (its
    transpose is a restride of its storage): the op allocates instead, and the result is
    eager's (found by hypothesis in the random programs below: 99.6% of elements wrong)."""
    g = parse_graph(f"""graph @g(%x0: f32[{N}, {N}], %x1: f32[{N}, {N}]) {{
  %t = aten.t.default(%x1) : f32[{N}, {N}] strided[1, {N}]
  %e = torchloom.fusion_group(%t) : f32[{N}, {N}] region @k1(%in0: f32[{N}, {N}] strided[1, {N}]) {{
    %y = aten.exp.default(%in0) : f32[{N}, {N}]
    return %y
  }}
  %s = aten.sum.default(%e) : f32[]
  %m = aten.mm.default(%x0, %x0) : f32[{N}, {N}]
  %tm = aten.t.default(%m) : f32[{N}, {N}] strided[1, {N}]
  return %tm, %s
}}""")
    kernel_for, _ = kernels_for(registry)
    plan = build_function(g, registry, kernel_for)
    # mm is offered e's buffer (the plan's lowered copy holds values of the same names)
    assert [v.name for v in plan.reuse.held] == ["e"] and "out=" in plan.source
    x0, x1 = torch.randn(N, N) / 16, torch.randn(N, N)
    tm, s = plan.fn(x0, x1)
    torch.testing.assert_close(tm, (x0 @ x0).t())
    torch.testing.assert_close(s, x1.t().exp().sum())


def test_a_kernel_is_not_given_a_view_of_a_buffer_laid_out_otherwise(registry):
    """The same buffer offered to a kernel whose output has another shape (of the same
    element count) is viewed in that shape only where it is dense: ``.view`` of the
    transposed tensor would raise. The kernel allocates instead (``buffers.given``)."""
    g = parse_graph(f"""graph @g(%x1: f32[{N}, {N}]) {{
  %t = aten.t.default(%x1) : f32[{N}, {N}] strided[1, {N}]
  %e = torchloom.fusion_group(%t) : f32[{N}, {N}] region @k1(%in0: f32[{N}, {N}] strided[1, {N}]) {{
    %y = aten.exp.default(%in0) : f32[{N}, {N}]
    return %y
  }}
  %s = aten.sum.default(%e) : f32[]
  %f = torchloom.fusion_group(%x1) : f32[{N * N}] region @k2(%in0: f32[{N}, {N}]) {{
    %v = aten.view.default(%in0) {{size = [{N * N}]}} : f32[{N * N}]
    %z = aten.neg.default(%v) : f32[{N * N}]
    return %z
  }}
  return %f, %s
}}""")
    kernel_for, k = kernels_for(registry)
    plan = build_function(g, registry, kernel_for)
    assert "_given(" in plan.source  # k2 is offered e's buffer viewed in its shape
    x1 = torch.randn(N, N)
    f, s = plan.fn(x1)
    torch.testing.assert_close(f, -x1.reshape(-1))
    assert k["k2"].given == [(None,)]


UNARY = ("exp", "neg", "sin", "abs")
BINARY = ("add.Tensor", "mul.Tensor", "sub.Tensor")


@st.composite
def programs(draw):
    """Random group DAGs over f32[N, N] values: inputs (some donated), groups of one
    op reading earlier values (directly or through a transpose), random outputs."""
    g = Graph("g")
    n_inputs = draw(st.integers(1, 3))
    values = [g.add_input(T, f"x{i}") for i in range(n_inputs)]
    for i in range(draw(st.integers(1, 7))):
        if draw(st.integers(0, 4)) == 0:  # a matmul (an aten op with an out= overload)
            ins = [draw(st.sampled_from(values)) for _ in range(2)]
            values.append(g.create("aten.mm.default", ins, [T]).outputs[0])
            continue
        if draw(st.booleans()) and draw(st.booleans()):  # a transposed view of a value
            src = draw(st.sampled_from(values))
            if src.type.strides is None:
                values.append(g.create("aten.t.default", [src],
                                       [TensorType((N, N), "f32", strides=(1, N))]).outputs[0])
                continue
        binary = draw(st.booleans())
        ins = [draw(st.sampled_from(values)) for _ in range(2 if binary else 1)]
        region = Graph(f"k{i}")
        params = [region.add_input(v.type, f"in{j}") for j, v in enumerate(ins)]
        op = f"aten.{draw(st.sampled_from(BINARY))}" if binary else \
            f"aten.{draw(st.sampled_from(UNARY))}.default"
        region.set_outputs(region.create(op, params, [T]).outputs)
        values.append(g.create(FUSION_GROUP, ins, [T], region=region).outputs[0])
    outs = draw(st.lists(st.sampled_from(values[n_inputs:] or values), min_size=1, max_size=3))
    g.set_outputs(outs)
    donated = draw(st.sets(st.integers(0, n_inputs - 1)))
    inplace = draw(st.sampled_from([(), {(0, 0)}, {(0, 0), (1, 0)}]))
    return g, sorted(donated), inplace


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2**16))
def test_random_programs_with_reuse_match_without(registry, program, seed):
    g, donated, inplace = program
    torch.manual_seed(seed)
    inputs = [torch.randn(N, N) / 16 for _ in g.inputs]  # matmuls keep values near 1
    expected = build_function(g, registry).fn(*[x.clone() for x in inputs])
    kernel_for, _ = kernels_for(registry, inplace)
    plan = build_function(g, registry, kernel_for, boxed=True, donated=donated)
    keep = [x.clone() for x in inputs]
    ptrs = {x.data_ptr(): i for i, x in enumerate(inputs)}
    got = plan.boxed(list(inputs))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, equal_nan=True)
    for i, (x, k) in enumerate(zip(inputs, keep)):
        if i not in donated:  # an input the caller keeps is never written
            torch.testing.assert_close(x, k, equal_nan=True)
    computed = [j for j, v in enumerate(g.outputs) if v.producer is not None and
                v.producer.op in (FUSION_GROUP, "aten.mm.default")]
    for j in computed:  # a group's output never lands in memory the caller keeps...
        assert ptrs.get(got[j].data_ptr()) in (None, *donated)
        for k in computed[:computed.index(j)]:  # ...nor in another output's
            assert got[j].data_ptr() != got[k].data_ptr() or g.outputs[j] is g.outputs[k]


def test_random_ops_never_take_a_dead_buffer(registry):
    """A random op keeps its allocating call (its random stream exactly eager's); a
    deterministic op with an ``out=`` overload of the same arguments gets one."""
    from torchloom.codegen.buffers import out_variant
    graph = parse_graph(f"""graph @g(%x: f32[{N}, {N}]) {{
  %r = aten.bernoulli.default(%x) : f32[{N}, {N}]
  %e = aten.exp.default(%x) : f32[{N}, {N}]
  return %r, %e
}}
""")
    bernoulli, exp = graph.nodes
    assert registry.lookup(bernoulli.op).category == "random"
    assert out_variant(bernoulli, registry) is None
    assert out_variant(exp, registry) is not None
