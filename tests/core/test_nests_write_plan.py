"""How a writer takes the core's nest plan (``torchloom.codegen.nests``): ``write_plan``
writes the plan, and where the writer declines it, the plan after the rows (the reason
raised where both are declined is the first plan's); ``Nest.stored`` and
``Nest.computed`` say what a nest stores under which pointer and which reductions it
computes, in the region's order (the cpu codegen and the lowering read them alike)."""

from __future__ import annotations

import pytest

from torchloom.api import Unsupported, parse_graph
from torchloom.codegen import nests

GROUP = """graph @g(%a: f32[4, 6]) {
  %o0, %o1, %o2 = torchloom.fusion_group(%a) : f32[4], f32[4], f32[4, 6] region @k(%x: f32[4, 6]) {
    %s = aten.sum.dim_IntList(%x) {dim = [1]} : f32[4]
    %m = aten.amax.default(%x) {dim = [1]} : f32[4]
    %e = aten.exp.default(%x) : f32[4, 6]
    return %s, %m, %e
  }
  return %o0, %o1, %o2
}
"""


def _region():
    return next(parse_graph(GROUP).nodes).region


def _is_reduction(node) -> bool:
    return node.op in ("aten.sum.dim_IntList", "aten.amax.default")


def _planned(monkeypatch, after):
    first = (nests.Nest(),)
    monkeypatch.setattr(nests, "plan", lambda *args: first)
    monkeypatch.setattr(nests, "after_the_rows", lambda *args: after)
    return first


def test_the_plan_written_is_the_first_where_the_writer_takes_it(monkeypatch):
    first = _planned(monkeypatch, (nests.Nest(reductions=()),))
    assert nests.write_plan(_region(), _is_reduction, lambda v: v.type, None,
                            lambda planned: planned) is first


def test_the_plan_after_the_rows_where_the_first_is_declined(monkeypatch):
    after = (nests.Nest(reductions=()),)
    first = _planned(monkeypatch, after)

    def write(planned):
        if planned is first:
            raise Unsupported("the first nest cannot hold an output")
        return planned
    assert nests.write_plan(_region(), _is_reduction, lambda v: v.type, None, write) is after


@pytest.mark.parametrize("after", [None, (nests.Nest(reductions=()),)])
def test_where_both_are_declined_the_first_plans_reason_is_raised(monkeypatch, after):
    """(and where there is no plan after the rows, the first reason as it is)"""
    first = _planned(monkeypatch, after)

    def write(planned):
        raise Unsupported("first" if planned is first else "after")
    with pytest.raises(Unsupported, match="^first$") as raised:
        nests.write_plan(_region(), _is_reduction, lambda v: v.type, None, write)
    assert raised.value.__cause__ is None


def test_a_nest_stores_and_computes_in_the_regions_order():
    region = _region()
    s, m, _ = region.nodes
    whole = nests.Nest()
    assert [(name, v.name) for name, v in whole.stored(region)] == [
        ("out_s", "s"), ("out_m", "m"), ("out_e", "e")]
    assert whole.computed(region, _is_reduction) == [s, m]
    part = nests.Nest(outputs=(("out_m", m.outputs[0]),), reductions=(m, s))
    assert [(name, v.name) for name, v in part.stored(region)] == [("out_m", "m")]
    assert part.computed(region, _is_reduction) == [s, m]  # (the region's order)
    assert nests.Nest(reductions=()).computed(region, _is_reduction) == []
