"""The FX importer's types are torch's own inference (its fake tensors): ``import_fx``
hands them to the pass manager as agreed (``ir.verify.agreed_types``), so the checks after
each pass infer again only the nodes a pass changed; ``verify = "numeric"`` infers every
node; a pass that changes a node wrongly is still caught."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torchloom.frontend.fx import import_fx
from torchloom.ir import parse_graph, verify
from torchloom.ir.graph import Node
from torchloom.ir.verify import agreed_types
from torchloom.ops.aten import default_registry
from torchloom.tools import Compiler

#: the module (``torchloom.ir.verify`` the attribute is the function of that name)
verify_module = importlib.import_module("torchloom.ir.verify")


def f(x, w):
    return torch.relu(torch.mm(x, w)) * 2.0 + 1.0


def inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(16, 32, generator=g), torch.randn(32, 8, generator=g)


@pytest.fixture
def inferred(monkeypatch):
    """The ops whose types the verifier inferred, in order."""
    seen: list[str] = []
    real = verify_module._verify_types

    def recording(node, registry):
        seen.append(node.op)
        return real(node, registry)
    monkeypatch.setattr(verify_module, "_verify_types", recording)
    return seen


def test_imported_nodes_no_pass_changed_are_not_inferred_again(tmp_path, inferred):
    """Under "each" no op node of this graph is inferred again (the passes move them into a
    group's region unchanged); "numeric" infers every one of them."""
    x, w = inputs()
    seen = {}
    for policy in ("each", "numeric"):
        compiler = Compiler("default", cache_dir=tmp_path / policy, compile_cache=False,
                            verify=policy)
        fn = compiler.compile_fx(make_fx(f)(x, w), [x, w])
        got = fn(x, w)
        torch.testing.assert_close(got[0] if isinstance(got, (tuple, list)) else got,
                                   f(x, w))
        seen[policy] = set(inferred)
        inferred.clear()
    ops = {"aten.mm.default", "aten.relu.default", "aten.mul.Tensor", "aten.add.Tensor"}
    assert not seen["each"] & ops
    assert ops <= seen["numeric"]


def test_agreed_types_hold_each_op_node_as_imported():
    registry = default_registry()
    x, w = (torch.empty(16, 32, device="meta"), torch.empty(32, 8, device="meta"))
    imported = import_fx(make_fx(f)(x, w), [x, w], registry=registry)
    graph = imported.graph
    nodes = {k for k in imported.typed if isinstance(k, Node)}
    assert nodes == set(graph.nodes) and imported.typed == agreed_types(graph)
    assert len(imported.typed) == 2 * len(nodes)  # each node's signature beside it
    verify(graph, registry, typed=dict(imported.typed))  # nothing inferred, nothing wrong


def test_a_node_changed_wrongly_after_import_is_still_caught():
    """The memo holds a node's types as objects: a node given another output type (here
    by hand, as a broken pass would) is inferred again and rejected."""
    registry = default_registry()
    graph = parse_graph("""graph @g(%x: f32[4, 8]) {
  %y = aten.relu.default(%x) : f32[4, 8]
  return %y
}""")
    typed = agreed_types(graph)
    node = next(iter(graph.nodes))
    wrong = parse_graph("""graph @h(%x: f32[4, 9]) {
  return %x
}""").inputs[0].type
    node.outputs[0].type = wrong
    with pytest.raises(Exception, match="declared f32\\[4, 9\\]"):
        verify(graph, registry, typed=typed)


def test_a_copy_of_an_agreed_node_is_not_inferred_again_and_others_are(inferred):
    """A pass's copy of an agreed node (a shared layer's subgraph: new node objects, the
    same op, attributes and types) is not inferred again; a node of other input types
    is, and a copy declared with another output type is inferred and rejected."""
    registry = default_registry()
    graph = parse_graph("""graph @g(%x: f32[4, 8]) {
  %y = aten.relu.default(%x) : f32[4, 8]
  return %y
}""")
    typed = agreed_types(graph)
    copies = parse_graph("""graph @h(%a: f32[4, 8], %b: f32[2, 8]) {
  %c = aten.relu.default(%a) : f32[4, 8]
  %d = aten.relu.default(%b) : f32[2, 8]
  return %c, %d
}""")
    verify(copies, registry, typed=typed)
    assert inferred == ["aten.relu.default"]  # %d's only
    wrong = parse_graph("""graph @w(%a: f32[4, 8]) {
  %c = aten.relu.default(%a) : f32[4, 9]
  return %c
}""")
    with pytest.raises(Exception, match="declared f32\\[4, 9\\]"):
        verify(wrong, registry, typed=typed)
