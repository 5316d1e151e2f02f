"""Reduction kernels (reduction.py, kernel.py): every reduction kind over last and other dims,
with prologues and epilogues, several reductions per row (softmax, layernorm, RMSNorm), edge
values; each in the persistent form and in the looped form (forced by a tiny
``max_persistent``), on the Triton interpreter, compared with eager."""

from __future__ import annotations

import pytest
import torch

from conftest import Checker, group_text
from torchloom.api import parse_graph
from torchloom.tools import EagerCodegen
from torchloom.runtime.executor import CompiledGraph
from torchloom_codegen_triton import TritonCodegen

g = torch.Generator().manual_seed(1)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype)


def with_nans(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t[1, 3] = float("nan")
    t[2, 0] = float("inf")
    return t


CASES = {
    "sum_last_dim": (group_text("%a: f32[6, 10]", """
        %s = aten.sum.dim_IntList(%a) {dim = [-1]} : f32[6]""", "%s: f32[6]"),
        lambda: (randn(6, 10),)),
    "sum_dim0_keepdim": (group_text("%a: f32[9, 7]", """
        %s = aten.sum.dim_IntList(%a) {dim = [0], keepdim = true} : f32[1, 7]""",
        "%s: f32[1, 7]"), lambda: (randn(9, 7),)),
    "sum_all_dims": (group_text("%a: f32[5, 6]", """
        %s = aten.sum.default(%a) : f32[]""", "%s: f32[]"), lambda: (randn(5, 6),)),
    "sum_outer_dims": (group_text("%a: f32[3, 4, 5]", """
        %s = aten.sum.dim_IntList(%a) {dim = [0, 2]} : f32[4]""", "%s: f32[4]"),
        lambda: (randn(3, 4, 5),)),
    "sum_int_to_i64": (group_text("%a: i32[4, 6]", """
        %s = aten.sum.dim_IntList(%a) {dim = [1]} : i64[4]""", "%s: i64[4]"),
        lambda: (torch.randint(-100, 100, (4, 6), generator=g, dtype=torch.int32),)),
    "column_sum_long": (group_text("%a: f32[100, 6]", """
        %s = aten.sum.dim_IntList(%a) {dim = [0]} : f32[6]""", "%s: f32[6]"),
        lambda: (randn(100, 6),)),
    "mean_middle_dim": (group_text("%a: f32[3, 5, 4]", """
        %s = aten.mean.dim(%a) {dim = [1]} : f32[3, 4]""", "%s: f32[3, 4]"),
        lambda: (randn(3, 5, 4),)),
    "amax_amin_nan_inf": (group_text("%a: f32[4, 8]", """
        %x = aten.amax.default(%a) {dim = [1]} : f32[4]
        %n = aten.amin.default(%a) {dim = [1], keepdim = true} : f32[4, 1]""",
        "%x: f32[4], %n: f32[4, 1]"), lambda: (with_nans(randn(4, 8)),)),
    "var_unbiased": (group_text("%a: f32[5, 12]", """
        %v = aten.var.correction(%a) {dim = [-1], correction = 1} : f32[5]""", "%v: f32[5]"),
        lambda: (randn(5, 12) * 3 + 100,)),
    "var_mean_keepdim": (group_text("%a: f32[5, 12]", """
        %v, %m = aten.var_mean.correction(%a) {dim = [-1], correction = 0, keepdim = true} : f32[5, 1], f32[5, 1]""",  # noqa: E501
        "%v: f32[5, 1], %m: f32[5, 1]"), lambda: (randn(5, 12),)),
    "var_of_one_element_is_nan": (group_text("%a: f32[4, 1]", """
        %v = aten.var.correction(%a) {dim = [-1], correction = 1} : f32[4]""", "%v: f32[4]"),
        lambda: (randn(4, 1),)),
    "argmax_argmin_ties_nan": (group_text("%a: f32[4, 9]", """
        %x = aten.argmax.default(%a) {dim = 1} : i64[4]
        %n = aten.argmin.default(%a) {dim = 1, keepdim = true} : i64[4, 1]""",
        "%x: i64[4], %n: i64[4, 1]"),
        lambda: (with_nans(torch.randint(0, 3, (4, 9), generator=g).float()),)),
    "max_min_dim_values_and_indices": (group_text("%a: f32[4, 9]", """
        %v, %i = aten.max.dim(%a) {dim = 1} : f32[4], i64[4]
        %w, %j = aten.min.dim(%a) {dim = 1, keepdim = true} : f32[4, 1], i64[4, 1]""",
        "%v: f32[4], %i: i64[4], %w: f32[4, 1], %j: i64[4, 1]"),
        lambda: (with_nans(torch.randn(4, 9, generator=g)),)),
    "outputs_viewed_to_other_shapes": (group_text("%a: f32[6, 8]", """
        %s = aten.sum.dim_IntList(%a) {dim = [-1], keepdim = true} : f32[6, 1]
        %y = aten.div.Tensor(%a, %s) : f32[6, 8]
        %r = aten.view.default(%y) {size = [2, 3, 8]} : f32[2, 3, 8]
        %q = aten.view.default(%s) {size = [3, 2]} : f32[3, 2]""",
        "%r: f32[2, 3, 8], %q: f32[3, 2]"), lambda: (randn(6, 8).abs() + 0.5,)),
    "prologue_epilogue": (group_text("%a: f32[6, 10], %b: f32[10]", """
        %e = aten.exp.default(%a) : f32[6, 10]
        %m = aten.mul.Tensor(%e, %b) : f32[6, 10]
        %s = aten.sum.dim_IntList(%m) {dim = [-1]} : f32[6]
        %r = aten.add.Tensor(%s) {other = 1.0} : f32[6]""", "%r: f32[6]"),
        lambda: (randn(6, 10), randn(10))),
    "softmax": (group_text("%a: f32[8, 20]", """
        %x = aten.amax.default(%a) {dim = [-1], keepdim = true} : f32[8, 1]
        %s = aten.sub.Tensor(%a, %x) : f32[8, 20]
        %e = aten.exp.default(%s) : f32[8, 20]
        %t = aten.sum.dim_IntList(%e) {dim = [-1], keepdim = true} : f32[8, 1]
        %y = aten.div.Tensor(%e, %t) : f32[8, 20]""", "%y: f32[8, 20]"),
        lambda: (randn(8, 20) * 5,)),
    "softmax_dim0": (group_text("%a: f32[12, 5]", """
        %x = aten.amax.default(%a) {dim = [0], keepdim = true} : f32[1, 5]
        %s = aten.sub.Tensor(%a, %x) : f32[12, 5]
        %e = aten.exp.default(%s) : f32[12, 5]
        %t = aten.sum.dim_IntList(%e) {dim = [0], keepdim = true} : f32[1, 5]
        %y = aten.div.Tensor(%e, %t) : f32[12, 5]""", "%y: f32[12, 5]"),
        lambda: (randn(12, 5),)),
    "layernorm": (group_text("%a: f32[6, 16], %w: f32[16], %b: f32[16]", """
        %v, %m = aten.var_mean.correction(%a) {dim = [-1], correction = 0, keepdim = true} : f32[6, 1], f32[6, 1]
        %ve = aten.add.Tensor(%v) {other = 1e-05} : f32[6, 1]
        %r = aten.rsqrt.default(%ve) : f32[6, 1]
        %c = aten.sub.Tensor(%a, %m) : f32[6, 16]
        %n = aten.mul.Tensor(%c, %r) : f32[6, 16]
        %nw = aten.mul.Tensor(%n, %w) : f32[6, 16]
        %y = aten.add.Tensor(%nw, %b) : f32[6, 16]""",  # noqa: E501
        "%y: f32[6, 16], %m: f32[6, 1], %r: f32[6, 1]"),
        lambda: (randn(6, 16) * 2 + 1, randn(16), randn(16))),
    "layernorm_bf16": (group_text("%a: bf16[4, 24], %w: bf16[24]", """
        %f = prims.convert_element_type.default(%a) {dtype = #f32} : f32[4, 24]
        %v, %m = aten.var_mean.correction(%f) {dim = [-1], correction = 0, keepdim = true} : f32[4, 1], f32[4, 1]
        %ve = aten.add.Tensor(%v) {other = 1e-05} : f32[4, 1]
        %r = aten.rsqrt.default(%ve) : f32[4, 1]
        %c = aten.sub.Tensor(%f, %m) : f32[4, 24]
        %n = aten.mul.Tensor(%c, %r) : f32[4, 24]
        %nw = aten.mul.Tensor(%n, %w) : f32[4, 24]
        %y = prims.convert_element_type.default(%nw) {dtype = #bf16} : bf16[4, 24]""",  # noqa: E501
        "%y: bf16[4, 24]"),
        lambda: (randn(4, 24, dtype=torch.bfloat16), randn(24, dtype=torch.bfloat16))),
    "rmsnorm": (group_text("%a: f32[5, 16], %w: f32[16]", """
        %p = aten.pow.Tensor_Scalar(%a) {exponent = 2} : f32[5, 16]
        %m = aten.mean.dim(%p) {dim = [-1], keepdim = true} : f32[5, 1]
        %e = aten.add.Tensor(%m) {other = 1e-06} : f32[5, 1]
        %r = aten.rsqrt.default(%e) : f32[5, 1]
        %n = aten.mul.Tensor(%a, %r) : f32[5, 16]
        %y = aten.mul.Tensor(%n, %w) : f32[5, 16]""", "%y: f32[5, 16]"),
        lambda: (randn(5, 16), randn(16))),
    "empty_rows_sum_and_mean": (group_text("%a: f32[3, 0]", """
        %s = aten.sum.dim_IntList(%a) {dim = [-1]} : f32[3]
        %m = aten.mean.dim(%a) {dim = [-1]} : f32[3]""", "%s: f32[3], %m: f32[3]"),
        lambda: (randn(3, 0),)),
    # all-size-1 rows and reduced dims: every coordinate is element 0 (the shared index
    # math's rule, which the cpu codegen needed; the masks keep Triton right either way)
    "size_one_dims_reduced": (group_text("%a: bf16[1, 1]", """
        %v = aten.add.Tensor(%a, %a) : bf16[1, 1]
        %r = aten.sum.dim_IntList(%v) {dim = [0]} : bf16[1]""", "%v: bf16[1, 1], %r: bf16[1]"),
        lambda: (torch.tensor([[1.5]], dtype=torch.bfloat16),)),
    "size_one_dims_keepdim": (group_text("%a: f32[1, 5, 1]", """
        %s = aten.amax.default(%a) {dim = [1], keepdim = true} : f32[1, 1, 1]
        %d = aten.sub.Tensor(%a, %s) : f32[1, 5, 1]""", "%d: f32[1, 5, 1], %s: f32[1, 1, 1]"),
        lambda: (randn(1, 5, 1),)),
}


@pytest.fixture(params=["persistent", "looped"])
def form_check(request, registry, tmp_path):
    limit = 4096 if request.param == "persistent" else 4
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False, max_persistent=limit)
    return request.param, Checker(registry, codegen)


@pytest.mark.parametrize("name", sorted(CASES))
def test_reduction_matches_eager(form_check, name):
    form, check = form_check
    text, inputs = CASES[name]
    _, compiled = check(text, *inputs())
    kernel = check.codegen.generate(compiled.choices[0].node, check.registry)
    looped = "for roff in range(" in kernel.source
    rnumel = kernel.metadata["rnumel"]
    # a column reduction (kept dims innermost) loops over chunks once rows exceed 64
    column = name.startswith(("column", "sum_dim0", "softmax_dim0", "mean_middle"))
    assert looped == (rnumel > 4 if form == "looped" else column and rnumel > 64)
    # looped reductions with a small output are split into chunks (split.py)
    form = "split reduction" if "splits" in kernel.metadata else "looped reduction"
    assert kernel.metadata["form"] == (form if looped else "persistent reduction")


def test_several_reductions_share_one_kernel(form_check):
    """softmax's two reductions and its epilogue are one group and one kernel."""
    _, check = form_check
    text, inputs = CASES["softmax"]
    _, compiled = check(text, *inputs())
    assert len(compiled.choices) == 1 and len(compiled.cache) == 1
    source = check.codegen.generate(compiled.choices[0].node, check.registry).source
    assert source.count("tl.reduce(") == 2


def test_var_of_one_element_is_nan(check):
    text, inputs = CASES["var_of_one_element_is_nan"]
    (v,), _ = check(text, *inputs())
    assert torch.isnan(v).all()


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(CASES))
def test_reduction_matches_eager_on_cuda(registry, codegen, name):
    text, inputs = CASES[name]
    Checker(registry, codegen, "cuda")(text, *inputs())



def test_a_row_of_negative_zeros_sums_to_positive_zero(form_check):
    """Eager's sum starts from +0.0; a persistent row without padding lanes must too."""
    _, check = form_check
    text = group_text("%a: f32[3, 4]", """
        %s = aten.sum.dim_IntList(%a) {dim = [-1]} : f32[3]
        %m = aten.mean.dim(%a) {dim = [-1]} : f32[3]""", "%s: f32[3], %m: f32[3]")
    x = torch.full((3, 4), -0.0)
    got, _ = check(text, x)
    want = (x.sum(-1), x.mean(-1))
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a.signbit(), b.signbit()) and not b.signbit().any(), (a, b)


#: reductions of a 0-d tensor (torch accepts dim 0 and -1 for it): op, attributes, out types
ZERO_DIM = {
    "sum": ("aten.sum.dim_IntList", "dim = [{d}]", ["f32"]),
    "mean": ("aten.mean.dim", "dim = [{d}]", ["f32"]),
    "amax": ("aten.amax.default", "dim = [{d}]", ["f32"]),
    "amin": ("aten.amin.default", "dim = [{d}]", ["f32"]),
    "argmax": ("aten.argmax.default", "dim = {d}", ["i64"]),
    "argmin": ("aten.argmin.default", "dim = {d}", ["i64"]),
    "max_dim": ("aten.max.dim", "dim = {d}", ["f32", "i64"]),
    "min_dim": ("aten.min.dim", "dim = {d}", ["f32", "i64"]),
    "var": ("aten.var.correction", "dim = [{d}], correction = 1", ["f32"]),
    "var_biased": ("aten.var.correction", "dim = [{d}], correction = 0", ["f32"]),
    "std": ("aten.std.correction", "dim = [{d}], correction = 1", ["f32"]),
    "var_mean": ("aten.var_mean.correction", "dim = [{d}], correction = 0", ["f32", "f32"]),
}


def zero_dim_group(name: str, dim: int, keepdim: bool, masked: bool) -> str:
    """``ZERO_DIM[name]`` over a 0-d input (``masked``: over ``where(mask, input, fill)``)."""
    op, attrs, types = ZERO_DIM[name]
    attrs = attrs.format(d=dim) + (", keepdim = true" if keepdim else "")
    names = [f"%r{i}" for i in range(len(types))]
    params, src, body = "%a: f32[]", "%a", []
    if masked:
        params += ", %m: b8[], %f: f32[]"
        body.append("%w = aten.where.self(%m, %a, %f) : f32[]")
        src = "%w"
    body.append(f"{', '.join(names)} = {op}({src}) {{{attrs}}} : "
                f"{', '.join(t + '[]' for t in types)}")
    results = ", ".join(f"{n}: {t}[]" for n, t in zip(names, types))
    return group_text(params, "\n".join(body), results)


@pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0:UserWarning")
@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
@pytest.mark.parametrize("keepdim", [False, True], ids=["", "keepdim"])
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("name", sorted(ZERO_DIM))
def test_reductions_of_a_0d_tensor_match_eager(check, name, dim, keepdim, masked):
    """A 0-d reduction reduces its one element: the value itself for sum/amax/max, 0 for
    the indices, NaN for a variance without degrees of freedom; signed zeros as eager."""
    text = zero_dim_group(name, dim, keepdim, masked)
    for value in (1.5, -0.0, float("nan"), float("inf"), float("-inf")):
        x = torch.tensor(value)
        cases = [(x, torch.tensor(True), torch.tensor(2.0)),
                 (torch.tensor(2.0), torch.tensor(False), x)] if masked else [(x,)]
        for inputs in cases:
            got, _ = check(text, *inputs, rtol=0, atol=0)  # values, dtypes, NaN as eager
            want = CompiledGraph(parse_graph(text), check.registry, [EagerCodegen()])(*inputs)
            for a, b in zip(got, want, strict=True):
                assert a.shape == () and torch.equal(a.signbit(), b.signbit()), (inputs, a, b)
