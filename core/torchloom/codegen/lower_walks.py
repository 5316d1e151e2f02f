"""The lowering of a pointwise nest (:mod:`torchloom.codegen.walk_nest`, the loops the cpu
codegen writes too): the walk's rows whole (one thread), a loop ``x`` over them and in it
a loop ``j`` over a row, the row's values computed once before it (the lowering's scopes:
a value whose coordinates do not depend on ``j``), coordinates declared as the cpu declares
them (``WalkNest.row_coords``); rows read across in tiles where the renderer's language
writes the smaller of two indices. ``f32[64, 300] = tanh(a + b[:, None])``::

    Loop x in [0, 64):
      Declare b_1 = in_b[x]
      Loop j in [0, 300):
        Declare a_2 = in_a[x * 300 + j]; ...; Store out0[x * 300 + j] = tanh_4

A flat walk is one row of every element (``Loop x in [0, 1)``, ``Loop j`` over them).
"""

from __future__ import annotations

from torchloom.codegen import expr, stmt
from torchloom.codegen.expr import Code, Op
from torchloom.codegen.walk_nest import WalkNest


class WalkLowering(WalkNest):
    """The lowering's pointwise nest (mixed into ``lower._Lowering``: ``em`` its scopes,
    ``outputs`` (pointer, value), ``read_back``, ``renderer``, ``store``: NestWriter's)."""

    def pointwise(self) -> list:
        # rows whole (one thread); values of a row hoisted before the loop over it
        walked = self.walk_outputs(self.outputs)
        return [stmt.Loop(walked.var, "0", self.ix.size(walked.trips), tuple(walked.body))]

    # what WalkNest asks of a writer (walk_nest.py)
    INDEX = "i64"

    def writes_tiles(self) -> bool:
        """Tiles where the renderer's language writes the smaller of two indices."""
        return "Min" in self.renderer.language.functions

    def smaller(self, a: Code, b: Code) -> Code:
        """The smaller of two indices, as the renderer's language writes it."""
        return Op(self.renderer.language.functions["Min"], expr.ATOM, (a, b))
