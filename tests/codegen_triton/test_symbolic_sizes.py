"""Triton kernels over symbolic sizes (variants.py, launch.py, sizes.py): a group typed
``f32[s0, s1]`` compiles once into kernels that take the sizes as arguments; each call
evaluates them, allocates outputs, picks the variant (persistent or looped row, 32 or 64
bit indices) and the size bucket's config, and launches nothing for an empty iteration
space. Checked on the Triton interpreter against eager at several sizes, 1 and 0 among
them (tuning per bucket and launcher reuse: test_symbolic_launch.py)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import group_text, on_device
from test_random_groups import _type, pointwise_chain
from test_reduction import CASES as REDUCTIONS
from test_rows_and_columns import ln_backward
from torchloom.testing.reductions import EMPTY_ROWS
from torchloom.api import parse_graph, verify
from torchloom.runtime.executor import CompiledGraph
from torchloom.tools import EagerCodegen
from torchloom_codegen_triton import TritonCodegen
from torchloom_codegen_triton import launch
from torchloom_codegen_triton.launch import SymbolicLauncher

#: sizes every symbol takes in turn (the k-th symbol of a group takes the k-th of each)
SIZES = [(3, 5, 2), (1, 1, 1), (0, 4, 2), (4, 0, 3), (2, 9, 1), (5, 1, 4)]

#: reduction cases of test_reduction whose sizes are all made symbolic
SYMBOLIC_CASES = ["sum_last_dim", "sum_dim0_keepdim", "sum_all_dims", "sum_outer_dims",
                  "mean_middle_dim", "amax_amin_nan_inf", "var_mean_keepdim",
                  "argmax_argmin_ties_nan", "prologue_epilogue", "softmax", "softmax_dim0",
                  "layernorm", "layernorm_bf16", "rmsnorm"]

_TYPE = re.compile(r"\b(f32|bf16|i64|i32|b8)\[([0-9, ]*)\]")


def symbolize(text: str) -> tuple[str, list[str]]:
    """``text`` with every size above 1 a symbol (equal sizes, one symbol)."""
    sizes: dict[int, str] = {}

    def sub(m):
        dims = [d.strip() for d in m.group(2).split(",") if d.strip()]
        out = [sizes.setdefault(int(d), f"s{len(sizes)}") if int(d) > 1 else d for d in dims]
        return f"{m.group(1)}[{', '.join(out)}]"
    return _TYPE.sub(sub, text), list(sizes.values())


def inputs_for(graph, bindings: dict[str, int], seed: int = 0) -> list:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for v in graph.inputs:
        shape = [bindings.get(d, d) for d in v.type.shape]
        out.append((torch.randn(shape, generator=gen) * 3).to(v.type.torch_dtype))
    return out


def compile_group(codegen, registry, text: str):
    graph = parse_graph(text)
    verify(graph, registry)
    node = next(iter(graph.nodes))
    assert codegen.supports(node, registry) is None, codegen.supports(node, registry)
    return graph, codegen.load(codegen.generate(node, registry), registry)


def eager(text: str, registry, inputs):
    return CompiledGraph(parse_graph(text), registry, [EagerCodegen()])(*inputs)


def assert_matches(got, want, tolerance: float = 1e-4):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=tolerance, atol=tolerance, equal_nan=True)


@pytest.mark.slow
@pytest.mark.parametrize("max_persistent", [4096, 4], ids=["persistent", "looped"])
@pytest.mark.parametrize("name", SYMBOLIC_CASES)
def test_reductions_over_symbolic_sizes_match_eager(registry, tmp_path, name, max_persistent):
    text, names = symbolize(REDUCTIONS[name][0])
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False, max_persistent=max_persistent)
    graph, kernel = compile_group(codegen, registry, text)
    assert isinstance(kernel, SymbolicLauncher)
    compared = 0
    for sizes in SIZES:
        bindings = dict(zip(names, sizes))
        inputs = inputs_for(graph, bindings)
        try:
            want = eager(text, registry, inputs)
        except (RuntimeError, IndexError) as refused:  # amax of an empty row: the launch
            try:  # raises too, or its outputs are empty (a softmax's: torch.softmax's are)
                outputs = kernel(*inputs)
            except type(refused) as raised:
                assert str(raised) == str(refused)
            else:
                assert all(o.numel() == 0 for o in outputs), (sizes, refused)
            continue
        assert_matches(kernel(*inputs), want)
        compared += 1
    assert compared >= 4
    # one kernel, both forms: rows longer than its persistent variant holds loop
    limits = {v["kernel"]: v["max_rnumel"] for v in kernel.meta["variants"]}
    persistent = max(limit or 0 for limit in limits.values())
    for variant, bucket in kernel.launches:  # the split variant is a looped form
        looped = int(bucket.split(":")[2]) > persistent
        assert variant.endswith(("_looped", "_split")) == looped, (variant, bucket)
    if max_persistent == 4:
        assert {v.endswith(("_looped", "_split")) for v, _ in kernel.launches} == {True, False}


@pytest.mark.parametrize("name", sorted(EMPTY_ROWS))
def test_empty_symbolic_rows_raise_as_eager(registry, tmp_path, name):
    """A max, min, argmax or argmin over rows of symbolic length empty at a call: the
    launch raises eager's error (a kernel would return -inf); other sizes match eager."""
    text, empty = EMPTY_ROWS[name]
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False)
    _, kernel = compile_group(codegen, registry, text)
    a = torch.empty(empty)
    with pytest.raises((IndexError, RuntimeError)) as want:
        eager(text, registry, [a])
    with pytest.raises(want.type) as got:
        kernel(a)
    assert str(got.value) == str(want.value)
    a = torch.randn(3, 5)
    assert_matches(kernel(a), eager(text, registry, [a]))


def test_one_kernel_serves_every_size_and_empty_launches_nothing(registry, tmp_path):
    text = group_text("%a: f32[s0, s1], %b: f32[s1]", """
        %m = aten.mul.Tensor(%a, %b) : f32[s0, s1]
        %x = aten.amax.default(%m) {dim = [-1], keepdim = true} : f32[s0, 1]
        %d = aten.sub.Tensor(%m, %x) : f32[s0, s1]
        %e = aten.exp.default(%d) : f32[s0, s1]
        %t = aten.sum.dim_IntList(%e) {dim = [-1], keepdim = true} : f32[s0, 1]
        %y = aten.div.Tensor(%e, %t) : f32[s0, s1]""", "%y: f32[s0, s1]")

    class Counting(TritonCodegen):
        generated = 0

        def generate(self, group, registry):
            Counting.generated += 1
            return super().generate(group, registry)

    codegen = Counting(cache_dir=tmp_path, autotune=False, max_persistent=16)
    graph = parse_graph(text)
    compiled = CompiledGraph(graph, registry, [codegen, EagerCodegen()])
    assert [c.codegen for c in compiled.choices] == ["triton"]
    for rows, cols in [(3, 5), (1, 1), (6, 40), (2, 16), (0, 7), (4, 3)]:
        x, w = torch.randn(rows, cols), torch.randn(cols)
        (y,) = compiled(x, w)
        torch.testing.assert_close(y, torch.softmax(x * w, -1))
    assert Counting.generated == 1 and len(compiled.cache) == 1
    # the launcher itself: a 0-row call allocates and launches nothing
    _, kernel = compile_group(TritonCodegen(cache_dir=tmp_path, autotune=False,
                                            max_persistent=16), registry, text)
    (y,) = kernel(torch.randn(0, 9), torch.randn(9))
    assert y.shape == (0, 9) and not kernel.launches
    kernel(torch.randn(2, 9), torch.randn(9))
    kernel(torch.randn(3, 12), torch.randn(12))  # buckets: rows 4, rows of <= 16
    kernel(torch.randn(2, 40), torch.randn(40))  # a longer row: the looped variant
    # buckets: <variant>:<rows>:<row length>, each rounded up to a power of two
    assert [b for _, b in kernel.launches] == ["fused_mul_amax_sub_exp_sum_div:2:16",
                                                "fused_mul_amax_sub_exp_sum_div:4:16",
                                                "fused_mul_amax_sub_exp_sum_div_looped:2:64"]


def test_sizes_carried_by_expressions_and_int_inputs(registry, tmp_path):
    """A flattened input dim (``4*s0``) and int inputs of the group that a view takes as
    sizes (as Dynamo passes SymInts) give the kernel every size it needs."""
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False)
    text = group_text('%a: f32["4*s0", s1]', """
        %e = aten.exp.default(%a) : f32["4*s0", s1]""", '%e: f32["4*s0", s1]')
    _, kernel = compile_group(codegen, registry, text)
    assert kernel.meta["symbols"] == [["s0", 0, 0, 4], ["s1", 0, 1, 1]]
    for s0, s1 in [(2, 3), (1, 1), (0, 5)]:
        a = torch.randn(4 * s0, s1)
        torch.testing.assert_close(kernel(a)[0], a.exp())
    text = group_text('%a: f32["s0*s1", 8], %p: int, %q: int', """
        %v = aten.view.default(%a, %p, %q) {size = [$1, $2, 8]} : f32[s0, s1, 8]
        %s = aten.sum.dim_IntList(%v) {dim = [-1]} : f32[s0, s1]""", "%s: f32[s0, s1]")
    _, kernel = compile_group(codegen, registry, text)
    assert kernel.meta["symbols"] == [["s0", 1, -1, 1], ["s1", 2, -1, 1]]
    for s0, s1 in [(2, 3), (1, 1), (0, 5), (3, 0)]:
        a = torch.randn(s0 * s1, 8)
        torch.testing.assert_close(kernel(a, s0, s1)[0], a.view(s0, s1, 8).sum(-1))


def test_a_dim_that_is_the_output_s_or_one_broadcasts_by_its_size(registry, tmp_path):
    """A broadcast dim ``s1//s2`` to ``s1`` (valid where it is ``s1`` or 1): read modulo
    its size, right in both (the cpu codegen's test has the same group)."""
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False)
    text = group_text('%x: f32[s0, s1], %y: f32[s0, "s1//s2"], %z: f32[s2]', """
        %a = aten.add.Tensor(%x, %y) : f32[s0, s1]
        %b = aten.mul.Tensor(%a, %y) : f32[s0, s1]""", "%b: f32[s0, s1]")
    _, kernel = compile_group(codegen, registry, text)
    for rows, cols, s2 in [(3, 5, 1), (3, 5, 4), (1, 67, 40), (2, 16, 16), (0, 4, 1)]:
        x, y, z = torch.randn(rows, cols), torch.randn(rows, cols // s2), torch.randn(s2)
        torch.testing.assert_close(kernel(x, y, z)[0], (x + y) * y)


def test_a_size_carrier_is_read_for_its_shape_only(registry, tmp_path, monkeypatch):
    """A group passed a graph input for its shape (fusion.size-carriers): ``s0`` is read
    from it, nothing is loaded from it, and it is never copied to a layout."""
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False)
    half = "CeilToInt(IntTrueDiv(s0,2))"
    text = group_text(f'%p: f32["{half}", 4], %c: f32[s0, 4]', f"""
        %t = aten.mul.Tensor(%p) {{other = 2}} : f32["{half}", 4]""", f'%t: f32["{half}", 4]')
    _, kernel = compile_group(codegen, registry, text)
    assert kernel.meta["inputs"][1]["unread"]
    monkeypatch.setattr(torch.Tensor, "contiguous", lambda *a, **k: pytest.fail("copied"))
    for n in (1, 6, 7, 40):
        p, carrier = torch.randn((n + 1) // 2, 4), torch.randn(4, n).t()  # (not contiguous)
        torch.testing.assert_close(kernel(p, carrier)[0], p * 2)
    text = group_text(f'%p: f32["{half}", 4], %n: int[s0]', f"""
        %t = aten.mul.Tensor(%p) {{other = 2}} : f32["{half}", 4]""", f'%t: f32["{half}", 4]')
    _, kernel = compile_group(codegen, registry, text)  # an int that is s0 carries it
    for n in (1, 6, 7, 40):
        p = torch.randn((n + 1) // 2, 4)
        torch.testing.assert_close(kernel(p, n)[0], p * 2)


def test_a_slice_whose_start_is_a_graph_value_reads_from_its_type(registry, tmp_path):
    """MPT's ALiBi bias at dynamic lengths: ``bias[:, max(0, 64 - s):]``, its start a graph
    value, is read at the slice's end less the length its type holds."""
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False)
    length = "64-Max(0,64-s1)"
    text = group_text(f'%b: f32[4, 64], %st: int, %x: f32[4, "{length}"], %n: int[s1]', f"""
        %v = aten.slice.Tensor(%b, %st) {{dim = 1, end = 9223372036854775807}} : f32[4, "{length}"]
        %y = aten.add.Tensor(%x, %v) : f32[4, "{length}"]""", f'%y: f32[4, "{length}"]')
    _, kernel = compile_group(codegen, registry, text)
    bias = torch.randn(4, 64)
    for n in (5, 63, 64, 100):
        start = max(0, 64 - n)
        x = torch.randn_like(bias[:, start:])
        torch.testing.assert_close(kernel(bias, start, x, n)[0], x + bias[:, start:])


def test_row_and_column_reductions_over_symbolic_rows(registry, tmp_path):
    """The layer-norm backward (rows_and_columns.py) with a symbolic row count: the launcher sizes
    the programs (``kprog``) and the partials per call; 0 rows still give column sums."""
    text = ln_backward("s0", 24)
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False)
    graph, kernel = compile_group(codegen, registry, text)
    assert kernel.meta["form"] == "row and column reduction"
    for rows in (5, 1, 0, 300):
        inputs = inputs_for(graph, {"s0": rows})  # products of values up to ~10: 1e-3
        assert_matches(kernel(*inputs), eager(text, registry, inputs), 1e-3)
    # a symbolic row length would need the rows held whole at every size: declined
    text = group_text("%a: f32[s0, s1]", """
        %r = aten.sum.dim_IntList(%a) {dim = [-1]} : f32[s0]
        %c = aten.sum.dim_IntList(%a) {dim = [0]} : f32[s1]""", "%r: f32[s0], %c: f32[s1]")
    reason = codegen.supports(next(iter(parse_graph(text).nodes)), registry)
    assert "need a static row length (it is s1)" in str(reason)


def test_wide_launches_take_the_64_bit_variant(registry, tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "_WIDE", 64)  # as if 64 elements were 2**31
    text, names = symbolize(REDUCTIONS["layernorm"][0])
    _, kernel = compile_group(TritonCodegen(cache_dir=tmp_path, autotune=False,
                                            max_persistent=8), registry, text)
    graph = parse_graph(text)
    for rows, cols in [(3, 5), (4, 20), (9, 8)]:
        inputs = inputs_for(graph, dict(zip(names, (rows, cols))))
        assert_matches(kernel(*inputs), eager(text, registry, inputs))
    # few elements, but an input viewing a large storage: its offsets may be wide
    inputs = inputs_for(graph, dict(zip(names, (3, 5))))
    inputs[1] = torch.randn(200)[100:105]
    assert_matches(kernel(*inputs), eager(text, registry, inputs))
    assert [v for v, _ in kernel.launches] == [
        "fused_var_mean_add_rsqrt_sub_mul", "fused_var_mean_add_rsqrt_sub_mul_looped_i64",
        "fused_var_mean_add_rsqrt_sub_mul_i64", "fused_var_mean_add_rsqrt_sub_mul_i64"]


# ---- random groups (hypothesis) ---------------------------------------------------------
UNARY = ["aten.tanh.default", "aten.sigmoid.default", "aten.relu.default", "aten.exp.default",
         "aten.neg.default"]
BINARY = ["aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.maximum.default"]
REDUCE = {"aten.sum.dim_IntList": "f32", "aten.amax.default": "f32",
          "aten.mean.dim": "f32", "aten.argmax.default": "i64"}


@st.composite
def symbolic_group(draw):
    """Pointwise chains over broadcasting inputs of symbolic sizes (one maybe transposed),
    maybe ending in a last-dim reduction (softmax-like when it is amax and the chain goes
    on)."""
    full = ("s0", "s1")
    shapes = draw(st.lists(st.sampled_from([full, ("s1",), ("s0", 1), (1, "s1"), ()]),
                           min_size=1, max_size=3))
    shapes[0] = full
    transposed = draw(st.booleans())
    start = ["%bt = aten.t.default(%b) : f32[s0, s1] strided[1, s0]"] if transposed else []
    lines, values = pointwise_chain(draw, shapes, draw(st.integers(1, 4)), UNARY, BINARY,
                                    [("%bt", full)] if transposed else ())
    lines = start + lines
    last, shape = max(values[len(shapes) + transposed:], key=lambda v: len(v[1]))
    results = [f"{last}: {_type(shape)}"]
    op = None
    if shape == full and draw(st.booleans()):
        op = draw(st.sampled_from(sorted(REDUCE)))
        keep = op != "aten.argmax.default" and draw(st.booleans())
        dim = "-1" if op == "aten.argmax.default" else "[-1]"
        out = ("s0", 1) if keep else ("s0",)
        lines.append(f"%r = {op}({last}) {{dim = {dim}, keepdim = {str(keep).lower()}}} : "
                     f"{_type(out, REDUCE[op])}")
        results.append(f"%r: {_type(out, REDUCE[op])}")
        if keep:  # an epilogue reading the row result at every element
            lines.append(f"%y = aten.sub.Tensor({last}, %r) : {_type(full)}")
            results.append(f"%y: {_type(full)}")
    params = ", ".join([f"%a{i}: {_type(s)}" for i, s in enumerate(shapes)] +
                       ["%b: f32[s1, s0]"] * transposed)
    return group_text(params, "\n".join(lines), ", ".join(results)), draw(st.integers(0, 99))


def test_random_symbolic_groups_match_eager_at_several_sizes(registry, tmp_path, fuzz):
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False, max_persistent=8)

    @settings(max_examples=200 if fuzz else 12, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(symbolic_group())
    def run(case):
        text, seed = case
        graph, kernel = compile_group(codegen, registry, text)
        for s0, s1 in [(3, 5), (1, 1), (1, 6), (4, 1), (0, 3), (2, 0), (2, 11), (17, 20)]:
            inputs = inputs_for(graph, {"s0": s0, "s1": s1}, seed)
            try:
                want = eager(text, registry, inputs)
            except (RuntimeError, IndexError):  # eager refuses (amax of an empty row)
                continue
            assert_matches(kernel(*inputs), want)
    run()


# ---- explain --target sm_90 on a symbolic graph -------------------------------------------
DYNAMIC_WORKLOAD = """
import torch

def workload(device="cpu"):
    w, b = torch.randn(48, device=device), torch.randn(48, device=device)

    def f(x):
        y = torch.nn.functional.layer_norm(x, (48,), w, b)
        e = (y - y.amax(-1, keepdim=True)).exp()
        return e / e.sum(-1, keepdim=True)
    return f, [torch.randn(8, 48, device=device)]
"""


def test_explain_target_builds_the_symbolic_kernels_for_sm90(tmp_path, capsys):
    from torchloom.cli import main
    path = tmp_path / "work.py"
    path.write_text(DYNAMIC_WORKLOAD)
    assert main(["explain", str(path), "--target", "sm_90", "--json", "--dynamic"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert not [f for f in data["fallbacks"] if "symbolic" in f["reason"] or "size" in
                f["reason"]], data["fallbacks"]
    kernels = [k for k in data["kernel_details"] if k["codegen"] == "triton"]
    assert kernels and all(k["registers"] > 0 and k["spills"] == 0 for k in kernels)
    assert all(k["grid"] == [] for k in kernels)  # no plan: the grid depends on the sizes


# ---- a model over many sizes, forward and backward, every group on triton ------------------
class _Block(torch.nn.Module):
    """Layer norms, attention over a variable sequence, a GELU MLP, residuals."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.fc = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = q @ k.transpose(-2, -1) * 0.5
        att = (att - att.amax(-1, keepdim=True)).exp()
        att = att / att.sum(-1, keepdim=True)
        x = x + (att @ v).transpose(1, 2).reshape(b, s, d)
        return x + torch.nn.functional.gelu(self.fc(self.ln2(x)))


@pytest.mark.slow
def test_a_model_over_many_sizes_compiles_once_on_triton(monkeypatch):
    import copy
    from torchloom.tools import Compiler
    monkeypatch.setenv("TORCHLOOM_TRITON_CPU", "1")
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Block()
    reference = copy.deepcopy(model)
    compiler = Compiler("default", compile_cache=False)
    compiled = torch.compile(model, backend="torchloom", options={"compiler": compiler},
                             dynamic=True)
    try:
        for batch, seq in [(2, 8), (3, 5), (4, 12), (2, 3), (5, 7)]:
            x = torch.randn(batch, seq, 16)
            x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
            got, want = compiled(x1), reference(x2)
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
            weights = torch.randn_like(want)
            (got * weights).sum().backward()
            (want * weights).sum().backward()
            torch.testing.assert_close(x1.grad, x2.grad, atol=1e-4, rtol=1e-4)
            for p, q in zip(model.parameters(), reference.parameters()):
                torch.testing.assert_close(p.grad, q.grad, atol=1e-3, rtol=1e-3)
                p.grad = q.grad = None
    finally:
        torch._dynamo.reset()
    assert len(compiler.compilations) == 2  # forward and backward, once for every size
    for comp in compiler.compilations:
        assert comp.fallback_reason is None and comp.compiled.fallback_calls == 0
        choices = comp.compiled.choices
        assert choices and all(c.codegen == "triton" for c in choices), [
            str(r) for c in choices for r in c.fallback_reasons]


def test_long_reductions_with_few_rows_are_split_per_call(registry, tmp_path):
    """split.py over symbolic sizes: chunk and split count are arguments, chosen per call
    where the row blocks are few; more rows take the looped variant of the same kernel."""
    text = group_text("%a: f32[s0, s1]", """
        %s = aten.sum.dim_IntList(%a) {dim = [1]} : f32[s0]
        %n = aten.sqrt.default(%s) : f32[s0]""", "%n: f32[s0]")
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False, max_persistent=8)
    graph, kernel = compile_group(codegen, registry, text)
    for rows, cols in [(2, 100), (1, 1), (0, 40), (3, 0), (300, 20)]:
        inputs = [x.abs() for x in inputs_for(graph, {"s0": rows, "s1": cols})]
        assert_matches(kernel(*inputs), eager(text, registry, inputs), 1e-3)
    assert [v for v, _ in kernel.launches] == ["fused_sum_sqrt_split", "fused_sum_sqrt",
                                               "fused_sum_sqrt", "fused_sum_sqrt_looped"]
    target = codegen.for_target("sm_90")
    built = target.compile_for_target(target.generate(next(iter(
        on_device(parse_graph(text), "cuda").nodes)), registry))
    names = [v["kernel"] for v in built["variants"]]
    assert "fused_sum_sqrt_split" in names and "fused_sum_sqrt_split_i64" in names
    assert built["registers"] > 0 and built["spills"] == 0


def test_transposed_inputs_take_the_tiled_variant_when_dims_are_long(registry, tmp_path):
    """tiles.py over symbolic sizes: x.t() + y in [YBLOCK, XBLOCK] tiles where both tile
    dims reach MIN_TILE_DIM at the call, the plain walk otherwise; one kernel."""
    text = group_text("%a: f32[s1, s0], %b: f32[s0, s1]", """
        %t = aten.t.default(%a) : f32[s0, s1] strided[1, s0]
        %y = aten.add.Tensor(%t, %b) : f32[s0, s1]""", "%y: f32[s0, s1]")
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False)
    graph, kernel = compile_group(codegen, registry, text)
    for s0, s1 in [(40, 20), (3, 50), (1, 1), (0, 30), (17, 70)]:
        inputs = inputs_for(graph, {"s0": s0, "s1": s1})
        assert_matches(kernel(*inputs), eager(text, registry, inputs))
    assert [v for v, _ in kernel.launches] == ["fused_add_tiled", "fused_add",
                                               "fused_add", "fused_add_tiled"]
    target = codegen.for_target("sm_90")
    built = target.compile_for_target(target.generate(next(iter(
        on_device(parse_graph(text), "cuda").nodes)), registry))
    assert [v["kernel"] for v in built["variants"]] == ["fused_add", "fused_add_tiled",
                                                        "fused_add_i64"]
    assert built["spills"] == 0


def test_a_symbolic_kernel_is_read_back_from_the_disk_cache(registry, tmp_path):
    """The kernel cache stores a symbolic kernel's source and JSON metadata; a second
    process (a fresh cache over the same directory) compiles nothing, and groups equal up
    to their symbols' names share the entry."""
    from torchloom.tools import KernelCache
    text = group_text("%a: f32[s0, s1]", """
        %x = aten.amax.default(%a) {dim = [-1], keepdim = true} : f32[s0, 1]
        %y = aten.sub.Tensor(%a, %x) : f32[s0, s1]""", "%y: f32[s0, s1]")
    renamed = text.replace("s0", "n").replace("s1", "m")
    codegen = TritonCodegen(cache_dir=tmp_path / "triton", autotune=False)
    first = KernelCache(tmp_path / "kernels")
    first.get_or_compile(codegen, next(iter(parse_graph(text).nodes)), registry)
    second = KernelCache(tmp_path / "kernels")
    kernel = second.get_or_compile(codegen, next(iter(parse_graph(renamed).nodes)), registry)
    assert second.stats()["compiles"] == 0 and second.disk_hits == 1
    for rows, cols in [(3, 7), (0, 2), (1, 1)]:
        x = torch.randn(rows, cols)
        torch.testing.assert_close(kernel(x)[0], x - x.amax(-1, keepdim=True))


def test_outputs_equal_in_size_only_past_a_threshold_are_not_one_walk(registry, tmp_path):
    """A chunked loss's gradient at dynamic sizes: the first chunk's ``Max(1, Min(8, s0))``
    weights and all 8 rows' come out of one group. The sizes are equal only from ``s0 =
    8`` (judged equal at large sizes alone, the cpu codegen walked both by the chunk's
    loop: tests/codegen_cpu): triton's pointwise kernel walks one element count, so it
    declines the group."""
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False)
    chunk = '"Max(1,Min(8,s0))"'
    text = group_text(f'%g: f32[8], %n: int, %c: int[s0]', f"""
        %w = aten.mul.Tensor(%g) {{other = -2}} : f32[8]
        %first = aten.slice.Tensor(%w, %n) {{dim = 0, start = 0}} : f32[{chunk}]""",
        f"%first: f32[{chunk}], %w: f32[8]")
    graph = parse_graph(text)
    reason = codegen.supports(next(iter(graph.nodes)), registry)
    assert reason is not None and "different element counts" in reason.message
