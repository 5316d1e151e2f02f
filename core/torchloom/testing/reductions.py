"""Fusion groups of reductions that every codegen's tests compile and compare with eager:
each reduction kind over last and other dims, prologues and epilogues, several reductions
per row (softmax, layer norm, RMSNorm), edge values, low precision, size-1 dims.

``CASES``: name -> ``(graph text, inputs)``; ``inputs()`` makes the inputs from a generator
seeded afresh, so a case's inputs do not depend on which tests ran before. A codegen's test
file adds its own cases with :func:`cases`. ``group_text`` writes a graph holding one fusion
group; ``symbolic_sizes``, a case's graph at symbolic sizes.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

#: a case's inputs, made from a seeded generator
Make = Callable[[torch.Generator], tuple]


def group_text(params: str, body: str, results: str) -> str:
    """A graph with one fusion group. ``params``/``results``: ``"%a: f32[4, 8], %b: f32[8]"``;
    ``body``: the region's statements, one per line."""
    split = lambda spec: [p.strip() for p in re.split(r",\s*(?=%)", spec) if p.strip()]
    ps, rs = split(params), split(results)
    outer_in = ", ".join(f"%i{k}: {p.split(':', 1)[1].strip()}" for k, p in enumerate(ps))
    args = ", ".join(f"%i{k}" for k in range(len(ps)))
    outs = ", ".join(f"%o{k}" for k in range(len(rs)))
    types = ", ".join(r.split(":", 1)[1].strip() for r in rs)
    names = ", ".join(r.split(":", 1)[0].strip() for r in rs)
    lines = "\n".join("    " + line.strip() for line in body.strip().splitlines())
    return (f"graph @g({outer_in}) {{\n"
            f"  {outs} = torchloom.fusion_group({args}) : {types} region @group0({params}) {{\n"
            f"{lines}\n    return {names}\n  }}\n  return {outs}\n}}\n")


#: a tensor type's dims in graph text (``f32[8, 20]``)
_TYPE_DIMS = re.compile(r"\b(f64|f32|f16|bf16|i64|i32|i16|i8|u8|b8)\[([0-9, ]+)\]")


def symbolic_sizes(text: str) -> str:
    """Graph ``text`` with every tensor type's dims above 1 made size symbols named by
    their size (``f32[8, 20]`` -> ``f32[s8, s20]``; strides and attributes as they are):
    the same group at symbolic sizes, which the case's inputs bind to their own."""
    def symbols(m: re.Match) -> str:
        dims = [d.strip() for d in m.group(2).split(",")]
        return f"{m.group(1)}[{', '.join(f's{d}' if int(d) > 1 else d for d in dims)}]"
    return _TYPE_DIMS.sub(symbols, text)


def randn(g: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=g).to(dtype)


def with_nans(t: torch.Tensor) -> torch.Tensor:
    """``t`` with a NaN at [1, 3] and an inf at [2, 0]."""
    t = t.clone()
    t[1, 3] = float("nan")
    t[2, 0] = float("inf")
    return t


def cases(raw: dict[str, tuple[str, Make]], seed: int = 1
          ) -> dict[str, tuple[str, Callable[[], tuple]]]:
    """``{name: (text, make)}`` -> ``{name: (text, inputs)}`` with ``inputs()`` calling
    ``make`` on a generator seeded ``seed``."""
    return {name: (text, (lambda make=make: make(torch.Generator().manual_seed(seed))))
            for name, (text, make) in raw.items()}


CASES = cases({
    "sum_last_dim": (group_text("%a: f32[6, 10]", """
        %s = aten.sum.dim_IntList(%a) {dim = [-1]} : f32[6]""", "%s: f32[6]"),
        lambda g: (randn(g, 6, 10),)),
    "sum_dim0_keepdim": (group_text("%a: f32[9, 7]", """
        %s = aten.sum.dim_IntList(%a) {dim = [0], keepdim = true} : f32[1, 7]""",
        "%s: f32[1, 7]"), lambda g: (randn(g, 9, 7),)),
    "sum_all_dims": (group_text("%a: f32[5, 6]", """
        %s = aten.sum.default(%a) : f32[]""", "%s: f32[]"), lambda g: (randn(g, 5, 6),)),
    "sum_outer_dims": (group_text("%a: f32[3, 4, 5]", """
        %s = aten.sum.dim_IntList(%a) {dim = [0, 2]} : f32[4]""", "%s: f32[4]"),
        lambda g: (randn(g, 3, 4, 5),)),
    "sum_int_to_i64": (group_text("%a: i32[4, 6]", """
        %s = aten.sum.dim_IntList(%a) {dim = [1]} : i64[4]""", "%s: i64[4]"),
        lambda g: (torch.randint(-100, 100, (4, 6), generator=g, dtype=torch.int32),)),
    "column_sum_long": (group_text("%a: f32[100, 6]", """
        %s = aten.sum.dim_IntList(%a) {dim = [0]} : f32[6]""", "%s: f32[6]"),
        lambda g: (randn(g, 100, 6),)),
    "mean_middle_dim": (group_text("%a: f32[3, 5, 4]", """
        %s = aten.mean.dim(%a) {dim = [1]} : f32[3, 4]""", "%s: f32[3, 4]"),
        lambda g: (randn(g, 3, 5, 4),)),
    "amax_amin_nan_inf": (group_text("%a: f32[4, 8]", """
        %x = aten.amax.default(%a) {dim = [1]} : f32[4]
        %n = aten.amin.default(%a) {dim = [1], keepdim = true} : f32[4, 1]""",
        "%x: f32[4], %n: f32[4, 1]"), lambda g: (with_nans(randn(g, 4, 8)),)),
    "var_unbiased": (group_text("%a: f32[5, 12]", """
        %v = aten.var.correction(%a) {dim = [-1], correction = 1} : f32[5]""", "%v: f32[5]"),
        lambda g: (randn(g, 5, 12) * 3 + 100,)),
    "var_mean_keepdim": (group_text("%a: f32[5, 12]", """
        %v, %m = aten.var_mean.correction(%a) {dim = [-1], correction = 0, keepdim = true} : f32[5, 1], f32[5, 1]""",  # noqa: E501
        "%v: f32[5, 1], %m: f32[5, 1]"), lambda g: (randn(g, 5, 12),)),
    "var_of_one_element_is_nan": (group_text("%a: f32[4, 1]", """
        %v = aten.var.correction(%a) {dim = [-1], correction = 1} : f32[4]""", "%v: f32[4]"),
        lambda g: (randn(g, 4, 1),)),
    "argmax_argmin_ties_nan": (group_text("%a: f32[4, 9]", """
        %x = aten.argmax.default(%a) {dim = 1} : i64[4]
        %n = aten.argmin.default(%a) {dim = 1, keepdim = true} : i64[4, 1]""",
        "%x: i64[4], %n: i64[4, 1]"),
        lambda g: (with_nans(torch.randint(0, 3, (4, 9), generator=g).float()),)),
    "max_min_dim_values_and_indices": (group_text("%a: f32[4, 9]", """
        %v, %i = aten.max.dim(%a) {dim = 1} : f32[4], i64[4]
        %w, %j = aten.min.dim(%a) {dim = 1, keepdim = true} : f32[4, 1], i64[4, 1]""",
        "%v: f32[4], %i: i64[4], %w: f32[4, 1], %j: i64[4, 1]"),
        lambda g: (with_nans(torch.randn(4, 9, generator=g)),)),
    "outputs_viewed_to_other_shapes": (group_text("%a: f32[6, 8]", """
        %s = aten.sum.dim_IntList(%a) {dim = [-1], keepdim = true} : f32[6, 1]
        %y = aten.div.Tensor(%a, %s) : f32[6, 8]
        %r = aten.view.default(%y) {size = [2, 3, 8]} : f32[2, 3, 8]
        %q = aten.view.default(%s) {size = [3, 2]} : f32[3, 2]""",
        "%r: f32[2, 3, 8], %q: f32[3, 2]"), lambda g: (randn(g, 6, 8).abs() + 0.5,)),
    "prologue_epilogue": (group_text("%a: f32[6, 10], %b: f32[10]", """
        %e = aten.exp.default(%a) : f32[6, 10]
        %m = aten.mul.Tensor(%e, %b) : f32[6, 10]
        %s = aten.sum.dim_IntList(%m) {dim = [-1]} : f32[6]
        %r = aten.add.Tensor(%s) {other = 1.0} : f32[6]""", "%r: f32[6]"),
        lambda g: (randn(g, 6, 10), randn(g, 10))),
    "softmax": (group_text("%a: f32[8, 20]", """
        %x = aten.amax.default(%a) {dim = [-1], keepdim = true} : f32[8, 1]
        %s = aten.sub.Tensor(%a, %x) : f32[8, 20]
        %e = aten.exp.default(%s) : f32[8, 20]
        %t = aten.sum.dim_IntList(%e) {dim = [-1], keepdim = true} : f32[8, 1]
        %y = aten.div.Tensor(%e, %t) : f32[8, 20]""", "%y: f32[8, 20]"),
        lambda g: (randn(g, 8, 20) * 5,)),
    "softmax_dim0": (group_text("%a: f32[12, 5]", """
        %x = aten.amax.default(%a) {dim = [0], keepdim = true} : f32[1, 5]
        %s = aten.sub.Tensor(%a, %x) : f32[12, 5]
        %e = aten.exp.default(%s) : f32[12, 5]
        %t = aten.sum.dim_IntList(%e) {dim = [0], keepdim = true} : f32[1, 5]
        %y = aten.div.Tensor(%e, %t) : f32[12, 5]""", "%y: f32[12, 5]"),
        lambda g: (randn(g, 12, 5),)),
    "layernorm": (group_text("%a: f32[6, 16], %w: f32[16], %b: f32[16]", """
        %v, %m = aten.var_mean.correction(%a) {dim = [-1], correction = 0, keepdim = true} : f32[6, 1], f32[6, 1]
        %ve = aten.add.Tensor(%v) {other = 1e-05} : f32[6, 1]
        %r = aten.rsqrt.default(%ve) : f32[6, 1]
        %c = aten.sub.Tensor(%a, %m) : f32[6, 16]
        %n = aten.mul.Tensor(%c, %r) : f32[6, 16]
        %nw = aten.mul.Tensor(%n, %w) : f32[6, 16]
        %y = aten.add.Tensor(%nw, %b) : f32[6, 16]""",  # noqa: E501
        "%y: f32[6, 16], %m: f32[6, 1], %r: f32[6, 1]"),
        lambda g: (randn(g, 6, 16) * 2 + 1, randn(g, 16), randn(g, 16))),
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
        lambda g: (randn(g, 4, 24, dtype=torch.bfloat16), randn(g, 24, dtype=torch.bfloat16))),
    "rmsnorm": (group_text("%a: f32[5, 16], %w: f32[16]", """
        %p = aten.pow.Tensor_Scalar(%a) {exponent = 2} : f32[5, 16]
        %m = aten.mean.dim(%p) {dim = [-1], keepdim = true} : f32[5, 1]
        %e = aten.add.Tensor(%m) {other = 1e-06} : f32[5, 1]
        %r = aten.rsqrt.default(%e) : f32[5, 1]
        %n = aten.mul.Tensor(%a, %r) : f32[5, 16]
        %y = aten.mul.Tensor(%n, %w) : f32[5, 16]""", "%y: f32[5, 16]"),
        lambda g: (randn(g, 5, 16), randn(g, 16))),
    "empty_rows_sum_and_mean": (group_text("%a: f32[3, 0]", """
        %s = aten.sum.dim_IntList(%a) {dim = [-1]} : f32[3]
        %m = aten.mean.dim(%a) {dim = [-1]} : f32[3]""", "%s: f32[3], %m: f32[3]"),
        lambda g: (randn(g, 3, 0),)),
    # all-size-1 rows and reduced dims: every coordinate is element 0 (the shared index
    # math's rule, which the cpu codegen needed; the masks keep Triton right either way)
    "size_one_dims_reduced": (group_text("%a: bf16[1, 1]", """
        %v = aten.add.Tensor(%a, %a) : bf16[1, 1]
        %r = aten.sum.dim_IntList(%v) {dim = [0]} : bf16[1]""", "%v: bf16[1, 1], %r: bf16[1]"),
        lambda g: (torch.tensor([[1.5]], dtype=torch.bfloat16),)),
    "size_one_dims_keepdim": (group_text("%a: f32[1, 5, 1]", """
        %s = aten.amax.default(%a) {dim = [1], keepdim = true} : f32[1, 1, 1]
        %d = aten.sub.Tensor(%a, %s) : f32[1, 5, 1]""", "%d: f32[1, 5, 1], %s: f32[1, 1, 1]"),
        lambda g: (randn(g, 1, 5, 1),)),
})


def _typed(dtype: str, shape) -> str:
    return f"{dtype}[{', '.join(map(str, shape))}]"


def row_results_for_columns(shape, column: str = "aten.sum.dim_IntList") -> str:
    """A layer_norm backward recomputing its statistics over the rows of ``shape``: the
    weight gradient's column sums read mean and rstd per row (a nest plan's scratch arrays,
    or a row nest carrying the sums); inputs ``%a``, ``%g`` of ``shape``; outputs the column
    sums ``%w`` (``column``: another column reduction, ``aten.amax.default``) and ``%o``,
    the normalized input times its row's sum of ``g * normalized``."""
    t, k = _typed("f32", shape), _typed("f32", (*shape[:-1], 1))
    c = _typed("f32", shape[-1:])
    dims = ", ".join(map(str, range(len(shape) - 1)))
    return group_text(f"%a: {t}, %g: {t}", f"""
        %v, %m = aten.var_mean.correction(%a) {{correction = 0, dim = [-1], keepdim = true}} : {k}, {k}
        %e = aten.add.Tensor(%v) {{other = 1e-06}} : {k}
        %r = aten.rsqrt.default(%e) : {k}
        %d = aten.sub.Tensor(%a, %m) : {t}
        %n = aten.mul.Tensor(%d, %r) : {t}
        %p = aten.mul.Tensor(%g, %n) : {t}
        %w = {column}(%p) {{dim = [{dims}]}} : {c}
        %s = aten.sum.dim_IntList(%p) {{dim = [-1], keepdim = true}} : {k}
        %o = aten.mul.Tensor(%n, %s) : {t}""", f"%w: {c}, %o: {t}")


def stored_output_for_columns(shape, dtype: str, column: str = "aten.sum.dim_IntList") -> str:
    """A cross-entropy gradient and the bias gradient summed from it over the batch: the
    column sum (``column``: another column reduction) reads an output the row nest stores
    (read back, rounded to its dtype, or carried by the row nest); inputs ``%a``, ``%g`` of
    ``shape``; outputs ``%b``, ``%d``, ``%s``."""
    t, k = _typed(dtype, shape), _typed(dtype, (*shape[:-1], 1))
    c = _typed(dtype, shape[-1:])
    dims = ", ".join(map(str, range(len(shape) - 1)))
    return group_text(f"%a: {t}, %g: {t}", f"""
        %e = aten.exp.default(%a) : {t}
        %s = aten.sum.dim_IntList(%g) {{dim = [-1], keepdim = true}} : {k}
        %m = aten.mul.Tensor(%e, %s) : {t}
        %d = aten.sub.Tensor(%g, %m) : {t}
        %b = {column}(%d) {{dim = [{dims}]}} : {c}""", f"%b: {c}, %d: {t}, %s: {k}")


#: groups whose max, min, argmax or argmin reduce symbolic dims into an output, and a shape
#: of ``%a`` (``[s0, s1]``) where those dims are empty: eager raises there (an
#: ``IndexError`` or a ``RuntimeError``, by op and form), and so must a kernel's launcher
#: (a softmax over empty rows raises nothing: its output is empty)
EMPTY_ROWS = {
    "amax_last_dim": (group_text("%a: f32[s0, s1]", """
        %x = aten.amax.default(%a) {dim = [-1], keepdim = true} : f32[s0, 1]
        %y = aten.sub.Tensor(%a, %x) : f32[s0, s1]""", "%x: f32[s0, 1], %y: f32[s0, s1]"),
        (3, 0)),
    "amax_times_two": (group_text("%a: f32[s0, s1]", """
        %x = aten.amax.default(%a) {dim = [1]} : f32[s0]
        %y = aten.mul.Tensor(%x) {other = 2.0} : f32[s0]""", "%y: f32[s0]"), (3, 0)),
    "argmax_dim1": (group_text("%a: f32[s0, s1]", """
        %x = aten.argmax.default(%a) {dim = 1} : i64[s0]""", "%x: i64[s0]"), (4, 0)),
    "amin_dim0": (group_text("%a: f32[s0, s1]", """
        %x = aten.amin.default(%a) {dim = [0]} : f32[s1]""", "%x: f32[s1]"), (0, 5)),
    "amin_every_dim": (group_text("%a: f32[s0, s1]", """
        %x = aten.amin.default(%a) : f32[]""", "%x: f32[]"), (0, 3)),
    "argmin_every_dim": (group_text("%a: f32[s0, s1]", """
        %x = aten.argmin.default(%a) : i64[]""", "%x: i64[]"), (2, 0)),
}
