"""render.py: the Triton text of the statement IR (torchloom.api.stmt)."""

from __future__ import annotations

from torchloom.api import stmt

from torchloom_codegen_triton.render import function, render


def test_statements_print_as_triton():
    loop = stmt.Loop("roff", "0", "64", head=(stmt.Assign("rindex", "roff + r"),),
                     body=(stmt.Assign("acc", "acc + rindex"),), step="RBLOCK")
    lines = render([stmt.Assign("acc", "tl.full([1], 0.0, tl.float32)"), loop,
                    stmt.Raw("v, i = tl.reduce((acc, acc), 1, f, keep_dims=True)"),
                    stmt.Store(stmt.Element("out_y", "(x0)"), "v", "xmask"),
                    stmt.Store(stmt.Element("scratch0", "xindex"), "v")])
    assert lines == ["acc = tl.full([1], 0.0, tl.float32)",
                     "for roff in range(0, 64, RBLOCK):",
                     "    rindex = roff + r",
                     "    acc = acc + rindex",
                     "v, i = tl.reduce((acc, acc), 1, f, keep_dims=True)",
                     "tl.store(out_y + (x0), v, xmask)",
                     "tl.store(scratch0 + xindex, v)"]


def test_a_unit_step_is_left_out_and_nested_loops_indent_again():
    outer = stmt.Loop("it", "0", "n", (stmt.Loop("j", "0", "4", (stmt.Raw("pass"),),
                                                 step="2"),))
    assert render([outer]) == ["for it in range(0, n):", "    for j in range(0, 4, 2):",
                               "        pass"]


def test_a_function_drops_the_assignments_nothing_reads():
    body = [stmt.Assign("x0", "xindex % 4"), stmt.Assign("x1", "xindex // 4"),
            stmt.Store(stmt.Element("out", "(x0)"), "1.0", "xmask")]
    assert function("k", ["out", "XBLOCK: tl.constexpr"], body).splitlines() == [
        "@triton.jit", "def k(out, XBLOCK: tl.constexpr):", "    x0 = xindex % 4",
        "    tl.store(out + (x0), 1.0, xmask)"]


def test_the_emitter_finds_the_reduction_names_an_expression_reads_in_its_tree():
    from torchloom.api import expr

    from torchloom_codegen_triton.emitter import Emitter

    em = Emitter(looped=True)
    em.mark_r("rindex")
    x = expr.Op("{0} // 8", expr.PRODUCT, (expr.Name("xindex"),))
    assert em.depends_on_x(x) and not em.depends_on_r(x)
    assert em.depends_on_r(expr.Op("tl.load({0} + {1})", expr.POSTFIX, (x, expr.Name("rindex"))))
    bound = em.emit(expr.Op("{0} * 2.0", expr.PRODUCT, (expr.Name("rindex"),)), "f32")
    assert bound.inner and em.depends_on_r(bound.code)  # a name bound to it depends on r


def test_conversions_are_ops_over_the_value_they_convert():
    from torchloom.api import expr

    from torchloom_codegen_triton.emitter import Emitter, Expr

    em = Emitter(looped=False)
    a = expr.Name("a")
    em.convert(Expr(a, "f64"), "f32")
    [assigned] = em.lines
    assert assigned.expr == expr.Op("{0}.to(tl.float32)", expr.POSTFIX, (a,))
    assert expr.substitute(assigned.expr, {"a": expr.Name("b")}).text == "b.to(tl.float32)"
