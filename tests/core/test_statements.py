"""The one statement emitter (torchloom.codegen.statements.Statements): phases, scopes and
hoisting, value numbering by text, fresh names."""

import pytest

from torchloom.api import stmt
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


def test_values_are_bound_once_per_scope():
    em = Statements()
    a, new = _bind(em, "x + 1")
    assert new and _bind(em, "x + 1") == (a, False)
    em.open_phase()
    inner, new = _bind(em, "x + 1", inner=True)  # the body numbers its own values
    assert new and inner != a
    assert _bind(em, "x + 1") == (a, False)  # hoisted: the one before the loop
    em.close_phase()
    em.open_phase()  # a new phase: its body's values are new again
    assert _bind(em, "x + 1", inner=True)[1]
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


def test_scopes_nest_and_hoisting_sends_statements_and_values_out():
    em = Statements()
    em.open()
    em.open()
    with em.hoisting(len(em.scopes) - 2):
        em.add(stmt.Raw("hoisted;"))
        em.remember("k", "v1")
    em.add(stmt.Raw("inside;"))
    assert em.lookup("k") == "v1" and em.lookup("missing") is None
    assert [s.text for s in em.close()] == ["inside;"]
    assert [s.text for s in em.close()] == ["hoisted;"]
    assert em.lookup("k") is None  # its scope is closed


@pytest.mark.parametrize(("hint", "name"), [
    ("sum", "sum1"), ("mul_", "mul_1"), ("x", "vx1"), ("r0", "r0_1"), ("a.b", "a_b1"),
    ("", "v1"), ("3d", "v3d1"), ("é", "_1"),
])
def test_fresh_names_are_identifiers_and_never_a_coordinate(hint, name):
    em = Statements()
    assert em.fresh(hint) == name
    assert em.fresh(hint) != name  # numbered
