"""The lowering of a reduction nest in the column form (:mod:`torchloom.codegen.columns`):
each column's accumulators in an array the kernel is handed (a scratch array of one value
per column, which the launch spec names and the launcher allocates), walked as scalar
loops, the reduced elements outer and the columns inner, so that every tensor is read in
memory order. For ``sum(a, dim=0)`` of ``f32[512, 64]``::

    Loop x in [0, 64): Store acc_sum_1[x] = 0
    Loop r in [0, 512):
      Loop x in [0, 64):
        Var f32 sum_2 = acc_sum_1[x]; <accumulate sum: a[r, x]>; Store acc_sum_1[x] = sum_2
    Loop x in [0, 64): Store out0[x] = acc_sum_1[x]

The walks are the core's (:func:`column_nest.walks`, the ones the cpu codegen writes as
blocks of columns): after each walk a loop over the columns takes its results; a later
walk computes a result again from its array at the column where it reads it (softmax over
dim 0: the sum of ``exp(a - max)`` reads the max from its array); full-shape outputs are stored
by the first walk, or by a walk of their own after the last when one reads a result; a
value read at the reduced element alone is computed once per ``r``, before the loop over
the columns. Each column combines its elements in order, as the row form does: the same
values.
"""

from __future__ import annotations

from typing import Any

from torchloom.codegen import column_nest, expr, stmt
from torchloom.codegen.columns import Columns
from torchloom.codegen.expr import Name
from torchloom.codegen.indexing import Coords
from torchloom.codegen.schedule import ReductionNest
from torchloom.codegen.scopes import LOW
from torchloom.codegen.writer import COMPUTE, Expr, same_shape
from torchloom.ir import Node

#: a column's element in the accumulator arrays
_X = Name("x")
#: a column's element in the arrays of sums a row nest carries
_R = Name("r")


def carried_output(node: Node) -> bool:
    """Whether column sum ``node``'s output is one a row nest carrying it stores: of its
    nest's kept shape, or that with the reduced dims kept as 1."""
    nest = ReductionNest.of([node], lambda v: v.type)
    shape = node.outputs[0].type.shape
    return same_shape(shape, nest.kept_shape) or same_shape(
        shape, [1 if d in nest.rdims else n for d, n in enumerate(nest.shape)])


class ColumnLowering:
    """The column form of the core's lowering (mixed into its ``_Lowering``, which has
    ``reduction_nest``, ``outputs``, ``em``, ``ix``, ``renderer``, ``spelling``,
    ``REDUCTIONS``, ``arrays``, the scratch arrays it asks for: (name, element count,
    dtype), ``carried``, the column sums its row nest carries: (pointer, sum node, the
    array of its sums, their dtype), and the reductions' ``accumulator`` dtype (double for
    a long f32 sum), ``result_code`` and ``result_value``)."""

    def columns(self, plan: Columns) -> list:
        """The nest's statements in the column form ``plan`` (the core's walks,
        :func:`column_nest.walks`, over every column in scalar loops)."""
        self.em.open()
        column_nest.walks(self, plan, self.reduction_nest, self.outputs)
        return self.em.close()

    # what column_nest asks of a target: scratch arrays of one value per column
    def accumulators(self, nodes) -> list[column_nest.Accumulator]:
        accs, start = [], []
        for node in nodes:
            kind = self.REDUCTIONS[node.op].kind
            dtype = self.accumulator(kind, COMPUTE[node.outputs[0].type.dtype],
                                     self.reduction_nest.rnumel)
            name = self.em.fresh(f"acc_{kind}")
            self.arrays.append((name, self.reduction_nest.rows, dtype))
            start.append(self._scratch(name, _X, self.renderer.initial(kind, dtype), dtype))
            accs.append(column_nest.Accumulator(node, kind, dtype, name))
        self.em.add(self._over_columns(start))
        return accs

    def over_reduced(self, write, rows: tuple[str, str] | None) -> None:
        self.em.open()
        write()
        first, end = rows or ("0", self.ix.size(self.rnumel))
        self.em.add(stmt.Loop("r", first, end, tuple(self.em.close())))

    def begin_columns(self) -> None:
        self.em.open_phase()  # (a value read at r alone: computed once per r, before it)

    def end_columns(self, header: list) -> None:
        self.em.add(self._over_columns(self.em.close_phase(), header))

    def fold(self, acc: column_nest.Accumulator, full: Coords) -> None:
        self._fold_into(acc.array, _X, acc.kind, acc.dtype, acc.node, full)

    def result(self, acc: column_nest.Accumulator) -> Expr:
        """The reduction's result at column ``x``: its template over the accumulator read
        from its array, computed again where it is read (the array keeps the accumulator;
        a bf16/f16 result rounded as eager rounds it)."""
        (value,) = acc.node.outputs
        read = self.spelling.read(acc.array, _X, acc.dtype)
        e = self.em.convert(Expr(self.result_code(acc.node, value, read), acc.dtype),
                            COMPUTE[value.type.dtype])
        return self.em.rounded(e, value.type.dtype) if value.type.dtype in LOW else e

    def _over_columns(self, body: Any, header: Any = ()) -> stmt.Loop:
        return stmt.Loop("x", "0", self.ix.size(self.reduction_nest.rows), tuple(body),
                         tuple(header))

    # ---- column sums carried by a row nest (the row + column form) ---------------------
    def carry(self) -> None:
        """In the row nest's last loop over the row (``r``, a column): each carried column
        sum's operand at ``(x, r)`` added into its array at ``r``."""
        for _, node, name, dtype in self.carried:
            self._fold_into(name, _R, "sum", dtype, node, self.full)

    def _fold_into(self, array: str, at: Name, kind: str, dtype: str, node: Node,
                   full: Coords) -> None:
        """Reduction ``node``'s input at ``full`` (as ``dtype``) folded into element ``at``
        of its accumulator array: read into a variable, accumulated, stored back."""
        value = self.em.convert(self.value_at(node.inputs[0], full), dtype)
        acc = self.em.fresh(kind)
        self.em.add(stmt.Var(dtype, acc, self.spelling.read(array, at, dtype)))
        for s in self.renderer.accumulate(kind, acc, value.text, "r", ""):
            self.em.add(s)
        self.em.add(self._scratch(array, at, acc, dtype))

    def _scratch(self, array: str, at: Name, value: str, dtype: str) -> Any:
        """The statement storing ``value`` (text of compute dtype ``dtype``) to element
        ``at`` of scratch array ``array``, as the spelling stores."""
        return self.spelling.store(array, at, Expr(expr.code(value), dtype), dtype, self.em)

    def around_the_rows(self) -> tuple[list, list]:
        """The loops before a row nest carrying column sums (their arrays started) and
        after it (each column's sum stored): each column adds its rows in order, as a
        column walk would."""
        start = []
        for _, node, name, dtype in self.carried:
            start.append(self._scratch(name, _R, self.renderer.initial("sum", dtype), dtype))
        self.em.open()
        for pointer, node, name, dtype in self.carried:
            out = node.outputs[0]
            nest = ReductionNest.of([node], lambda v: v.type)
            row = self.ix.delinear("r", nest.kept_shape)
            self.ix.remember(self.known, row, nest.kept_shape, "r")
            coords = column_nest.result_coords(
                nest, row, not same_shape(out.type.shape, nest.kept_shape))
            acc = self.em.emit(self.spelling.read(name, _R, dtype), dtype, "acc")
            code = expr.fill(self.REDUCTIONS[node.op].outputs[0], {"acc": acc.code})
            self.store(pointer, out, coords, self.result_value(out, code, dtype))
        rows = self.ix.size(self.rnumel)
        return [stmt.Loop("r", "0", rows, tuple(start))], [
            stmt.Loop("r", "0", rows, tuple(self.em.close()))]
