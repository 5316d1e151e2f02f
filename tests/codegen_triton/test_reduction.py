"""Reduction kernels (reduction.py, kernel.py): every reduction kind over last and other dims,
with prologues and epilogues, several reductions per row (softmax, layernorm, RMSNorm), edge
values; each in the persistent form and in the looped form (forced by a tiny
``max_persistent``), on the Triton interpreter, compared with eager."""

from __future__ import annotations

import pytest
import torch

from conftest import Checker, group_text
from torchloom.testing.reductions import CASES as SHARED_CASES
from torchloom.api import parse_graph
from torchloom.tools import EagerCodegen
from torchloom.runtime.executor import CompiledGraph
from torchloom_codegen_triton import TritonCodegen

#: the shared cases (torchloom.testing.reductions)
CASES = SHARED_CASES


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


@pytest.mark.slow
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


def test_an_empty_input_is_never_read(form_check):
    """A reduction over an empty row reads no element of its input (whose pointer may be
    null or dangling: the interpreter crashed reading it unmasked), and gives eager's sums
    and means (0 and NaN)."""
    _, check = form_check
    text = group_text("%a: f32[3, 0]", """
        %s = aten.sum.dim_IntList(%a) {dim = [-1]} : f32[3]
        %m = aten.mean.dim(%a) {dim = [-1]} : f32[3]""", "%s: f32[3], %m: f32[3]")
    _, compiled = check(text, torch.empty(3, 0))
    source = check.codegen.generate(compiled.choices[0].node, check.registry).source
    loads = [line for line in source.splitlines() if "tl.load(in_a" in line]
    assert loads and all("0 * xindex != 0" in line for line in loads)
