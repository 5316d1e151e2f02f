"""torchloom.api.writer: what the native codegens' kernel writers share (the cpu and triton
codegens' tests run it end to end; these pin its pieces)."""

from __future__ import annotations

import pytest
from torchloom.api import expr, op_rows, parse_graph, writer


class Lines(writer.Statements):
    """A toy target: ``name = text`` statements."""

    def emit(self, text: expr.Code | str, inner: bool = False) -> str:
        code = expr.code(text)
        if code.trivial:
            return code.text
        return self.bind(code.text, "t", inner and self._phase is not None,
                         lambda name: f"{name} = {code}")[0]


def test_statements_number_equal_text_once_and_hoist_out_of_phases():
    em = Lines()
    a = em.emit("x + 1")
    assert em.emit("x + 1") == a and em.emit(expr.Literal("3", 3)) == "3"
    assert em.emit(expr.Name("y")) == "y"
    em.open_phase()
    inner = em.emit("r * 2", inner=True)
    assert em.emit("r * 2", inner=True) == inner  # numbered within the phase
    hoisted = em.emit("x * 7")  # not inner: goes before the loop
    body = em.close_phase()
    assert body == [f"{inner} = r * 2"]
    assert em.lines == [f"{a} = x + 1", f"{hoisted} = x * 7"]
    em.open_phase()
    assert em.emit("r * 2", inner=True) != inner  # a new loop: computed again
    assert em.close_phase() is not None and em.close_phase() is None


def test_capture_takes_what_a_write_emits_out_of_the_lines():
    em = writer.Statements()
    em.statement("before", False)
    assert em.capture(lambda: em.statement("captured", False)) == ["captured"]
    assert em.lines == ["before"]


@pytest.mark.parametrize("alpha, expected", [(1, "{self} - ({other})"),
                                             (2, "{self} - ({other}) * {alpha}")])
def test_alpha_rows(alpha, expected):
    rows = op_rows.alpha_rows("({other})")
    assert rows["aten.sub.Tensor"]({"alpha": alpha}) == expected
    assert rows["aten.rsub.Scalar"]({"alpha": 1}, "f32") == "{other} - {self}"
    assert set(rows) == {"aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor",
                         "aten.sub.Scalar", "aten.rsub.Tensor", "aten.rsub.Scalar"}


def test_clamp_rows_nest_min_inside_max():
    rows = op_rows.clamp_rows(lambda c, a, b: f"sel({c}, {a}, {b})")
    low = "sel({min} != {min}, {min}, sel({self} < {min}, {min}, {self}))"  # a NaN bound: NaN
    assert rows["aten.clamp.default"]({"min": 0, "max": None}) == low
    both = rows["aten.clamp.default"]({"min": 0, "max": 1})
    assert both == f"sel({{max}} != {{max}}, {{max}}, sel({low} > {{max}}, {{max}}, {low}))"
    assert rows["aten.clamp_max.default"] == (
        "sel({max} != {max}, {max}, sel({self} > {max}, {max}, {self}))")
    assert set(op_rows.comparisons(lambda s: s).values()) == {"==", "!=", "<", "<=", ">", ">="}


def test_promotion_and_reduced_dims_follow_torch():
    assert writer.promote_dtype(["i64", "f16"], {}) == "f32"  # computed in f32
    assert writer.promote_dtype(["i32"], {"other": 0.5}) == "f32"
    assert writer.promote_dtype(["i32", "i64"], {}) == "i64"
    g = parse_graph("""graph @g(%x: f32[2, 3, 4], %z: f32[]) {
  %a = aten.sum.dim_IntList(%x) {dim = [-1, 0]} : f32[3]
  %b = aten.sum.dim_IntList(%z) {dim = [0]} : f32[]
  %c = aten.var.correction(%x) {dim = [1], correction = 0} : f32[2, 4]
  %d = aten.var.dim(%x) {dim = [1], unbiased = true} : f32[2, 4]
  return %a, %b, %c, %d
}""")
    a, b, c, d = g.nodes
    assert writer.reduced_dims(a, 3) == (0, 2) and writer.reduced_dims(b, 0) == ()
    assert writer.var_correction(c) == 0 and writer.var_correction(d) == 1


def test_same_shape_compares_symbolic_sizes_by_value():
    assert writer.same_shape(["2*s0", 4], ["s0*2", 4])
    assert not writer.same_shape(["s0", 4], ["s1", 4]) and not writer.same_shape([4], [4, 1])


def test_op_rows():
    row = op_rows.OpRow(lambda a: "{self} + " + str(a["other"]))
    assert row.args == "out" and row.resolve(row.template, {"other": 2}) == "{self} + 2"
    assert op_rows.OpRow.resolve("{self}") == "{self}"


def test_an_expr_holds_a_node_never_bare_text():
    e = writer.Expr(expr.Name("x_1"), "f32")
    assert e.text == "x_1" and e.code == expr.Name("x_1")
    with pytest.raises(TypeError):
        writer.Expr("x_1", "f32")


def test_place_outputs_stores_each_row_output_as_it_comes_and_keeps_the_full_ones():
    events = []

    class Walk(writer.ValueWalk):
        def place_output(self, v):  # "a" and "c" hold P's elements, the others a row's
            events.append(("place", v))
            return v in ("a", "c"), (f"{v}0",)

    last = Walk().place_outputs([(0, "a"), (1, "b"), (2, "c"), (3, "d")],
                                lambda k, v, at: events.append(("store", k, v, at)))
    assert last == [(0, "a", ("a0",)), (2, "c", ("c0",))]
    # a store may teach the index math (``known``) what the next placement reads
    assert events == [("place", "a"), ("place", "b"), ("store", 1, "b", ("b0",)),
                      ("place", "c"), ("place", "d"), ("store", 3, "d", ("d0",))]
