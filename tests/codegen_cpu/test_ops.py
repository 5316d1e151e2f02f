"""Every pointwise op of the cpu codegen's table (ops.POINTWISE), through C vs eager, on
edge values (NaN, +-inf, -0.0, denormals, huge, tiny) and ordinary ones, for f32, f64,
bf16, f16, integers and bool. One group per dtype holds one output per op, so a dtype costs
one compiler call. Ops the codegen declines for a dtype must be declined with a Reason;
pointwise and reduction ops of the registry that it has no template for likewise."""

from __future__ import annotations

import pytest
import torch
from torchloom.api import DTYPES, format_type, parse_graph

from conftest import compare, group_text
from torchloom_codegen_cpu.ops import F16_TO_EAGER, POINTWISE, REDUCTIONS

EDGE = [0.5, -1.25, 3.0, -0.0, 0.0, float("nan"), float("inf"), float("-inf"), 1e-40, -2.5,
        100.0, -100.0, 0.1, 7.5, 1e-3, 2.0, -7.5, 0.75, 1e30, -3e-39]
OTHER = [2.0, 0.0, -0.0, 3.0, -1.5, 0.5, 2.0, float("nan"), -4.0, float("inf"), 0.1, 7.0,
         -0.25, 2.5, 1e-38, -2.0, 0.5, float("-inf"), 3.0, 1.0]
N = len(EDGE)

#: op -> ((input roles), attributes as IR text); roles: a, b (values), c (a bool condition)
CASES: dict[str, list[tuple[tuple[str, ...], str]]] = {
    "aten.add.Tensor": [(("a", "b"), ""), (("a", "b"), "{alpha = 2}"), (("a",), "{other = 3}")],
    "aten.add.Scalar": [(("a",), "{other = 2}")],
    "aten.sub.Tensor": [(("a", "b"), ""), (("a", "b"), "{alpha = 3}")],
    "aten.sub.Scalar": [(("a",), "{other = 1}")],
    "aten.rsub.Scalar": [(("a",), "{other = 1}")],
    "aten.rsub.Tensor": [(("a", "b"), "")],
    "aten.mul.Tensor": [(("a", "b"), ""), (("a",), "{other = 3}")],
    "aten.mul.Scalar": [(("a",), "{other = -2}")],
    "aten.div.Tensor": [(("a", "b"), ""), (("a",), "{other = 3}")],
    "aten.div.Scalar": [(("a",), "{other = 4}")],
    "aten.true_divide.Tensor": [(("a", "b"), ""), (("a",), "{other = 3}")],
    "aten.div.Tensor_mode": [(("a", "b"), '{rounding_mode = "floor"}'),
                             (("a", "b"), '{rounding_mode = "trunc"}')],
    "aten.pow.Tensor_Scalar": [(("a",), f"{{exponent = {e}}}") for e in (2, 3, 0.5, -1, 1.7)],
    "aten.pow.Tensor_Tensor": [(("a", "b"), "")],
    "aten.threshold_backward.default": [(("b", "a"), "{threshold = 0}")],
    "aten.gelu.default": [(("a",), ""), (("a",), '{approximate = "tanh"}')],
    "aten.gelu_backward.default": [(("b", "a"), ""), (("b", "a"), '{approximate = "tanh"}')],
    "aten.tanh_backward.default": [(("b", "a"), "")],
    "aten.sigmoid_backward.default": [(("b", "a"), "")],
    "aten.silu_backward.default": [(("b", "a"), "")],
    "aten.clamp.default": [(("a",), "{min = -1, max = 2}"), (("a",), "{min = 0}")],
    "aten.clamp_min.default": [(("a",), "{min = 0}")],
    "aten.clamp_max.default": [(("a",), "{max = 1}")],
    "aten.where.self": [(("c", "a", "b"), "")],
    "aten.masked_fill.Scalar": [(("a", "c"), f"{{value = {v}}}") for v in (-2.5, 0, 3, "-inf")],
    "aten.native_dropout_backward.default": [(("a", "c"), "{scale = 1.25}"),
                                             (("b", "c"), "{scale = 3.0}")],
    "aten.logical_and.default": [(("a", "b"), "")],
    "aten.logical_or.default": [(("a", "b"), "")],
    "aten.bitwise_and.Tensor": [(("a", "b"), "")],
    "aten.bitwise_or.Tensor": [(("a", "b"), "")],
    "aten._to_copy.default": [(("a",), f"{{dtype = #{d}}}") for d in
                              ("f32", "bf16", "f16", "f64", "b8")],
    "prims.convert_element_type.default": [(("a",), f"{{dtype = #{d}}}") for d in
                                           ("f32", "bf16", "f16", "f64")],
    # activations and the ops of models and optimizers (ops.ACTIVATIONS)
    "aten.leaky_relu.default": [(("a",), ""), (("a",), "{negative_slope = 0.2}")],
    "aten.hardtanh.default": [(("a",), ""), (("a",), "{min_val = -0.5, max_val = 2}")],
    "aten.elu.default": [(("a",), ""), (("a",), "{alpha = 0.5, scale = 2, input_scale = 1.5}")],
    "aten.celu.default": [(("a",), ""), (("a",), "{alpha = 2.5}")],
    "aten.softplus.default": [(("a",), ""), (("a",), "{beta = 2, threshold = 5}")],
    "aten.softshrink.default": [(("a",), ""), (("a",), "{lambd = 1.5}")],
    "aten.hardshrink.default": [(("a",), ""), (("a",), "{lambd = 1.5}")],
    "aten.logit.default": [(("a",), ""), (("a",), "{eps = 0.001}")],
    "aten.nan_to_num.default": [(("a",), ""), (("a",), "{nan = 1.5, posinf = 7, neginf = -8}")],
    "aten.fmod.Tensor": [(("a", "b"), "")],
    "aten.fmod.Scalar": [(("a",), "{other = 1.5}"), (("a",), "{other = -2}")],
    "aten.remainder.Tensor": [(("a", "b"), "")],
    "aten.remainder.Scalar": [(("a",), "{other = 1.5}"), (("a",), "{other = -2}")],
    "aten.copysign.Tensor": [(("a", "b"), "")],
    "aten.copysign.Scalar": [(("a",), "{other = -1}")],
    "aten.atan2.default": [(("a", "b"), "")],
    "aten.hypot.default": [(("a", "b"), "")],
    "aten.xlogy.Tensor": [(("a", "b"), "")],
    "aten.heaviside.default": [(("a", "b"), "")],
    "aten.logical_xor.default": [(("a", "b"), "")],
    "aten.bitwise_xor.Tensor": [(("a", "b"), "")],
    "aten.addcmul.default": [(("a", "b", "a"), ""), (("a", "b", "b"), "{value = 0.5}")],
    "aten.addcdiv.default": [(("a", "b", "a"), ""), (("b", "a", "b"), "{value = 0.5}")],
    "aten.lerp.Scalar": [(("a", "b"), "{weight = 0.25}"), (("a", "b"), "{weight = 0.75}")],
    "aten.lerp.Tensor": [(("a", "b", "b"), "")],
}
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    CASES[f"aten.{_name}.Tensor"] = [(("a", "b"), "")]
    CASES[f"aten.{_name}.Scalar"] = [(("a",), "{other = 0.5}")]


def cases_of(op: str) -> list[tuple[tuple[str, ...], str]]:
    return CASES.get(op, [(("a",), "")])


def values(dtype: str) -> dict[str, torch.Tensor]:
    torch_dtype = DTYPES[dtype]
    if dtype == "b8":
        a = torch.tensor([i % 3 == 0 for i in range(N)])
        b = torch.tensor([i % 2 == 0 for i in range(N)])
    elif torch_dtype.is_floating_point:
        a, b = torch.tensor(EDGE).to(torch_dtype), torch.tensor(OTHER).to(torch_dtype)
    else:
        info = torch.iinfo(torch_dtype)
        a = torch.tensor([(i * 37) % 23 - 11 for i in range(N)]).to(torch_dtype)
        a[0], a[1] = max(info.min, -100), min(info.max, 100)
        b = torch.tensor([(i * 11) % 7 - 3 or 1 for i in range(N)]).to(torch_dtype)
    return {"a": a, "b": b, "c": torch.tensor([i % 4 < 2 for i in range(N)])}


def op_line(registry, op: str, roles, attrs: str, dtype: str, out: str) -> str | None:
    """``%out = op(...) {attrs} : <inferred type>``; None when torch rejects the dtypes."""
    types = {"a": f"{dtype}[{N}]", "b": f"{dtype}[{N}]", "c": f"b8[{N}]"}
    params = ", ".join(f"%{r}: {types[r]}" for r in dict.fromkeys(roles))
    call = f"{op}({', '.join('%' + r for r in roles)}) {attrs}".strip()
    probe = parse_graph(f"graph @p({params}) {{\n  %{out} = {call} : f32[{N}]\n  return %{out}\n}}")
    try:
        inferred = registry.get(op).infer_types(next(probe.nodes))
    except Exception:
        return None
    if not inferred:
        return None
    return f"%{out} = {call} : {format_type(inferred[0])}"


DTYPE_LIST = ["f32", "f64", "bf16", "f16", "i64", "i32", "u8", "b8"]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPE_LIST)
def test_every_pointwise_op_matches_eager(registry, codegen, check, dtype):
    inputs = values(dtype)
    lines, results, declined = [], [], []
    for op in sorted(POINTWISE):
        for k, (roles, attrs) in enumerate(cases_of(op)):
            out = f"o{len(lines)}"
            line = op_line(registry, op, roles, attrs, dtype, out)
            if line is None:
                continue  # eager itself rejects this op on this dtype
            single = group_text(f"%a: {dtype}[{N}], %b: {dtype}[{N}], %c: b8[{N}]", line,
                                f"%{out}: {line.rsplit(': ', 1)[1]}")
            try:
                check.reference(single, inputs["a"], inputs["b"], inputs["c"])
            except (RuntimeError, NotImplementedError):
                continue  # eager itself rejects this op on this dtype
            reason = codegen.supports(next(parse_graph(single).nodes), registry)
            if reason is not None:  # declined: with a reason naming the op, never a crash
                assert reason.codegen == "cpu" and reason.message, op
                declined.append((op, reason.message))
                continue
            lines.append(line)
            results.append(f"%{out}: {line.rsplit(': ', 1)[1]}")
    text = group_text(f"%a: {dtype}[{N}], %b: {dtype}[{N}], %c: b8[{N}]", "\n".join(lines),
                      ", ".join(results))
    compiled = check.compile(text)
    args = (inputs["a"], inputs["b"], inputs["c"])
    got, want = compiled(*args), check.reference(text, *args)
    failures = []
    for line, g, w in zip(lines, got, want):
        try:
            compare([g], [w], rtol=4e-6 if g.dtype == torch.float32 else None,
                    atol=1e-5 if g.dtype == torch.float32 else None)
        except AssertionError as exc:
            failures.append(f"{line}\n got {g}\n want {w}\n{str(exc).splitlines()[-2:]}")
    assert not failures, f"inputs {args[0]}, {args[1]}\n" + "\n".join(failures)
    float_ops = {op for op, spec in POINTWISE.items() if spec.template is not None
                 and not (dtype == "f16" and op in F16_TO_EAGER)}  # (said so: below)
    if dtype == "f16":  # the special functions' f16 groups are declined, saying why
        compiled_ops = {line.split(" = ", 1)[1].split("(", 1)[0] for line in lines}
        assert not compiled_ops & F16_TO_EAGER, compiled_ops & F16_TO_EAGER
        assert {op for op, _ in declined} & F16_TO_EAGER
        assert all("in f16 are left to eager" in why for op, why in declined
                   if op in F16_TO_EAGER), declined
    if dtype in ("f32", "f64", "bf16", "f16"):  # every op runs on floats
        assert not [d for d in declined if d[0] in float_ops], declined
    assert len(lines) >= (60 if dtype in ("f32", "f64") else 15)


def _tensor_ops(registry, category: str) -> list[str]:
    names = []
    for packet_name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, packet_name, None)
        for overload in getattr(packet, "overloads", lambda: [])():
            name = f"aten.{packet_name}.{overload}"
            opdef = registry.lookup(name)
            if opdef is None or opdef.category != category or opdef.schema is None:
                continue
            args = [a for a in opdef.schema.arguments if not a.kwarg_only]
            if (len(args) == 1 and str(args[0].type) == "Tensor"
                    and len(opdef.schema.returns) == 1):
                names.append(name)
    return names


@pytest.mark.parametrize("category", ["pointwise", "reduction"])
def test_registry_ops_without_a_template_are_declined_with_a_reason(registry, codegen,
                                                                    category):
    table = POINTWISE if category == "pointwise" else REDUCTIONS
    found = _tensor_ops(registry, category)
    assert len(found) >= (30 if category == "pointwise" else 3)
    missing = [op for op in found if op not in table]
    if category == "reduction":  # any / all were the last ones (bugs.md item 1)
        assert missing == [], missing
    else:
        assert missing
    for op in missing:
        text = group_text("%a: f32[4, 8]", f"%o = {op}(%a) : f32[4, 8]", "%o: f32[4, 8]")
        reason = codegen.supports(next(parse_graph(text).nodes), registry)
        # declined through the codegen's capabilities (its op table), before any C
        assert reason is not None and reason.message == f"op {op} is not in its op table", \
            (op, reason)


#: reduction op -> attributes (IR text) reducing dim ``{d}`` of a [4, N] input
REDUCTION_CASES = {
    "aten.sum.dim_IntList": "{{dim = [{d}]}}",
    "aten.sum.default": "",
    "aten.prod.dim_int": "{{dim = {d}}}",
    "aten.prod.default": "",
    "aten.mean.dim": "{{dim = [{d}], keepdim = true}}",
    "aten.mean.default": "",
    "aten.amax.default": "{{dim = [{d}]}}",
    "aten.amin.default": "{{dim = [{d}], keepdim = true}}",
    "aten.max.default": "",
    "aten.min.default": "",
    "aten.var.correction": "{{dim = [{d}], correction = 1}}",
    "aten.var.dim": "{{dim = [{d}]}}",
    "aten.std.correction": "{{dim = [{d}], correction = 0}}",
    "aten.var_mean.correction": "{{dim = [{d}], correction = 1}}",
    "aten.argmax.default": "{{dim = {d}}}",
    "aten.argmin.default": "{{dim = {d}, keepdim = true}}",
    "aten.max.dim": "{{dim = {d}}}",
    "aten.min.dim": "{{dim = {d}}}",
    "aten.any.dim": "{{dim = {d}}}",
    "aten.any.dims": "{{dim = [{d}], keepdim = true}}",
    "aten.any.default": "",
    "aten.all.dim": "{{dim = {d}, keepdim = true}}",
    "aten.all.dims": "{{dim = [{d}]}}",
    "aten.all.default": "",
}


@pytest.mark.slow
@pytest.mark.parametrize("dim", [1, 0])
@pytest.mark.parametrize("dtype", ["f32", "f64", "bf16", "f16", "i32", "b8"])
def test_every_reduction_op_matches_eager(registry, codegen, check, dtype, dim):
    """Every reduction of the table on edge values (rows with NaN, +-inf, -0.0, denormals),
    over the rows (dim 1) and the columns (dim 0); the ops that reduce every dim go in a
    group of their own, as a group's reductions share their dims."""
    a = values(dtype)["a"].reshape(4, N // 4)
    assert set(REDUCTION_CASES) == set(REDUCTIONS)
    checked = 0
    for whole in (False, True):
        lines, results = [], []
        for op, attrs in sorted(REDUCTION_CASES.items()):
            if (attrs == "") != whole:
                continue
            call = f"{op}(%a) {attrs.format(d=dim)}"
            params = f"%a: {dtype}[4, {N // 4}]"
            probe = parse_graph(f"graph @p({params}) {{\n  %o = {call} : f32[4]\n"
                                f"  return %o\n}}")
            types = registry.get(op).infer_types(next(probe.nodes))
            if not types:
                continue  # torch rejects this reduction on this dtype
            outs = [f"%r{len(lines)}_{k}" for k in range(len(types))]
            line = f"{', '.join(outs)} = {call} : {', '.join(format_type(t) for t in types)}"
            returned = [f"{o}: {format_type(t)}" for o, t in zip(outs, types)]
            try:
                check.reference(group_text(params, line, ", ".join(returned)), a)
            except RuntimeError:
                continue  # eager rejects this reduction on this dtype
            lines.append(line)
            results += returned
        if not lines:
            continue
        text = group_text(f"%a: {dtype}[4, {N // 4}]", "\n".join(lines), ", ".join(results))
        reason = codegen.supports(next(parse_graph(text).nodes), registry)
        assert reason is None, reason
        _, compiled = check(text, a, rtol=1e-5 if dtype in ("f32", "f64") else None,
                            atol=1e-5 if dtype in ("f32", "f64") else None)
        checked += len(lines)
    assert checked >= (3 if dtype == "b8" else 8)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_gelu_probe_runs_under_fake_tensor_tracing(codegen, registry, dtype):
    """The probe of eager's GELU (ops.eager_gelu_form) first asked while torch traces with
    fake tensors (a GELU under torch.compile) declined the group with
    DataDependentOutputException; it computes on real tensors whatever mode is active, and
    names the form whose +inf is eager's."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torchloom_codegen_cpu import ops
    ops.eager_gelu_form.cache_clear()
    with FakeTensorMode():
        text = group_text(f"%a: {dtype}[4, 40]", f"%o = aten.gelu.default(%a) : {dtype}[4, 40]",
                          f"%o: {dtype}[4, 40]")
        assert codegen.supports(next(parse_graph(text).nodes), registry) is None
    form = ops.eager_gelu_form(dtype)
    assert form in ops.GELU_FORMS
    inf = torch.full((256,), float("inf"), dtype=DTYPES[dtype])
    assert (form == "tl_gelu_f32") == bool(torch.nn.functional.gelu(inf)[0].isnan())


def test_kernels_are_cached_apart_per_gelu_form(codegen, monkeypatch):
    """A kernel's C source calls the GELU form of the machine that generated it: the codegen's
    version names the forms, so the kernel cache's keys (disk, shared) differ between
    machines whose eager GELUs differ (an AVX-512 and an AVX2 one sharing a cache)."""
    from torchloom.runtime.cache import KernelCache

    from torchloom_codegen_cpu import ops
    text = group_text("%a: f32[4, 40]", "%o = aten.gelu.default(%a) : f32[4, 40]",
                      "%o: f32[4, 40]")
    group = next(parse_graph(text).nodes)
    here = KernelCache.key(codegen, group)
    assert ops.eager_gelu_form("f32") in codegen.version
    other = next(f for f in ops.GELU_FORMS if f != ops.eager_gelu_form("f32"))
    monkeypatch.setattr(ops, "eager_gelu_form", lambda dtype: other)
    assert KernelCache.key(codegen, group) != here
