"""The column form's walks written once in core (``torchloom.api.column_nest``): what any
target is asked, in order, for a plan of one walk, of two walks (softmax over dim 0, its
quotient stored by a late walk) and with outputs of a column's values; the cpu codegen and
the lowering are two such targets (their tests check the kernels against eager)."""

from __future__ import annotations

import pytest

from torchloom.api import column_nest, columns, indexing, parse_graph, schedule
from torchloom.codegen.placement import OutputPlacement


class _Recorder(OutputPlacement):
    """A ColumnTarget that writes nothing and records what it is asked."""

    tensor_type = staticmethod(lambda v: v.type)

    def __init__(self, nest):
        self.ix = indexing.IndexMath(indexing.C, {})
        self.known: dict = {}
        self.calls: list = []
        self.nest = nest
        self.shape, self.rdims = nest.shape, nest.rdims
        self.kept_shape, self.rows, self.numel = nest.kept_shape, nest.rows, nest.numel
        self.results: dict = {}

    def inner_coords(self, index, shape):
        return ["header"], list(self.ix.delinear(index, shape))

    def reduced_coords(self, index, shape):
        return list(self.ix.delinear(index, shape))

    def store(self, key, v, coords):
        self.calls.append(("store", key, tuple(str(c) for c in coords)))

    def set_result(self, value, coords, e):
        self.results[value.name] = tuple(str(c) for c in coords)

    def accumulators(self, nodes):
        self.calls.append(("accumulators", tuple(n.outputs[0].name for n in nodes)))
        return [column_nest.Accumulator(n, "sum", "f32", f"acc_{n.outputs[0].name}")
                for n in nodes]

    def over_reduced(self, write, rows):
        self.calls.append(("walk", rows))
        write()
        self.calls.append(("end walk",))

    def begin_columns(self):
        self.calls.append(("columns",))

    def end_columns(self, header):
        self.calls.append(("end columns", tuple(header)))

    def fold(self, acc, full):
        self.calls.append(("fold", acc.array, tuple(str(c) for c in full)))

    def result(self, acc):
        self.calls.append(("result", acc.array))
        return None


def _walked(body: str, params: str):
    g = parse_graph(f"graph @g({params}) {{\n{body}\n}}")
    nodes = list(g.nodes)
    reductions = [n for n in nodes if n.op.split(".")[1] in ("sum", "amax")]
    nest = schedule.ReductionNest.of(reductions, lambda v: v.type)
    outputs = list(g.outputs)
    target = _Recorder(nest)
    plan = columns.plan(nest, reductions, list(g.inputs), outputs, lambda v: v.type,
                        target.output_place)
    assert plan is not None
    column_nest.walks(target, plan, nest, [(f"out_{v.name}", v) for v in outputs])
    return plan, target


def test_one_walk_folds_and_stores_then_takes_results():
    """sum(a, dim=0) beside exp(a): one walk folding the sum and storing exp at each
    element, then one loop over the columns storing the sum."""
    plan, t = _walked("""
  %e = aten.exp.default(%a) : f32[16, 8]
  %s = aten.sum.dim_IntList(%a) {dim = [0]} : f32[8]
  return %e, %s""", "%a: f32[16, 8]")
    assert len(plan.walks) == 1 and not plan.late
    assert t.calls == [
        ("accumulators", ("s",)), ("walk", None), ("columns",),
        ("fold", "acc_s", ("r", "x")), ("store", "out_e", ("r", "x")),
        ("end columns", ("header",)), ("end walk",),
        ("columns",), ("result", "acc_s"), ("store", "out_s", ("x",)),
        ("end columns", ("header",))]
    assert t.results == {"s": ("x",)}


def test_a_result_read_by_a_later_walk_and_a_late_walk():
    """softmax over dim 0: the max's walk and results, the sum's walk and results, then a
    late walk storing the quotient (it reads the sum's result)."""
    plan, t = _walked("""
  %m = aten.amax.default(%a) {dim = [0], keepdim = true} : f32[1, 8]
  %d = aten.sub.Tensor(%a, %m) : f32[16, 8]
  %e = aten.exp.default(%d) : f32[16, 8]
  %s = aten.sum.dim_IntList(%e) {dim = [0], keepdim = true} : f32[1, 8]
  %y = aten.div.Tensor(%e, %s) : f32[16, 8]
  return %y""", "%a: f32[16, 8]")
    assert [len(w) for w in plan.walks] == [1, 1] and plan.late
    kinds = [c[0] for c in t.calls]
    assert kinds == ["accumulators", "walk", "columns", "fold", "end columns", "end walk",
                     "columns", "result", "end columns",
                     "accumulators", "walk", "columns", "fold", "end columns", "end walk",
                     "columns", "result", "end columns",
                     "walk", "columns", "store", "end columns", "end walk"]
    assert ("store", "out_y", ("r", "x")) in t.calls
    assert t.results == {"m": ("0", "x"), "s": ("0", "x")}  # keepdim: the reduced dim 0


@pytest.mark.parametrize("shape", [(4, 3, 8), (2, 5, 3, 8)])
def test_outputs_of_a_column_are_stored_after_the_last_results(shape):
    """A value computed from a result per column (``s * s``) is stored after the
    results, once; the reduced coordinates of leading dims come from ``r``."""
    dims = list(range(len(shape) - 1))
    t_in = f"f32[{', '.join(map(str, shape))}]"
    plan, t = _walked(f"""
  %s = aten.sum.dim_IntList(%a) {{dim = {dims}}} : f32[8]
  %h = aten.mul.Tensor(%s, %s) : f32[8]
  return %h""", f"%a: {t_in}")
    stores = [c for c in t.calls if c[0] == "store"]
    assert stores == [("store", "out_h", ("x",))]
    folds = [c for c in t.calls if c[0] == "fold"]
    assert len(folds) == 1 and folds[0][2][-1] == "x" and "r" in "".join(folds[0][2][:-1])
