"""A compiled graph as the HTML report draws it: every op one node, coloured by the
fusion group it is in, shared subgraphs expanded at each call inside a box.

::

    graph @g(%x: f32[4]) {                       nodes  input x, exp (group 0), neg
      %e = torchloom.fusion_group(%x) : f32[4]          (group 0), output
        region @k(%in0: f32[4]) {                edges  x -> exp -> neg -> output
          %t0 = aten.exp.default(%in0) : f32[4]  groups [{id 0, ops 2, node: <the
          %t1 = aten.neg.default(%t0) : f32[4]           fusion_group node>}]
          return %t1
        }
      return %e
    }

A group's ops are named by the values the group gives back outside (``e``, not ``t1``),
so searching the page for a value of the printed IR finds the op inside its group. A
shared subgraph called twice is drawn twice (each call its own box and its own group
ids), so the page shows as many groups as ``explain``'s ``fusion_groups`` counts.
"""

from __future__ import annotations

from typing import Any

from torchloom.ir.graph import CALL_SUBGRAPH, FUSION_GROUP, Graph, Node, Value
from torchloom.ir.text import format_type


class GraphView:
    """Nodes, edges, fusion groups and boxes of one graph, as JSON-able lists."""

    def __init__(self, graph: Graph):
        self.nodes: list[dict[str, Any]] = []
        self.edges: set[tuple[int, int]] = set()
        self.groups: list[dict[str, Any]] = []
        #: the fusion_group node of each group id (a shared subgraph's, once per call)
        self.group_nodes: list[Node] = []
        self.boxes: list[dict[str, Any]] = []
        self.root = graph.root
        source: dict[Value, int] = {}
        for v in graph.inputs:
            source[v] = self._add("input", v.name, _type(v), None, None)
        self._walk(graph, source, None, None)
        out = self._add("output", "return", "", None, None)
        for v in graph.outputs:
            self._edge(source.get(v), out)

    def as_json(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "edges": sorted(self.edges), "groups": self.groups,
                "boxes": self.boxes}

    def _add(self, kind: str, label: str, type_: str, group: int | None,
             box: int | None, name: str = "") -> int:
        self.nodes.append({"id": len(self.nodes), "kind": kind, "op": label, "name": name,
                           "type": type_, "group": group, "box": box})
        return len(self.nodes) - 1

    def _edge(self, src: int | None, dst: int) -> None:
        if src is not None and src != dst:
            self.edges.add((src, dst))

    def _walk(self, graph: Graph, source: dict[Value, int], group: int | None,
              box: int | None) -> None:
        for node in graph.nodes:
            if node.op == FUSION_GROUP:
                gid = len(self.groups)
                self.groups.append({"id": gid, "ops": node.region.num_nodes(), "box": box,
                                    "region": node.region.name})
                self.group_nodes.append(node)
                self._enter(node, node.region, source, gid, box)
            elif node.op == CALL_SUBGRAPH or node.region is not None:
                callee = (self.root.subgraphs[node.attrs["callee"]] if node.op == CALL_SUBGRAPH
                          else node.region)
                bid = len(self.boxes)
                self.boxes.append({"id": bid, "label": f"{node.op} @{callee.name}",
                                   "parent": box})
                self._enter(node, callee, source, group, bid)
            else:
                nid = self._add("op", node.op, _type(node.outputs[0]) if node.outputs else "",
                                group, box, " ".join(v.name for v in node.outputs))
                for v in node.inputs:
                    self._edge(source.get(v), nid)
                for v in node.outputs:
                    source[v] = nid

    def _enter(self, node: Node, body: Graph, source: dict[Value, int], group: int | None,
               box: int | None) -> None:
        """Draw ``body`` in place of ``node``: its inputs are the node's, and the node's
        outputs come from the ops that produce the body's outputs."""
        inner = {inside: source.get(outside) for inside, outside in zip(body.inputs,
                                                                        node.inputs)}
        self._walk(body, inner, group, box)
        for outside, inside in zip(node.outputs, body.outputs):
            nid = inner.get(inside)
            source[outside] = nid
            if nid is not None and self.nodes[nid]["kind"] == "op":
                names = self.nodes[nid]["name"].split()
                if outside.name not in names:  # the name the printed graph uses outside
                    self.nodes[nid]["name"] = " ".join([outside.name, *names])


def _type(v: Value) -> str:
    try:
        return format_type(v.type)
    except Exception:  # a type the printer does not know: the page still shows the op
        return str(v.type)
