"""The one statement emitter (torchloom.codegen.statements.Statements): phases, scopes,
names that depend on an inner index, value numbering by text, fresh names; the lowering's
emitter over it (torchloom.codegen.scopes.Scopes)."""

import pytest

from torchloom.api import expr, stmt
from torchloom.codegen.scopes import Scopes
from torchloom.codegen.statements import Statements


def _bind(em: Statements, text: str, inner: bool = False) -> tuple[str, bool]:
    return em.bind(text, "v", inner, lambda name: stmt.Declare("f32", name, text))


def test_a_phase_keeps_inner_statements_in_its_body_and_hoists_the_others():
    em = Statements()
    em.statement(stmt.Var("f32", "acc", "0"), False)
    em.open_phase()
    assert em.in_phase and em.phase_id == 1
    inv, _ = _bind(em, "a * 2")
    body, _ = _bind(em, "in[r] + 1", inner=True)
    em.statement(stmt.Update("acc", "+=", body), True)
    loop_body = em.close_phase()
    assert not em.in_phase
    assert [s.name for s in em.lines if isinstance(s, (stmt.Var, stmt.Declare))] == ["acc", inv]
    assert [type(s) for s in loop_body] == [stmt.Declare, stmt.Update]
    assert loop_body[0].name == body
    assert em.close_phase() is None  # no phase open


def test_values_are_bound_once_in_scope():
    em = Statements()
    a, new = _bind(em, "x + 1")
    assert new and _bind(em, "x + 1") == (a, False)
    em.open_phase()
    assert _bind(em, "x + 1", inner=True) == (a, False)  # bound before the loop: in scope
    inner, new = _bind(em, "in[r] + 1", inner=True)  # the body numbers its own values
    assert new and _bind(em, "in[r] + 1", inner=True) == (inner, False)
    em.close_phase()
    em.open_phase()  # a new phase: its body's values are new again
    assert _bind(em, "in[r] + 1", inner=True)[1]
    em.close_phase()
    em.forget_values()  # a nested loop: what was bound before is out of scope
    assert _bind(em, "x + 1")[1]


def test_capture_takes_statements_out_and_refuses_a_phase():
    em = Statements()
    em.statement(stmt.Raw("first;"), False)
    captured = em.capture(lambda: em.statement(stmt.Raw("taken;"), False))
    assert [s.text for s in captured] == ["taken;"]
    assert [s.text for s in em.lines] == ["first;"]
    em.open_phase()
    with pytest.raises(AssertionError):
        em.capture(lambda: None)
    with pytest.raises(AssertionError):
        em.open_phase()  # phases do not nest


def test_values_are_remembered_where_their_statements_go():
    em = Statements()
    em.open()  # a row
    em.open_phase()  # the loop over it
    em.remember("row value", "v1", False)  # before the loop: the row's
    em.remember("element", "v2", True)  # in the loop's body
    em.add(stmt.Raw("inside;"))
    assert em.lookup("row value") == "v1" and em.lookup("element") == "v2"
    assert em.lookup("missing") is None
    assert [s.text for s in em.close_phase()] == ["inside;"]
    assert em.lookup("row value") == "v1" and em.lookup("element") is None
    em.close()
    assert em.lookup("row value") is None  # its scope is closed


def test_inner_names_say_what_stays_in_the_loop():
    em = Statements()
    em.inner("r")
    em.inner("r0")
    assert em.is_inner("in[r0 * 4]") and em.is_inner(expr.Name("r"))
    assert not em.is_inner("in[x0 * 4]")
    assert em.reads_inner(stmt.Store(stmt.Element("out", "r"), "1"))
    assert not em.reads_inner(stmt.Store(stmt.Element("out", "x"), "1"))
    em.forget_inner()  # a new nest: its names are new
    assert not em.is_inner("in[r0 * 4]")


def test_the_lowerings_emitter_binds_what_reads_no_inner_name_before_the_loop():
    em = Scopes(renderer=None)  # (emit spells nothing itself)
    em.open()  # a row
    em.inner("j")
    em.open_phase()  # the loop over it
    b = em.emit("in_b[x0]", "f32", "b")
    a = em.emit("in_a[x0 * 8 + j]", "f32", "a")
    total = em.emit(f"{a.text} + {b.text}", "f32", "add")
    scaled = em.emit(f"{b.text} * 2", "f32", "mul")
    assert em.emit("in_b[x0]", "f32", "b") == b  # numbered by its text
    body = em.close_phase()
    row = em.close()
    assert [d.name for d in row] == [b.text, scaled.text]
    assert [d.name for d in body] == [a.text, total.text]
    assert em.is_inner(total.text) and not em.is_inner(scaled.text)


@pytest.mark.parametrize(("hint", "name"), [
    ("sum", "sum1"), ("mul_", "mul_1"), ("x", "vx1"), ("r0", "r0_1"), ("a.b", "a_b1"),
    ("", "v1"), ("3d", "v3d1"), ("é", "_1"),
])
def test_fresh_names_are_identifiers_and_never_a_coordinate(hint, name):
    em = Statements()
    assert em.fresh(hint) == name
    assert em.fresh(hint) != name  # numbered
