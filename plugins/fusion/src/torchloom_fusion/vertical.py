"""``fusion.vertical``: merge producers into their consumer's fusion group."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.api import Graph, PassContext, PassResult

from torchloom_fusion.closure import Fusion
from torchloom_fusion.groups import GroupLimits

@attrs.frozen
class VerticalFusion(GroupLimits):
    """Walk the graph from the end; each pointwise or reduction node (or group) absorbs
    its fusible producers while a topologically valid merge exists, the group's distinct
    inputs stay within ``max_group_inputs`` and its outputs within ``max_group_outputs``.
    A node left alone starts its own group; views join only with a consumer. Work is never
    duplicated: a producer whose value is also read outside becomes a group output.
    Reductions take pointwise prologues and epilogues, and reductions over the same rows
    share a group (softmax is one group). Merges that earlier merges made possible are
    made in the same run (see :mod:`torchloom_fusion.closure`), so running the pass again
    changes nothing.

    before::

        %s = aten.add.Tensor(%a, %b) : f32[4, 8]
        %e = aten.exp.default(%s) : f32[4, 8]
        %r = aten.sum.dim_IntList(%e) {dim = [-1]} : f32[4]
        %m = aten.mm.default(%e, %w) : f32[4, 4]
        return %m, %r

    after::

        %r, %e = torchloom.fusion_group(%a, %b) : f32[4], f32[4, 8] region @fused_r(...) {
          %s = aten.add.Tensor(%a, %b) : f32[4, 8]
          %e = aten.exp.default(%s) : f32[4, 8]
          %r = aten.sum.dim_IntList(%e) {dim = [-1]} : f32[4]
          return %r, %e
        }
        %m = aten.mm.default(%e, %w) : f32[4, 4]
        return %m, %r
    """

    name: ClassVar[str] = "fusion.vertical"
    after: ClassVar[tuple[str, ...]] = ("fusion.decompose", "fusion.functionalize")
    idempotent: ClassVar[bool] = True  # merges its merges made possible (closure.py)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        ed = self.editor(graph, ctx)
        fusion = Fusion(ed, vertical=True, siblings=False)
        fusion.sweep_consumers()
        fusion.settle()  # what the sweep's merges made possible: a second run finds nothing
        ed.finish()
        return PassResult(ed.merges + ed.created > 0,
                          {"merged": ed.merges, "groups_started": ed.created})
