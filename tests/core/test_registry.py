"""The op registry: categories, inference, aliasing and calling convention of what
aot_autograd really emits (traced here, forward and backward), and opaque fallbacks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from functorch.compile import aot_function, make_boxed_func

from torchloom.frontend.fx import import_fx
from torchloom.errors import VerifyError
from torchloom.ir import parse_graph, verify
from torchloom.ops.aten import default_registry
from torchloom.ops.registry import OpDef, OpRegistry
from torchloom.runtime.executor import build_function

P, R, V, O, M, X = "pointwise", "reduction", "view", "opaque", "mutating", "random"

#: the category of every op the traced families below emit (forward and backward)
EXPECTED = {
    "aten.gelu.default": P, "aten.gelu_backward.default": P,
    "aten.native_layer_norm.default": O, "aten.native_layer_norm_backward.default": O,
    "aten._softmax.default": O, "aten._softmax_backward_data.default": O,
    "aten._log_softmax.default": O, "aten._log_softmax_backward_data.default": O,
    "aten.native_dropout.default": X, "aten.native_dropout_backward.default": P,
    "aten.clone.default": P, "aten.addmm.default": O, "aten.mm.default": O,
    "aten.bmm.default": O, "aten.convolution.default": O,
    "aten.convolution_backward.default": O,
    "aten._native_batch_norm_legit_functional.default": O,
    "aten._native_batch_norm_legit_no_training.default": O,
    "aten.native_batch_norm_backward.default": O,
    "aten.view.default": V, "aten._unsafe_view.default": V, "aten.permute.default": V,
    "aten.transpose.int": V, "aten.t.default": V, "aten.expand.default": V,
    "aten.squeeze.dim": V, "aten.unsqueeze.default": V, "aten.slice.Tensor": V,
    "aten.select.int": V, "aten.alias.default": V, "aten.detach.default": V,
    "aten.split.Tensor": V,
    "aten._to_copy.default": P, "aten.where.self": P, "aten.gt.Tensor": P, "aten.lt.Scalar": P,
    "aten.ge.Tensor": P, "aten.ge.Scalar": P, "aten.le.Tensor": P, "aten.eq.Tensor": P,
    "aten.eq.Scalar": P, "aten.ne.Tensor": P, "aten.logical_and.default": P,
    "aten.sum.default": R, "aten.sum.dim_IntList": R, "aten.mean.dim": R,
    "aten.amax.default": R, "aten.amin.default": R, "aten.var.correction": R,
    "aten.sigmoid.default": P, "aten.sigmoid_backward.default": P, "aten.tanh.default": P,
    "aten.tanh_backward.default": P, "aten.exp.default": P, "aten.log.default": P,
    "aten.rsqrt.default": P, "aten.pow.Tensor_Scalar": P, "aten.pow.Tensor_Tensor": P,
    "aten.abs.default": P, "aten.sgn.default": P, "aten.add.Tensor": P, "aten.sub.Tensor": P,
    "aten.sub.Scalar": P, "aten.mul.Tensor": P, "aten.mul.Scalar": P, "aten.div.Tensor": P,
    "aten.div.Scalar": P, "aten.neg.default": P, "aten.cat.default": O,
    "aten.scalar_tensor.default": O, "aten.zeros.default": O, "aten.ones.default": O,
    "aten.zeros_like.default": O, "aten.full.default": O, "aten.index_select.default": O,
    "aten.new_zeros.default": O, "aten.select_backward.default": O,
    "aten.slice_backward.default": O, "aten.squeeze.default": V, "aten.max.dim": R,
}


def _x(*shape):
    return torch.randn(*shape, requires_grad=True)


def _bn(training):
    def f(a, w, b):
        return F.batch_norm(a, torch.zeros(3), torch.ones(3), w, b, training=training)
    return f


#: family -> (function, argument factory, ops the family must emit)
FAMILIES = {
    "gelu_erf": (lambda a: F.gelu(a), lambda: [_x(4, 8)],
                 {"aten.gelu.default", "aten.gelu_backward.default"}),
    "gelu_tanh": (lambda a: F.gelu(a, approximate="tanh"), lambda: [_x(4, 8)],
                  {"aten.gelu.default", "aten.gelu_backward.default"}),
    "layer_norm": (lambda a, w, b: F.layer_norm(a, (8,), w, b), lambda: [_x(4, 8), _x(8), _x(8)],
                   {"aten.native_layer_norm.default", "aten.native_layer_norm_backward.default"}),
    "softmax": (lambda a: F.softmax(a, -1), lambda: [_x(4, 8)],
                {"aten._softmax.default", "aten._softmax_backward_data.default"}),
    "log_softmax": (lambda a: F.log_softmax(a, -1), lambda: [_x(4, 8)],
                    {"aten._log_softmax.default", "aten._log_softmax_backward_data.default"}),
    "dropout_train": (lambda a: F.dropout(a, 0.5, True), lambda: [_x(4, 8)],
                      {"aten.native_dropout.default", "aten.native_dropout_backward.default"}),
    "dropout_eval": (lambda a: F.dropout(a, 0.5, False) * 2, lambda: [_x(4, 8)],
                     {"aten.clone.default", "aten.mul.Tensor"}),
    "linear": (F.linear, lambda: [_x(2, 4, 8), _x(3, 8), _x(3)],
               {"aten.addmm.default", "aten.mm.default", "aten.t.default", "aten.view.default",
                "aten.sum.dim_IntList"}),
    "mm_bmm": (lambda a, b, c: (a @ b).unsqueeze(0).expand(2, 4, 3) @ c,
               lambda: [_x(4, 8), _x(8, 3), _x(2, 3, 5)],
               {"aten.mm.default", "aten.bmm.default", "aten.expand.default",
                "aten.transpose.int"}),
    "convolution": (lambda a, w, b: F.conv2d(a, w, b, padding=1),
                    lambda: [_x(1, 3, 8, 8), _x(4, 3, 3, 3), _x(4)],
                    {"aten.convolution.default", "aten.convolution_backward.default"}),
    "batch_norm_train": (_bn(True), lambda: [_x(2, 3, 4, 4), _x(3), _x(3)],
                         {"aten._native_batch_norm_legit_functional.default",
                          "aten.native_batch_norm_backward.default"}),
    "batch_norm_eval": (_bn(False), lambda: [_x(2, 3, 4, 4), _x(3), _x(3)],
                        {"aten._native_batch_norm_legit_no_training.default",
                         "aten.native_batch_norm_backward.default"}),
    "views": (lambda a: a.view(8, 4).reshape(4, 8).permute(1, 0).transpose(0, 1).t()
              .expand(1, 8, 4).squeeze(0).unsqueeze(1)[1:3].select(0, 1) * 3,
              lambda: [_x(4, 8)],
              {"aten.view.default", "aten.permute.default", "aten.transpose.int",
               "aten.t.default", "aten.expand.default", "aten.squeeze.dim",
               "aten.unsqueeze.default", "aten.slice.Tensor", "aten.select.int"}),
    "reshape_copy": (lambda a: a.t().reshape(32) * 2, lambda: [_x(4, 8)],
                     {"aten._unsafe_view.default", "aten.clone.default"}),
    "alias_split": (lambda a: torch.ops.aten.alias(a).split(2)[1] * 2, lambda: [_x(4, 8)],
                    {"aten.alias.default", "aten.split.Tensor"}),
    "casts": (lambda a: a.to(torch.float16).to(torch.float32) + a.double().float(),
              lambda: [_x(4, 8)], {"aten._to_copy.default"}),
    "where_compare": (lambda a, b: torch.where(a > b, a, b) + (a < 0) + (a >= b) + (a == b)
                      + (a != b) + (a <= b), lambda: [_x(4, 8), _x(4, 8)],
                      {"aten.where.self", "aten.gt.Tensor", "aten.lt.Scalar", "aten.ge.Tensor",
                       "aten.eq.Tensor", "aten.ne.Tensor", "aten.le.Tensor"}),
    "reductions": (lambda a: a.sum() + a.mean(-1).sum() + a.amax(-1).sum() + a.amin(0).sum()
                   + a.var(-1).sum(), lambda: [_x(4, 8)],
                   {"aten.sum.default", "aten.mean.dim", "aten.amax.default",
                    "aten.amin.default", "aten.var.correction"}),
    "unary": (lambda a: torch.sigmoid(a) + torch.tanh(a) + torch.exp(a)
              + torch.log(a.abs() + 1) + torch.rsqrt(a.abs() + 1) + a.pow(2) + torch.pow(a, a),
              lambda: [_x(4, 8)],
              {"aten.sigmoid.default", "aten.sigmoid_backward.default", "aten.tanh.default",
               "aten.tanh_backward.default", "aten.exp.default", "aten.log.default",
               "aten.rsqrt.default", "aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor"}),
}


def trace(fn, args):
    """The aot_autograd forward and backward FX graphs of ``fn`` with their example inputs."""
    graphs = []

    def compiler(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return make_boxed_func(gm.forward)

    out = aot_function(fn, fw_compiler=compiler, bw_compiler=compiler)(*args)
    outs = out if isinstance(out, (tuple, list)) else [out]
    sum(o.float().sum() for o in outs if o.requires_grad).backward()
    return graphs


def real_like(t):
    """A real tensor with the fake example's shape, strides and dtype, filled at random."""
    if not isinstance(t, torch.Tensor):
        return t
    size = 1 + sum((d - 1) * s for d, s in zip(t.shape, t.stride()) if d > 0)
    if t.dtype.is_floating_point:
        storage = torch.randn(size, dtype=t.dtype)
    else:
        storage = torch.randint(0, 2, (size,)).to(t.dtype)
    return storage.as_strided(t.shape, t.stride())  # keeps stride-0 (expanded) layouts


@pytest.fixture(scope="module")
def registry():
    return default_registry()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_emitted_ops_have_categories_inference_and_run(family, registry):
    fn, make_args, must_emit = FAMILIES[family]
    torch.manual_seed(0)
    graphs = trace(fn, make_args())
    assert len(graphs) == 2  # forward and backward
    emitted = set()
    for gm, example_inputs in graphs:
        imported = import_fx(gm, example_inputs, family)
        g = imported.graph
        verify(g, registry)  # every output type agrees with the op's inference
        for node in g.nodes:
            emitted.add(node.op)
            if node.op.startswith("torchloom."):
                continue
            opdef = registry.get(node.op)
            assert node.op in EXPECTED, f"{family}: {node.op} is {opdef.category}; add it"
            assert opdef.category == EXPECTED[node.op], node.op
            assert opdef.fn is not None, node.op
        concrete = [real_like(t) for t in example_inputs]
        run = build_function(g, registry).fn
        torch.manual_seed(1)
        got = run(*concrete, *imported.constants)
        torch.manual_seed(1)
        want = gm(*concrete)
        want = [w for w in want] if isinstance(want, (list, tuple)) else [want]
        assert len(got) == len(want)
        for a, b in zip(got, want):
            if isinstance(b, torch.Tensor):
                torch.testing.assert_close(a, b, equal_nan=True)  # random saved values
            else:
                assert a == b
    assert must_emit <= emitted, f"{family} no longer emits {must_emit - emitted}"


def test_view_and_list_aliasing(registry):
    g = parse_graph("""\
graph @g(%x: f32[4, 8]) {
  %t = aten.t.default(%x) : f32[8, 4] strided[1, 8]
  %a, %b = aten.split.Tensor(%x) {split_size = 2} : f32[2, 8], f32[2, 8]
  %c = aten.cat.default(%a, %b) {tensors = [$0, $1]} : f32[4, 8]
  return %t, %a, %b, %c
}
""")
    t, split, cat = list(g.nodes)
    verify(g, registry)
    assert registry.get(t.op).aliased_input(t, 0) == 0
    assert registry.get(split.op).returns_sequence
    assert [registry.get(split.op).aliased_input(split, i) for i in (0, 1)] == [0, 0]
    assert registry.get(cat.op).aliased_input(cat, 0) is None
    x = torch.randn(4, 8)
    out = build_function(g, registry).fn(x)
    torch.testing.assert_close(out[3], x)
    assert out[1].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_mutating_ops_report_written_inputs_including_list_arguments(registry):
    g = parse_graph("""\
graph @g(%x: f32[5], %i: i64[3], %v: f32[3], %a: f32[2], %b: f32[2], %s: f32[2]) {
  %y = aten.add_.Tensor(%x, %v) : f32[5]
  %z = aten.index_put_.default(%x, %i, %v) {indices = [$1]} : f32[5]
  aten._foreach_add_.List(%a, %b, %s, %s) {self = [$0, $1], other = [$2, $3]} : ()
  return %y, %z
}
""")
    add_, index_put_, foreach = list(g.nodes)
    for node, written in ((add_, [0]), (index_put_, [0]), (foreach, [0, 1])):
        opdef = registry.get(node.op)
        assert opdef.category == M
        assert opdef.mutated_inputs(node) == written, node.op


def test_list_argument_before_a_tensor_argument_binds_correctly(registry):
    """index_put(self, indices=[$1], values): values is input 2, not the index tensor."""
    g = parse_graph("""\
graph @g(%x: f32[5], %i: i64[3], %v: f32[3]) {
  %y = aten.index_put.default(%x, %i, %v) {accumulate = true, indices = [$1]} : f32[5]
  return %y
}
""")
    verify(g, registry)
    x, i, v = torch.zeros(5), torch.tensor([0, 2, 2]), torch.tensor([1.0, 2.0, 3.0])
    (got,) = build_function(g, registry).fn(x, i, v)
    torch.testing.assert_close(got, torch.index_put(x, [i], v, accumulate=True))


def test_kwarg_only_and_omitted_arguments_bind(registry):
    g = parse_graph("""\
graph @g(%x: f32[4], %y: f32[4]) {
  %a = aten.add.Tensor(%x, %y) {alpha = 2} : f32[4]
  %b = aten.clamp.Tensor(%x, %y) {min = none} : f32[4]
  %c = aten._to_copy.default(%x) {dtype = #f16} : f16[4]
  %d = aten.sum.dim_IntList(%x) {dim = [0], dtype = #f64} : f64[]
  return %a, %b, %c, %d
}
""")
    verify(g, registry)
    x, y = torch.randn(4), torch.randn(4)
    a, b, c, d = build_function(g, registry).fn(x, y)
    torch.testing.assert_close(a, x + 2 * y)
    torch.testing.assert_close(b, torch.clamp(x, max=y))
    torch.testing.assert_close(c, x.half())
    torch.testing.assert_close(d, x.double().sum())


def test_inference_memo_tells_int_float_and_bool_attributes_apart(registry):
    text = ("graph @g() {{\n  %a = aten.full.default() {{fill_value = {v}, size = [2]}} : {t}[2]\n"
            "  return %a\n}}\n")
    for value, dtype in (("1.0", "f32"), ("1", "i64"), ("true", "b8"), ("1", "i64")):
        verify(parse_graph(text.format(v=value, t=dtype)), registry)
    with pytest.raises(Exception, match="gives i64"):
        verify(parse_graph(text.format(v="1", t="f32")), registry)


def test_inference_memo_keys_list_attributes_by_their_items(registry):
    # lists are memoised (by their items), so a memo hit must not cross sizes
    text = ("graph @g() {{\n  %a = aten.full.default() {{fill_value = -0.0, size = {s}}} : f32{t}\n"
            "  return %a\n}}\n")
    for size in ("[2]", "[3]", "[2, 3]", "[2]"):
        verify(parse_graph(text.format(s=size, t=size)), registry)
    with pytest.raises(Exception, match=r"gives f32\[3\]"):
        verify(parse_graph(text.format(s="[3]", t="[2]")), registry)


def test_unknown_names_become_opaque_without_a_callable():
    registry = default_registry()
    for name in ("nosuchns.op.default", "aten.no_such_op.default", "python.no_such_module.f"):
        opdef = registry.get(name)
        assert opdef.category == O and opdef.fn is None
        assert name in registry.names()
    assert registry.get("python.operator.getitem").fn is not None


def test_register_rejects_duplicates_and_replace_allows():
    registry = OpRegistry()
    registry.register(OpDef("my.op", P))
    with pytest.raises(ValueError, match="already registered"):
        registry.register(OpDef("my.op", R))
    registry.register(OpDef("my.op", R), replace=True)
    assert registry.category("my.op") == R
    with pytest.raises(ValueError):
        OpDef("my.other", "elementwise")


def test_public_binding_is_used_only_where_it_reaches_the_same_overload(registry):
    g = parse_graph("""\
graph @g(%x: f32[2, 2], %w: f32[2, 2]) {
  %m = aten.mm.default(%x, %w) : f32[2, 2]
  %v = aten.view.default(%m) {size = [4]} : f32[4]
  %s = aten.add.Scalar(%v) {other = 2} : f32[4]
  %t = aten.add.Tensor(%v, %s) {alpha = 3} : f32[4]
  return %t
}
""")
    mm, view, add_scalar, add_tensor = list(g.nodes)
    assert registry.get(mm.op).callable_for(mm) is torch._C._VariableFunctions.mm
    assert registry.get(view.op).callable_for(view) is torch._C.TensorBase.view
    # torch.add(x, 2) would dispatch to add.Tensor: the boxed overload is kept
    assert registry.get(add_scalar.op).callable_for(add_scalar) is registry.get(add_scalar.op).fn
    assert registry.get(add_tensor.op).callable_for(add_tensor) is torch._C._VariableFunctions.add
    x, w = torch.randn(2, 2), torch.randn(2, 2)
    (got,) = build_function(g, registry).fn(x, w)
    v = (x @ w).view(4)
    torch.testing.assert_close(got, v + 3 * (v + 2))


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_inferred_types_follow_the_device_not_the_meta_kernel(registry, dtype):
    """On CPU, low-precision layer norm returns mean/rstd in its own dtype (the meta kernel
    says f32); on CUDA they are f32. Inference gives what the graph's device returns."""
    def graph(device: str, stats: str):
        on = "" if device == "cpu" else f" @{device}"
        x, s = f"{dtype}[4, 8]{on}", f"{stats}[4, 1]{on}"
        return parse_graph(f"""\
graph @g(%x: {x}, %w: {dtype}[8]{on}) {{
  %y, %m, %r = aten.native_layer_norm.default(%x, %w, %w)
      {{eps = 1e-05, normalized_shape = [8]}} : {x}, {s}, {s}
  return %y, %m, %r
}}
""")
    verify(graph("cpu", dtype), registry)
    verify(graph("cuda:0", "f32"), registry)
    with pytest.raises(VerifyError, match=rf"declared f32\[4, 1\] but .* gives {dtype}\[4, 1\]"):
        verify(graph("cpu", "f32"), registry)
    with pytest.raises(VerifyError, match=rf"declared {dtype}\[4, 1\] @cuda:0 but .* gives f32"):
        verify(graph("cuda:0", dtype), registry)
    torch_dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    x, w = torch.randn(4, 8, dtype=torch_dtype), torch.randn(8, dtype=torch_dtype)
    got = build_function(graph("cpu", dtype), registry).fn(x, w)
    want = torch.ops.aten.native_layer_norm.default(x, [8], w, w, 1e-5)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b)


def _inferred_and_real(registry, op_name: str, tensors: list, scalars: dict):
    """Types the registry infers for ``op_name`` called with ``tensors`` (schema order,
    None where absent) and ``scalars`` (by argument name), and the real kernel's types."""
    from torchloom.ir import Graph, TensorType
    opdef = registry.get(op_name)
    names = [a.name for a in opdef.schema.arguments]
    g, inputs, attrs_ = Graph("g"), [], dict(scalars)
    for i, t in enumerate(tensors):
        if t is None:
            attrs_[names[i]] = None
        else:
            inputs.append(g.add_input(TensorType.of(t), f"a{i}"))
    real = opdef.fn(*tensors, *scalars.values())
    node = g.create(op_name, inputs, [TensorType.of(r) for r in real], attrs_)
    want = [(r.dtype, tuple(r.shape)) for r in real]
    inferred = registry.get(op_name).infer_types(node)
    got = None if inferred is None else [(t.torch_dtype, tuple(t.shape)) for t in inferred]
    return got, want


BATCH_NORMS = {  # op -> (has running statistics, takes ``training``)
    "aten.native_batch_norm.default": (True, True),
    "aten._native_batch_norm_legit.default": (True, True),
    "aten._native_batch_norm_legit.no_stats": (False, True),
    "aten._native_batch_norm_legit_functional.default": (True, True),
    "aten._native_batch_norm_legit_no_training.default": (True, False),
    "aten._batch_norm_with_update.default": (True, False),
    "aten._batch_norm_with_update_functional.default": (True, False),
    "aten._batch_norm_no_update.default": (True, False),
}


@pytest.mark.parametrize("op_name", sorted(BATCH_NORMS))
def test_batch_norm_types_are_what_the_cpu_kernels_return(registry, op_name):
    """torch's fake kernels (and so FX graphs) give other dtypes than the CPU kernels for
    mixed precision and functional running-statistics updates; inference follows the
    CPU kernels, in every combination the kernels accept."""
    import itertools
    has_stats, takes_training = BATCH_NORMS[op_name]
    low, f32 = torch.bfloat16, torch.float32
    checked = 0
    for x_dtype, w_dtype, s_dtype, training in itertools.product(
            (low, torch.float16, f32), (low, f32, None), (low, f32),
            (True, False) if takes_training else (None,)):
        if w_dtype not in (None, x_dtype, f32) or s_dtype not in (x_dtype, f32):
            continue
        if training is False and not has_stats:  # eval without statistics (torch crashes)
            continue
        x = torch.randn(2, 3, 4, dtype=x_dtype)
        w = None if w_dtype is None else torch.rand(3, dtype=w_dtype) + 0.5
        b = None if w_dtype is None else torch.randn(3, dtype=w_dtype)
        stats = [torch.zeros(3, dtype=s_dtype), torch.ones(3, dtype=s_dtype)] if has_stats else []
        scalars = ({"training": training} if takes_training else {}) | {"momentum": 0.1,
                                                                       "eps": 1e-5}
        try:
            op = registry.get(op_name).fn
            op(x, w, b, *[s.clone() for s in stats], *scalars.values())
        except RuntimeError:  # a combination the CPU kernel rejects (mixed bf16/f32 params)
            continue
        got, want = _inferred_and_real(registry, op_name, [x, w, b, *stats], scalars)
        if got is None:  # torch's fake _batch_norm_with_update rejects a missing weight
            assert w is None and op_name.startswith("aten._batch_norm_"), op_name
            continue
        assert got == want, (x_dtype, w_dtype, s_dtype, training)
        checked += 1
    assert checked >= 4
