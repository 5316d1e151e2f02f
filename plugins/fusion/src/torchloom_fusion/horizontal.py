"""``fusion.horizontal``: merge sibling groups that read the same value."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.api import Graph, PassContext, PassResult

from torchloom_fusion.closure import Fusion
from torchloom_fusion.groups import POSITIVE, GroupLimits

@attrs.frozen
class HorizontalFusion(GroupLimits):
    """Siblings (groups or fusible nodes) that share an input and have no path between
    them merge into one group when they iterate over the same space (equal largest
    numel; reductions over the same rows) and the limits hold. Typical: the four LSTM
    gate activations, the q/k/v epilogues.

    before::

        %g1 = torchloom.fusion_group(%x) : f32[8, 32] region @a(%p: f32[8, 32]) {
          %s = aten.sigmoid.default(%p) : f32[8, 32]
          return %s
        }
        %m = aten.mm.default(%w, %v) : f32[8, 32]
        %g2 = torchloom.fusion_group(%x) : f32[8, 32] region @b(%q: f32[8, 32]) {
          %t = aten.tanh.default(%q) : f32[8, 32]
          return %t
        }

    after::

        %g1, %g2 = torchloom.fusion_group(%x) : f32[8, 32], f32[8, 32] region @a(%p: f32[8, 32]) {
          %s = aten.sigmoid.default(%p) : f32[8, 32]
          %t = aten.tanh.default(%p) : f32[8, 32]
          return %s, %t
        }
        %m = aten.mm.default(%w, %v) : f32[8, 32]

    ``max_siblings`` bounds how many partial groups are kept per shared value.

    The groups a merge changed then absorb producers and join consumers as
    ``fusion.vertical`` would, and merge with new siblings, until nothing merges (see
    :mod:`torchloom_fusion.closure`): after ``fusion.vertical`` and ``fusion.horizontal``
    both passes find nothing more, so their fixpoint group converges in two rounds.
    """

    name: ClassVar[str] = "fusion.horizontal"
    after: ClassVar[tuple[str, ...]] = ("fusion.decompose", "fusion.functionalize")
    idempotent: ClassVar[bool] = True  # merges its merges made possible (closure.py)
    max_siblings: int = attrs.field(default=8, validator=POSITIVE)

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        ed = self.editor(graph, ctx)
        fusion = Fusion(ed, vertical=True, siblings=True, max_siblings=self.max_siblings)
        fusion.sweep_values()
        fusion.settle()
        ed.finish()
        return PassResult(ed.merges > 0, {"merged": ed.merges, "groups_started": ed.created})
