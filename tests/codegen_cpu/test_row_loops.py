"""The cpu's SIMD row loops as a function of their statements (row_loops.shaped): which
shape a loop over a row takes at each length, what it binds in the row, and that it never
edits the statements it was given."""

from __future__ import annotations

import pytest
from torchloom.api import expr, stmt

from torchloom_codegen_cpu import overrun, row_loops
from torchloom_codegen_cpu.render import Simd, render

SUM = Simd((("+", ("acc",)),))


def _context(declared=(), overrun_offsets=None):
    bound, names = [], iter(range(1, 100))

    def bind(code, hint):
        bound.append((hint, code.text))
        return expr.Name(f"{hint}{len(bound)}")
    decls = {d.name: d for d in declared}
    return row_loops.RowLoops(row_loops.NARROW_ROWS, overrun_offsets, None, decls.get, bind,
                              lambda hint: f"{hint}{next(names)}"), bound


def _sum_body(pointer="a"):
    value = expr.Load(pointer, expr.plus(expr.times("x", 64), "r"))
    return [stmt.Declare("f32", "v", value), stmt.Update("acc", "+=", expr.Name("v"))]


def _loops(statements):
    return [s for s in stmt.walk(statements) if isinstance(s, stmt.Loop)]


@pytest.mark.parametrize(("n", "lanes"), [(16, 16), (24, 8), (40, 8), (136, 8), (64, 16),
                                          (80, 16), (1024, 16), (200, None)])
def test_a_sum_over_a_static_row_combines_lanes_as_a_tree(n, lanes):
    """Whole 16-lane vectors and 8-lane rows (narrow_row) add into an array of lanes; a
    cheap row of 16k + 8 stays one loop whose remainder gcc vectorizes (row_loops._cheap)."""
    loops, bound = _context([stmt.Var("f32", "acc", "0")])
    body = _sum_body()
    shaped = row_loops.shaped(loops, SUM, n, [], body)
    assert not shaped.overran and bound == []  # (static: nothing bound in the row)
    text = "\n".join(render(list(shaped.statements)))
    if lanes is None:
        (loop,) = shaped.statements
        assert str(loop.end) == str(n) and "acc_lanes" not in text
    else:
        assert f"acc_lanes[{lanes}];" in text and "acc += acc_lanes[0];" in text
    assert body == _sum_body()  # the statements given are not edited


@pytest.mark.parametrize("n", [16, 24, 40, 136])
def test_a_narrow_row_without_reductions_is_one_loop_of_8_lanes_counting_to_a_hidden_n(n):
    loops, _ = _context()
    body = [stmt.Store(stmt.Element("out", "r"), expr.Load("a", "r"))]
    shaped = row_loops.shaped(loops, Simd(), n, [], body)
    count, hide, loop = shaped.statements
    assert isinstance(count, stmt.Var) and str(count.expr) == str(n)
    assert isinstance(hide, stmt.Raw) and loop.annotation.simdlen == 8
    assert str(loop.end) == count.name


def test_a_symbolic_row_binds_its_blocks_once_and_masks_its_tail():
    loops, bound = _context()
    body = [stmt.Store(stmt.Element("out", "r"), expr.Load("a", "r"))]
    shaped = row_loops.shaped(loops, Simd(), expr.Name("n"), [], body)
    assert [hint for hint, _ in bound] == ["r_blocks", "r_tail"]
    whole, branch = shaped.statements
    assert isinstance(whole, stmt.Loop) and str(whole.end) == "r_blocks1"
    assert isinstance(branch, stmt.If)  # the masked last block, only where there is one
    (tail,) = _loops(list(branch.then))
    assert str(tail.start) == "r_tail2" and "r >= r_blocks1" in "\n".join(render([tail]))


def test_a_short_odd_row_runs_past_its_end_where_its_rows_lie_end_to_end():
    n = 20  # (narrow_odd_row: 8-lane blocks and a masked 8-lane block, or one loop past)
    assert row_loops.narrow_odd_row(n) and n <= overrun.OVERRUN_ROWS
    body = [stmt.Store(stmt.Element("out", "x * 20 + r"), expr.Load("a", "x * 20 + r"))]
    loops, _ = _context(overrun_offsets={"a": "x * 20 + r", "out": "x * 20 + r"})
    shaped = row_loops.shaped(loops, Simd(), n, [], body)
    (guard,) = shaped.statements
    assert shaped.overran and isinstance(guard, stmt.If) and str(guard.cond) == overrun.GUARD
    (past,) = guard.then
    assert str(past.end) == str(row_loops.whole_vectors(n))  # 24: whole 8-lane vectors
    # without the rows end to end: the 8-lane blocks alone, nothing past the row
    loops, _ = _context()
    shaped = row_loops.shaped(loops, Simd(), n, [], body)
    assert not shaped.overran and not any(isinstance(s, stmt.If) for s in shaped.statements)
    assert max(int(str(loop.end)) for loop in _loops(list(shaped.statements))) == n
