"""``fusion.vertical``: merge producers into their consumer's fusion group."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.api import Graph, Pass, PassContext, PassResult

from torchloom_fusion.closure import Fusion
from torchloom_fusion.groups import GroupEditor

_positive = [attrs.validators.instance_of(int), attrs.validators.ge(1)]


@attrs.frozen
class VerticalFusion(Pass):
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
    max_group_inputs: int = attrs.field(default=128, validator=_positive)
    max_group_outputs: int = attrs.field(default=64, validator=_positive)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        ed = GroupEditor(graph, ctx.registry, self.max_group_inputs, self.max_group_outputs)
        fusion = Fusion(ed, vertical=True, siblings=False)
        fusion.sweep_consumers()
        fusion.settle()  # what the sweep's merges made possible: a second run finds nothing
        ed.finish()
        return PassResult(ed.merges + ed.created > 0,
                          {"merged": ed.merges, "groups_started": ed.created})
