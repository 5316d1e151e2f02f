"""``example.pow-to-mul``: square by multiplying, not by calling pow."""

from __future__ import annotations

from typing import ClassVar

import attrs

from torchloom.api import Graph, Pass, PassContext, PassResult


@attrs.frozen
class PowToMul(Pass):
    """Rewrite ``x ** 2`` as ``x * x`` (cheaper, and exact), inside regions too.

    before::

        %p = aten.pow.Tensor_Scalar(%x) {exponent = 2} : f32[4, 8]
        %e = aten.exp.default(%p) : f32[4, 8]

    after::

        %mul = aten.mul.Tensor(%x, %x) : f32[4, 8]
        %e = aten.exp.default(%mul) : f32[4, 8]
    """

    name: ClassVar[str] = "example.pow-to-mul"

    def run(self, graph: Graph, ctx: PassContext) -> PassResult:
        rewritten = 0
        for node in list(graph.walk()):
            exponent = node.attrs.get("exponent")
            if (node.op != "aten.pow.Tensor_Scalar" or isinstance(exponent, bool)
                    or exponent != 2 or node.inputs[0].type != node.output.type):
                continue
            owner, x, old = node.graph, node.inputs[0], node.output
            mul = owner.create("aten.mul.Tensor", [x, x], [old.type], before=node)
            owner.replace_all_uses(old, mul.output)
            owner.erase(node)
            rewritten += 1
        return PassResult(rewritten > 0, {"rewritten": rewritten})
