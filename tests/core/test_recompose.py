"""Decomposition provenance (ir/provenance.py) and running composites whole again where
their primitives run op by op (codegen/recompose.py, codegen/lowering.py)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchloom.codegen.base import KernelSource, RegionKernel
from torchloom.codegen.eager import EagerCodegen
from torchloom.ir import parse_graph, print_graph, structural_hash
from torchloom.ir.graph import Graph, InputRef
from torchloom.ir.provenance import find_instances, mark_decomposition
from torchloom.ir.types import TensorType
from torchloom.ops.aten import default_registry
from torchloom.runtime.executor import CompiledGraph, build_function

SOFTMAX = "aten._softmax.default"


@pytest.fixture(scope="module")
def registry():
    return default_registry()


class Calls(TorchDispatchMode):
    """The aten ops called while active (top-level calls only, not the ones inside)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def calls(fn, *args) -> tuple[list[str], tuple]:
    with Calls() as mode:
        out = fn(*args)
    return mode.ops, out


def softmax_primitives(g: Graph, x, name: str = "s"):
    """What fusion.decompose makes of ``_softmax(x, -1)``, marked as one instance."""
    t = x.type
    row = t.with_(shape=t.shape[:-1] + (1,))
    amax = g.create("aten.amax.default", [x], [row], {"dim": (-1,), "keepdim": True})
    sub = g.create("aten.sub.Tensor", [x, amax.output], [t])
    exp = g.create("aten.exp.default", [sub.output], [t])
    total = g.create("aten.sum.dim_IntList", [exp.output], [row], {"dim": (-1,), "keepdim": True})
    div = g.create("aten.div.Tensor", [exp.output, total.output], [t], names=[name])
    nodes = [amax, sub, exp, total, div]
    assert mark_decomposition(SOFTMAX, {"dim": -1, "half_to_float": False}, [x], nodes,
                              [div.output])
    return div.output


def softmax_graph(shape=(4, 8), chained: bool = False) -> Graph:
    g = Graph("g")
    x = g.add_input(TensorType(shape), "x")
    y = softmax_primitives(g, x)
    if chained:
        y = softmax_primitives(g, y, "s2")
    g.set_outputs([y])
    return g


def test_marked_text_prints_parses_back_and_hashes_alpha_stably(registry):
    g = softmax_graph()
    text = print_graph(g)
    assert 'composite = ["aten._softmax.default", [["dim", -1], ["half_to_float", false]], ' \
           '[-1], [4]]' in text
    again = parse_graph(text)
    assert print_graph(again) == text
    renamed = parse_graph(text.replace("%x", "%input").replace("%s", "%out"))
    assert structural_hash(renamed) == structural_hash(g)
    (inst,) = find_instances(again)
    assert inst.op == SOFTMAX and inst.inputs == (again.inputs[0],)
    assert inst.outputs == (again.outputs[0],) and len(inst.nodes) == 5


@pytest.mark.parametrize("chained", [False, True])
def test_complete_instance_runs_as_one_composite_call(registry, chained):
    g = softmax_graph(chained=chained)
    x = torch.randn(4, 8)
    ops, (got,) = calls(build_function(g, registry).fn, x)
    assert ops == ["aten._softmax.default"] * (2 if chained else 1)
    want = torch.softmax(x, -1)
    torch.testing.assert_close(got, torch.softmax(want, -1) if chained else want,
                               rtol=0, atol=0)
    prim_ops, (prim,) = calls(build_function(g, registry, recompose=False).fn, x)
    assert len(prim_ops) == (10 if chained else 5)
    torch.testing.assert_close(prim, got)


def edit_renamed_input(g: Graph) -> None:
    sub = next(n for n in g.nodes if n.op == "aten.sub.Tensor")
    sub.with_attrs(alpha=1)  # same values, but not the node decompose made


def edit_escape(g: Graph) -> None:
    exp = next(n for n in g.nodes if n.op == "aten.exp.default")
    g.set_outputs([*g.outputs, exp.output])  # an intermediate read from outside


def edit_drop(g: Graph) -> None:
    exp = next(n for n in g.nodes if n.op == "aten.exp.default")
    new = g.create("aten.exp.default", list(exp.inputs), [exp.output.type], before=exp)
    g.replace_all_uses(exp.output, new.output)  # a pass rebuilt one primitive unmarked
    g.erase(exp)


@pytest.mark.parametrize("edit", [edit_renamed_input, edit_escape, edit_drop])
def test_edited_instance_runs_as_primitives(registry, edit):
    g = softmax_graph()
    edit(g)
    assert find_instances(g) == []
    x = torch.randn(4, 8)
    ops, out = calls(build_function(g, registry).fn, x)
    assert SOFTMAX not in ops and len(ops) == 5
    torch.testing.assert_close(out[0], torch.softmax(x, -1))


def test_same_primitives_twice_on_one_input_run_as_primitives(registry):
    g = Graph("g")
    x = g.add_input(TensorType((4, 8)), "x")
    a = softmax_primitives(g, x, "a")
    b = softmax_primitives(g, x, "b")  # not merged by CSE: the instances cannot be told apart
    g.set_outputs([a, b])
    ops, (ga, gb) = calls(build_function(g, registry).fn, torch.ones(4, 8))
    assert SOFTMAX not in ops
    torch.testing.assert_close(ga, gb)


def test_unread_input_and_unused_outputs(registry):
    """native_layer_norm_backward's decomposition never reads ``bias``: the composite gets a
    tensor of its type; grad_bias unused by anyone is still computed (and dropped)."""
    g = Graph("g")
    types = [TensorType((6, 16)), TensorType((6, 16)), TensorType((6, 1)), TensorType((6, 1)),
             TensorType((16,)), TensorType((16,))]
    go, x, mean, rstd, w, b = (g.add_input(t, n) for t, n in
                               zip(types, ["go", "x", "mean", "rstd", "w", "b"]))
    centered = g.create("aten.sub.Tensor", [x, mean], [types[0]])
    xhat = g.create("aten.mul.Tensor", [centered.output, rstd], [types[0]])
    gw = g.create("aten.mul.Tensor", [go, xhat.output], [types[0]])
    dw = g.create("aten.sum.dim_IntList", [gw.output], [types[4]], {"dim": (0,)})
    assert mark_decomposition("aten.native_layer_norm_backward.default",
                              {"normalized_shape": (16,), "output_mask": (False, True, False)},
                              [go, x, mean, rstd, w, b], [centered, xhat, gw, dw],
                              [None, dw.output, None])
    g.set_outputs([dw.output])
    g = parse_graph(print_graph(g))
    args = [torch.randn(6, 16), torch.randn(6, 16), torch.randn(6, 1), torch.rand(6, 1) + 0.5,
            torch.randn(16), torch.randn(16)]
    ops, (got,) = calls(build_function(g, registry).fn, *args)
    assert ops == ["aten.native_layer_norm_backward.default"]
    want = torch.ops.aten.native_layer_norm_backward(args[0], args[1], [16], args[2], args[3],
                                                     args[4], args[5], [False, True, False])[1]
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def _unread_input_graph(rows) -> Graph:
    """native_layer_norm_backward's grad_weight as primitives that read ``go`` and ``rstd``
    only (each other input of the composite gets a placeholder)."""
    g = Graph("g")
    types = [TensorType((rows, 16)), TensorType((rows, 16)), TensorType((rows, 1)),
             TensorType((rows, 1)), TensorType((16,)), TensorType((16,))]
    go, x, mean, rstd, w, b = (g.add_input(t, n) for t, n in
                               zip(types, ["go", "x", "mean", "rstd", "w", "b"]))
    gw = g.create("aten.mul.Tensor", [go, rstd], [types[0]])
    dw = g.create("aten.sum.dim_IntList", [gw.output], [types[4]], {"dim": (0,)})
    assert mark_decomposition("aten.native_layer_norm_backward.default",
                              {"normalized_shape": (16,), "output_mask": (False, True, False)},
                              [go, x, mean, rstd, w, b], [gw, dw], [None, dw.output, None])
    g.set_outputs([dw.output])
    return g


def test_placeholders_are_real_tensors_when_built_under_a_fake_mode(registry):
    """A backward may be compiled while aot_autograd traces with fake tensors: the unread
    input's placeholder is still a real tensor (a constant the plan runs with)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torchloom.codegen.recompose import recompose
    g = _unread_input_graph(6)
    with FakeTensorMode():
        assert recompose(g, registry) == 1
    constants = [n.attrs["value"] for n in g.nodes if n.op == "torchloom.constant"]
    assert len(constants) == 4  # x, mean, weight, bias: not read by these primitives
    assert not any(isinstance(c, FakeTensor) for c in constants)


def test_output_read_between_primitives_goes_before_its_reader(registry):
    """native_layer_norm's ``rstd`` is read before its last primitive: the composite goes
    before that reader."""
    g = Graph("g")
    x = g.add_input(TensorType((4, 8)), "x")
    t, row = x.type, x.type.with_(shape=(4, 1))
    vm = g.create("aten.var_mean.correction", [x], [row, row],
                  {"dim": (-1,), "correction": 0, "keepdim": True})
    var, mean = vm.outputs
    eps = g.create("aten.add.Tensor", [var], [row], {"other": 1e-5})
    rstd = g.create("aten.rsqrt.default", [eps.output], [row])
    early = g.create("aten.neg.default", [rstd.output], [row])
    centered = g.create("aten.sub.Tensor", [x, mean], [t])
    out = g.create("aten.mul.Tensor", [centered.output, rstd.output], [t])
    assert mark_decomposition("aten.native_layer_norm.default",
                              {"normalized_shape": (8,), "weight": None, "bias": None,
                               "eps": 1e-5}, [x], [vm, eps, rstd, centered, out],
                              [out.output, mean, rstd.output])
    g.set_outputs([out.output, early.output, mean])
    xs = torch.randn(4, 8)
    ops, (y, neg_rstd, m) = calls(build_function(g, registry).fn, xs)
    assert ops == ["aten.native_layer_norm.default", "aten.neg.default"]
    want = torch.ops.aten.native_layer_norm(xs, [8], None, None, 1e-5)
    torch.testing.assert_close(y, want[0], rtol=0, atol=0)
    torch.testing.assert_close(m, want[1], rtol=0, atol=0)
    torch.testing.assert_close(neg_rstd, -want[2], rtol=0, atol=0)


def test_eager_groups_are_inlined_and_their_composites_recomposed(registry):
    """A group on the eager codegen adds no call of its own to the plan."""
    g = softmax_graph()
    body = parse_graph(print_graph(g))
    outer = Graph("outer")
    x = outer.add_input(TensorType((4, 8)), "x")
    region = body
    region.name = "fused"
    group = outer.create("torchloom.fusion_group", [x], [TensorType((4, 8))], region=region)
    outer.set_outputs(group.outputs)
    compiled = CompiledGraph(outer, registry, [EagerCodegen()])
    assert [c.codegen for c in compiled.choices] == ["eager"]
    assert compiled.source.count(" = f") == 1  # one call: the composite, no group call
    ops, (got,) = calls(compiled, torch.randn(4, 8))
    assert ops == [SOFTMAX]


def test_region_kernel_runs_when_called_directly(registry):
    g = softmax_graph()
    kernel = EagerCodegen().load(KernelSource("eager", print_graph(g)), registry)
    assert isinstance(kernel, RegionKernel)
    x = torch.randn(4, 8)
    torch.testing.assert_close(kernel(x)[0], torch.softmax(x, -1), rtol=0, atol=0)


def test_a_group_compiled_natively_keeps_its_part_of_an_instance(registry):
    """An instance split between a native kernel and the eager codegen runs as
    primitives: the native part cannot run the composite."""
    from torchloom.ir.graph import Node

    class ExpOnly:  # "compiles" groups holding exp (runs them as primitives, op by op)
        name, version = "exp-only", "1"

        def supports(self, group: Node, reg):
            ok = any(n.op == "aten.exp.default" for n in group.region.nodes)
            return None if ok else "no exp"

        def generate(self, group: Node, reg):
            return KernelSource(self.name, print_graph(group.region))

        def load(self, kernel, reg):
            return build_function(parse_graph(kernel.source), reg, recompose=False).fn

    g = softmax_graph()
    outer = Graph("outer")
    x = outer.add_input(TensorType((4, 8)), "x")
    nodes = list(g.nodes)
    env = {g.inputs[0]: x}
    for part in (nodes[:2], nodes[2:3], nodes[3:]):  # amax+sub | exp | sum+div
        region = Graph(f"r{len(outer)}")
        inner = {}
        for n in part:
            for v in n.inputs:
                if v not in inner and v.producer not in part:
                    inner[v] = region.add_input(v.type, v.name)
            copy = region.create(n.op, [inner[v] for v in n.inputs],
                                 [v.type for v in n.outputs], n.attrs)
            inner.update(zip(n.outputs, copy.outputs))
        region.set_outputs([inner[part[-1].output]])
        outer_in = [env[v] for v in inner if v.producer not in part and v in env]
        group = outer.create("torchloom.fusion_group", outer_in, [part[-1].output.type],
                             region=region)
        env[part[-1].output] = group.output
    outer.set_outputs([env[nodes[-1].output]])
    compiled = CompiledGraph(outer, registry, [ExpOnly(), EagerCodegen()])
    assert [c.codegen for c in compiled.choices] == ["eager", "exp-only", "eager"]
    xs = torch.randn(4, 8)
    ops, (got,) = calls(compiled, xs)
    assert SOFTMAX not in ops and len(ops) == 5
    torch.testing.assert_close(got, torch.softmax(xs, -1))


def test_input_refs_in_the_composites_attributes_are_not_marked():
    g = Graph("g")
    x = g.add_input(TensorType((4,)), "x")
    neg = g.create("aten.neg.default", [x], [x.type])
    assert not mark_decomposition("aten.cat.default", {"tensors": (InputRef(0),)}, [x], [neg],
                                  [neg.output])
    assert dict(neg.attrs) == {}


def test_instances_inside_a_shared_subgraph_run_whole(registry):
    """dedup.regions' shared subgraphs: each is planned once, its instances recomposed."""
    layer = softmax_graph()
    text = ('graph @main(%x: f32[4, 8]) {\n'
            '  %a = torchloom.call_subgraph(%x) {callee = "layer"} : f32[4, 8]\n'
            '  %b = torchloom.call_subgraph(%a) {callee = "layer"} : f32[4, 8]\n'
            '  return %b\n}\n' + print_graph(layer).replace("graph @g(", "graph @layer("))
    compiled = CompiledGraph(parse_graph(text), registry, [EagerCodegen()])
    x = torch.randn(4, 8)
    ops, (got,) = calls(compiled, x)
    assert ops == [SOFTMAX, SOFTMAX]
    torch.testing.assert_close(got, torch.softmax(torch.softmax(x, -1), -1), rtol=0, atol=0)
