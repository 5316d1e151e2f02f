"""C for the statement IR (render.py): each statement's text, masked forms, loops, pragmas."""

from __future__ import annotations

from torchloom.api import expr, stmt
from torchloom.codegen.stmt import Declare, Element, If, Loop, Select, Store, Update

from torchloom_codegen_cpu.render import Simd, costly, divides_integers, render


def test_statements_render_as_c_lines():
    assert render([Declare("float", "t1", "a + b")]) == ["const float t1 = a + b;"]
    assert render([Store(Element("out_y", "x * 8 + r"), "t1")]) == ["out_y[x * 8 + r] = t1;"]
    assert render([Update("acc", "+=", "t1 * t1")]) == ["acc += t1 * t1;"]
    assert render([Select("acc", "t1 > acc", "t1")]) == ["acc = t1 > acc ? t1 : acc;"]
    assert render([Update("best", "=", "t1")]) == ["best = t1;"]  # set (arg reductions)


def test_masked_statements_take_their_side_effect_where_the_mask_holds():
    def masked(s):
        return render([stmt.masked(s, "r >= 16")])

    assert masked(Update("acc", "+=", "t1 * t1")) == ["acc += r >= 16 ? (t1 * t1) : 0;"]
    # a value is parenthesised by what it is (a node), not by how its text looks
    assert masked(Update("acc", "*=", expr.Name("t1"))) == ["acc *= r >= 16 ? t1 : 1;"]
    assert masked(Update("acc", "*=", expr.Literal("((float)2.0)"))) == [
        "acc *= r >= 16 ? ((float)2.0) : 1;"]
    assert masked(Update("acc", "*=", "t1")) == ["acc *= r >= 16 ? (t1) : 1;"]  # text: unknown
    assert masked(Select("acc", "t1 > acc", "t1")) == ["acc = r >= 16 && (t1 > acc) ? t1 : acc;"]
    # a set keeps the value where the mask fails (no neutral value to set)
    assert masked(Update("best", "=", expr.Name("t1"))) == ["best = r >= 16 ? t1 : best;"]
    # lanes masked off write back the element they read
    assert masked(Store(Element("o", "r"), "a + b")) == ["o[r] = r >= 16 ? (a + b) : o[r];"]


def test_loops_and_branches_indent_their_bodies():
    loop = Loop("r", "0", "24", (Update("acc", "+=", "t"),), (Declare("int64_t", "r0", "r / 8"),),
                Simd((("+", ("acc",)),), simdlen=8))
    assert render([loop]) == ["#pragma omp simd reduction(+:acc) simdlen(8)",
                              "for (int64_t r = 0; r < 24; r++) {",
                              "  const int64_t r0 = r / 8;", "  acc += t;", "}"]
    assert render([If("a < b", (Update("s", "+=", "1"),), (Update("s", "+=", "2"),))]) == [
        "if (a < b) {", "  s += 1;", "} else {", "  s += 2;", "}"]
    assert render([If("a < b", (Update("s", "+=", "1"),), flat=True)]) == [
        "if (a < b) {", "s += 1;", "}"]


def test_costly_calls_and_integer_divisions_are_seen_in_the_structure():
    assert costly(Declare("float", "t", "tl_exp(a)")) and costly(Declare("float", "t", "logf(a)"))
    assert not costly(Declare("float", "t", "fabsf(a) + b"))
    assert divides_integers(Declare("int64_t", "q", "a / 3"))
    assert not divides_integers(Declare("float", "q", "a / 3"))
    # a tree: asked of each node's own spelling, not of its operands' names
    a, i = expr.Name("a"), expr.Name("i")
    assert divides_integers(Declare("int64_t", "q", expr.Op("{0} % {1}", expr.PRODUCT, (a, i))))
    assert divides_integers(Declare("int64_t", "q", expr.Op("{0} + 1", expr.SUM, (
        expr.Literal("((int64_t)(ks0 / 2))"),))))
    assert not divides_integers(Declare("int64_t", "q", expr.Op("{0}[{1}]", expr.POSTFIX, (
        a, expr.Op("{0} * 2", expr.PRODUCT, (i,))))))
    assert Simd((("max", ("m",)),)).min_max() and not Simd((("+", ("s",)),)).min_max()


def test_the_emitter_finds_the_inner_names_an_expression_reads_in_its_tree():
    from torchloom_codegen_cpu.emitter import Emitter

    em = Emitter()
    em.inner("r0")
    em.begin_phase()
    row = expr.Op("{0} * {1}", expr.PRODUCT, (expr.Name("x0"), expr.Literal("2", 2)))
    assert not em.emit(row, "i64").inner  # hoisted: reads no inner name
    assert em.emit(expr.Op("{0} + {1}", expr.SUM, (expr.Name("r0"), row)), "i64").inner
    assert em.emit("r0 * 3", "i64").inner  # opaque text: its identifiers
    assert em.is_inner(expr.Op("tl_exp({0})", expr.POSTFIX, ("x0 + r0",)))


def test_conversions_are_ops_over_the_value_they_convert():
    from torchloom_codegen_cpu.emitter import Emitter, Expr

    em = Emitter()
    a = expr.Name("a")
    converted = em.convert(Expr(a, "f64"), "f32")
    [declared] = em.lines
    assert declared.expr == expr.Op("(float){0}", expr.LOWEST, (a,))
    assert f"{declared.expr}" == "(float)a" and converted.code == expr.Name(declared.name)
    em.cast(Expr(a, "f32"), "bf16")
    assert em.lines[-1].expr == expr.Op("tl_round_bf16({0})", expr.POSTFIX, (a,))
