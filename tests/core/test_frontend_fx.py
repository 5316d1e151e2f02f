"""FX (aot aten graphs) -> IR: types, constants, multi-output ops, bad input."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx
from functorch.compile import aot_function, make_boxed_func
from torch.fx.experimental.proxy_tensor import make_fx

from torchloom.errors import UnsupportedError
from torchloom.frontend.fx import callable_name, import_fx
from torchloom.ir import TensorType, parse_graph, print_graph, verify
from torchloom.ops.aten import default_registry
from torchloom.runtime.executor import CONSTANT, build_function


@pytest.fixture(scope="module")
def registry():
    return default_registry()


def aot_graphs(fn, *args):
    """aot_autograd's forward graph, and its backward graph when an output needs grad."""
    graphs = []

    def compiler(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return make_boxed_func(gm.forward)

    out = aot_function(fn, fw_compiler=compiler, bw_compiler=compiler)(*args)
    if out.requires_grad:
        out.sum().backward()
    return graphs


def real_like(t):
    """A real tensor with a fake example's shape, strides and dtype."""
    size = 1 + sum((d - 1) * s for d, s in zip(t.shape, t.stride()) if d > 0)
    return torch.randn(size, dtype=t.dtype).as_strided(t.shape, t.stride())


def test_types_keep_shape_dtype_strides_and_device(registry):
    def f(x, y):
        return (x.t() * 2).to(torch.float32) + y, x[:, ::2]

    x = torch.empty(8, 4, dtype=torch.bfloat16, device="meta").t()  # strided input
    y = torch.empty(8, 4, device="meta")
    gm = make_fx(f)(x, y)
    g = import_fx(gm, [x, y]).graph
    assert g.inputs[0].type == TensorType.make([4, 8], "bf16", "meta", [1, 4])
    assert g.inputs[1].type == TensorType.make([8, 4], "f32", "meta")
    for fx_node, node in zip([n for n in gm.graph.nodes if n.op == "call_function"], g.nodes):
        val = fx_node.meta["val"]
        assert node.outputs[0].type == TensorType.of(val), fx_node.name
        assert node.outputs[0].type.device == "meta"
    sliced = g.outputs[1].type
    assert sliced.shape == (4, 4) and sliced.strides == (1, 8) and sliced.dtype == "bf16"
    verify(g, registry)
    assert print_graph(parse_graph(print_graph(g))) == print_graph(g)


def test_forward_and_backward_graphs_import_and_run(registry):
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)
    graphs = aot_graphs(lambda x, w: torch.tanh(x @ w).softmax(-1).sum(0), x, w)
    assert len(graphs) == 2
    for gm, ex in graphs:
        imported = import_fx(gm, ex)
        verify(imported.graph, registry)
        assert not imported.symbolic
        assert [v.type for v in imported.graph.inputs] == [TensorType.of(t) for t in ex]
        real = [real_like(t) for t in ex]
        got = build_function(imported.graph, registry).fn(*real)
        want = gm(*real)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            if isinstance(b, torch.Tensor):
                torch.testing.assert_close(a, b)
            else:
                assert a is b


def test_get_attr_constants_become_trailing_inputs(registry):
    graphs = aot_graphs(lambda x: x * torch.tensor([1.0, 2.0, 3.0]) + 1, torch.randn(2, 3))
    gm, ex = graphs[0]
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    imported = import_fx(gm, ex)
    g = imported.graph
    assert len(g.inputs) == 2 and len(imported.constants) == 1
    torch.testing.assert_close(imported.constants[0], torch.tensor([1.0, 2.0, 3.0]))
    assert g.inputs[1].type == TensorType.make([3], "f32")
    x = torch.randn(2, 3)
    (got,) = build_function(g, registry).fn(x, *imported.constants)
    torch.testing.assert_close(got, x * torch.tensor([1.0, 2.0, 3.0]) + 1)


def test_multi_output_ops_getitem_and_list_returns(registry):
    def f(x, w, b):
        y, mean, rstd = torch.ops.aten.native_layer_norm.default(x, [8], w, b, 1e-5)
        a, c = torch.split(y, 2)
        return a + c, rstd

    args = [torch.randn(4, 8), torch.randn(8), torch.randn(8)]
    gm = make_fx(f)(*args)
    assert any(n.target is operator.getitem for n in gm.graph.nodes)
    g = import_fx(gm, args).graph
    ops = [n.op for n in g.nodes]
    assert "python.operator.getitem" not in ops  # getitem selects an output, no node
    ln = next(n for n in g.nodes if n.op == "aten.native_layer_norm.default")
    split = next(n for n in g.nodes if n.op == "aten.split.Tensor")
    assert len(ln.outputs) == 3 and len(split.outputs) == 2
    assert g.outputs[1] is ln.outputs[2]
    verify(g, registry)
    got = build_function(g, registry).fn(*args)
    for a, b in zip(got, f(*args)):
        torch.testing.assert_close(a, b)


def test_none_and_scalar_outputs_become_constants(registry):
    gm = torch.fx.symbolic_trace(lambda x: (torch.neg(x), None, 3))
    # make it an aten graph by hand: neg is a torch function, imported as python.*
    x = torch.randn(3)
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            n.meta["val"] = x
        if n.op == "call_function":
            n.meta["val"] = torch.neg(x)
    imported = import_fx(gm, [x], registry=registry)  # registers python.torch.neg there
    consts = [n for n in imported.graph.nodes if n.op == CONSTANT]
    assert [n.attrs["value"] for n in consts] == [None, 3]
    got = build_function(imported.graph, registry).fn(x)
    torch.testing.assert_close(got[0], -x)
    assert got[1] is None and got[2] == 3
    assert print_graph(parse_graph(print_graph(imported.graph))) == print_graph(imported.graph)


def test_symbolic_shapes_are_named_and_flagged():
    x = torch.randn(4, 8)
    gm = make_fx(lambda x: (x * 2).sum(0), tracing_mode="symbolic")(x)
    imported = import_fx(gm, [x])
    assert imported.symbolic
    t = imported.graph.inputs[0].type
    assert all(isinstance(d, str) for d in t.shape), t
    text = print_graph(imported.graph)
    assert print_graph(parse_graph(text)) == text


def test_callable_names():
    assert callable_name(torch.ops.aten.add.Tensor) == "aten.add.Tensor"
    assert callable_name(torch.ops.aten.gelu) == "aten.gelu.default"
    assert callable_name(operator.getitem) == "python.operator.getitem"


def test_non_aten_graphs_raise_unsupported():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x)

    gm = torch.fx.symbolic_trace(M())  # has a call_module node
    with pytest.raises(UnsupportedError, match="call_module"):
        import_fx(gm, [torch.randn(2, 2)])


def test_attribute_without_text_form_is_unsupported_not_a_crash():
    x = torch.randn(3, 2)
    gm = make_fx(lambda x: torch.view_as_real(torch.view_as_complex(x) * (1 + 2j)))(x)
    with pytest.raises(UnsupportedError, match="has no IR text form"):
        import_fx(gm, [x])


def test_arguments_the_schema_does_not_have_are_unsupported():
    x = torch.randn(3)
    gm = make_fx(lambda x: torch.ops.aten.add.Tensor(x, x))(x)
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    node.args = (node.args[0], node.args[1], 1, 2, 3)
    with pytest.raises(UnsupportedError, match="add: 5 arguments, the schema has 3"):
        import_fx(gm, [x])
    node.args, node.kwargs = node.args[:2], {"bogus": 1}  # was silently dropped
    with pytest.raises(UnsupportedError, match="add: unknown argument.s. bogus"):
        import_fx(gm, [x])


def test_unexpected_import_failure_is_wrapped_as_unsupported():
    x = torch.randn(3)
    gm = make_fx(lambda x: torch.ops.aten.add.Tensor(x, x))(x)
    stranger = make_fx(lambda x: x * 2)(x)
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    foreign = next(n for n in stranger.graph.nodes if n.op == "placeholder")
    node.args = (node.args[0], foreign)  # a node of another graph: a KeyError inside import
    with pytest.raises(UnsupportedError, match="cannot import FX node add .*KeyError"):
        import_fx(gm, [x])


def test_call_targets_the_runtime_cannot_find_by_name_are_unsupported():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.randn(2)
    y = g.call_function(lambda t: t + 1, (x,))
    y.meta["val"] = torch.randn(2)
    g.output((y,))
    with pytest.raises(UnsupportedError, match="cannot be found by its name python.*<lambda>"):
        import_fx(torch.fx.GraphModule(torch.nn.Module(), g), None)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_inputs_of_every_torch_dtype_import():
    from torchloom.ir import DTYPES

    for dtype in (torch.uint16, torch.uint32, torch.complex32, torch.float8_e4m3fn):
        x = torch.empty(2, dtype=dtype, device="meta")
        gm = torch.fx.symbolic_trace(lambda t: t)
        imported = import_fx(gm, [x])
        assert DTYPES[imported.graph.inputs[0].type.dtype] is dtype


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_any_failure_while_importing_is_unsupported():
    gm = torch.fx.symbolic_trace(lambda t: t)
    next(iter(gm.graph.nodes)).meta["val"] = torch.empty(2, dtype=torch.quint8)  # no IR dtype
    with pytest.raises(UnsupportedError, match="cannot import the FX graph: KeyError"):
        import_fx(gm, None)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_types_torch_gives_wrongly_for_the_cpu_follow_the_kernels(dtype):
    """FX says a functional batch norm's new running statistics are f32 (torch's fake
    kernel); the CPU kernel returns them in their own dtype. The import gives the
    kernel's types, and re-infers what reads them (a product of them is not f32 either)."""
    def f(x, w, b, rm, rv):
        out = torch.ops.aten._native_batch_norm_legit_functional.default(
            x, w, b, rm, rv, True, 0.1, 1e-5)
        return out[0], out[3] * 2, out[4]

    args = [torch.randn(4, 3, 5, dtype=dtype), torch.ones(3, dtype=dtype),
            torch.zeros(3, dtype=dtype), torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype)]
    gm = make_fx(f, tracing_mode="fake")(*args)
    registry = default_registry()
    fx_types = import_fx(gm, args).graph.outputs
    assert [v.type.torch_dtype for v in fx_types] == [dtype, torch.float32, torch.float32]
    g = import_fx(gm, args, registry=registry).graph
    verify(g, registry)
    want = f(*[a.clone() for a in args])
    assert [v.type.torch_dtype for v in g.outputs] == [w.dtype for w in want] == [dtype] * 3
    got = build_function(g, registry).fn(*[a.clone() for a in args])
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b)
