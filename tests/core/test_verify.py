"""verify(): the IR invariants, and error messages that point at the node in printed IR."""

from __future__ import annotations

import pytest

from torchloom.errors import VerifyError
from torchloom.ir import Graph, TensorType, parse_graph, verify
from torchloom.ops.aten import default_registry

GOOD = """\
graph @g(%x: f32[4, 8], %y: f32[8]) {
  %e, %r = torchloom.fusion_group(%x, %y) : f32[4, 8], f32[4] region @group0(%a: f32[4, 8], %b: f32[8]) {
    %s = aten.add.Tensor(%a, %b) : f32[4, 8]
    %e = aten.exp.default(%s) : f32[4, 8]
    %r = aten.sum.dim_IntList(%e) {dim = [-1]} : f32[4]
    return %e, %r
  }
  %n = aten.neg.default(%r) : f32[4]
  return %e, %n
}
"""


@pytest.fixture
def registry():
    return default_registry()


def parts(g: Graph):
    group, neg = list(g.nodes)
    return group, neg, {n.outputs[0].name: n for n in group.region.nodes}


def test_good_graph_verifies(registry):
    verify(parse_graph(GOOD), registry)


def expect(g: Graph, registry, *words):
    with pytest.raises(VerifyError) as info:
        verify(g, registry)
    for w in words:
        assert w in str(info.value), str(info.value)
    return str(info.value)


def test_use_before_def(registry):
    g = parse_graph(GOOD)
    group, neg, _ = parts(g)
    g._unlink(neg)  # put %n first, ahead of its producer, bypassing move_before's check
    g._link(neg, None)
    msg = expect(g, registry, "input 0 (%r) is used before it is defined")
    assert "aten.neg.default(%r) : f32[4]" in msg  # the node, as printed IR


def test_use_of_erased_value_is_caught(registry):
    g = parse_graph("graph @g(%x: f32[4]) {\n  %a = aten.neg.default(%x) : f32[4]\n"
                    "  %b = aten.exp.default(%a) : f32[4]\n  return %b\n}\n")
    a, b = list(g.nodes)
    a.outputs[0].uses.clear()
    g.erase(a)  # leaves %b reading a value that is no longer defined
    expect(g, registry, "(%a) is used before it is defined", "aten.exp.default(%a)")


def test_dangling_use(registry):
    g = parse_graph(GOOD)
    group, neg, _ = parts(g)
    group.outputs[0].uses.append(neg)  # %e claims %n reads it; %n does not
    expect(g, registry, "%e lists a use by aten.neg.default that does not read it")


def test_dangling_use_of_graph_input(registry):
    g = parse_graph(GOOD)
    group, neg, _ = parts(g)
    g.inputs[1].uses.append(neg)
    expect(g, registry, "input %y lists a use by aten.neg.default", "dangling use")


def test_missing_use_record(registry):
    g = parse_graph(GOOD)
    group, neg, _ = parts(g)
    group.outputs[1].uses.clear()
    expect(g, registry, "use list of %r records this node 0 time(s), but it is read 1 time(s)")


def test_type_mismatch_against_shape_inference(registry):
    g = parse_graph(GOOD.replace("%n = aten.neg.default(%r) : f32[4]",
                                 "%n = aten.neg.default(%r) : f16[4]"))
    expect(g, registry, "output 0 (%n) is declared f16[4] but aten.neg.default gives f32[4]")
    g = parse_graph(GOOD.replace("{dim = [-1]} : f32[4]", "{dim = [-1]} : f32[8]").replace(
        ": f32[4, 8], f32[4] region", ": f32[4, 8], f32[8] region").replace(
        "aten.neg.default(%r) : f32[4]", "aten.neg.default(%r) : f32[8]"))
    expect(g, registry, "(%r) is declared f32[8] but aten.sum.dim_IntList gives f32[4]")


def test_typed_memo_infers_a_node_again_only_when_its_op_attrs_or_types_change(
        registry, monkeypatch):
    import torchloom.ops.registry as ops_registry
    inferred = []
    real = ops_registry.OpDef.infer_types

    def spy(self, node):
        inferred.append(node.outputs[0].name)
        return real(self, node)

    monkeypatch.setattr(ops_registry.OpDef, "infer_types", spy)
    g, typed = parse_graph(GOOD), {}
    verify(g, registry, typed=typed)
    assert sorted(inferred) == ["e", "n", "r", "s"]
    inferred.clear()
    verify(g, registry, typed=typed)  # nothing changed: no inference at all
    assert inferred == []
    _, neg, inner = parts(g)
    inner["e"].with_attrs(note=1)  # new attributes: inferred again (they may matter)
    verify(g, registry, typed=typed)
    assert inferred == ["e"]
    inferred.clear()
    neg.outputs[0].type = TensorType.make([4], "f16")  # a wrong type is still caught
    expect(g, registry, "output 0 (%n) is declared f16[4] but aten.neg.default gives f32[4]")
    with pytest.raises(VerifyError, match="declared f16"):
        verify(g, registry, typed=typed)
    neg.outputs[0].type = TensorType.make([4], "f32")  # an equal, new type object
    neg.op = "aten.relu.default"  # another op: inferred again
    inferred.clear()
    verify(g, registry, typed=typed)
    assert inferred == ["n"]


def test_type_checks_need_a_registry():
    g = parse_graph(GOOD.replace("aten.neg.default(%r) : f32[4]", "aten.neg.default(%r) : f16[4]"))
    verify(g)  # structure only
    with pytest.raises(VerifyError):
        verify(g, default_registry())


@pytest.mark.parametrize("old, new, words", [
    ("region @group0(%a: f32[4, 8], %b: f32[8])", "region @group0(%a: f32[4, 8])",
     "region has 1 inputs, the node passes 2"),
    ("region @group0(%a: f32[4, 8], %b: f32[8])", "region @group0(%a: f32[4, 8], %b: f16[8])",
     "region input 1 is f16[8] but the node passes f32[8]"),
    ("    return %e, %r\n", "    return %e\n", "region returns 1 values, the node declares 2 outputs"),
    ("    return %e, %r\n", "    return %r, %e\n",
     "region output 0 is f32[4] but the node declares f32[4, 8]"),
])
def test_region_mismatches(registry, old, new, words):
    # the region's add reads %a twice, so dropping the parameter %b still parses
    text = GOOD.replace("aten.add.Tensor(%a, %b)", "aten.add.Tensor(%a, %a)")
    g = parse_graph(text.replace(old, new))
    expect(g, registry, words, "torchloom.fusion_group(%x, %y)")


def test_region_reading_an_outer_value(registry):
    g = parse_graph(GOOD)
    group, _, inner = parts(g)
    inner["s"].set_input(1, g.inputs[1])  # the region reads the outer %y instead of %b
    expect(g, registry, "input 1 (%y) is not defined in this graph",
           "regions may only read their own inputs")


def test_region_owner_must_point_back(registry):
    g = parse_graph(GOOD)
    group, neg, _ = parts(g)
    group.region.owner = neg
    expect(g, registry, "region does not point back at its node")


def test_duplicated_names(registry):
    g = parse_graph(GOOD)
    group, neg, _ = parts(g)
    neg.outputs[0].name = "e"
    expect(g, registry, "value name %e is defined twice")
    g = parse_graph(GOOD)
    g.inputs[1].name = "x"
    expect(g, registry, "value name %x is defined twice")


def test_output_not_defined(registry):
    g = parse_graph(GOOD)
    _, _, inner = parts(g)
    g.outputs[1] = inner["s"].outputs[0]
    expect(g, registry, "output 1 (%s) is not defined in this graph")


def test_corrupt_node_list(registry):
    g = Graph("g")
    x = g.add_input(TensorType.make([2]), "x")
    a = g.create("aten.neg.default", [x], [x.type])
    g.create("aten.neg.default", [a.output], [x.type])
    g._len = 5
    expect(g, registry, "node count 5 disagrees with the node list (2)")
