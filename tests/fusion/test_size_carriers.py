"""fusion.size-carriers: a group whose types name a size symbol that no tensor input holds
as a dim (and no int input gives) is passed a graph input that does, read for its shape
only; the cpu codegen then compiles what it declined ("size symbol s0 has no value in the
kernel"), values equal to eager's at every size (MobileViT's fold at dynamic sizes:
tests/codegen_cpu/test_cpu_found_by_models.py)."""

from __future__ import annotations

import pytest

from fusion_testing import groups
from torchloom.api import PassContext, parse_graph, print_graph, verify
from torchloom_fusion.size_carriers import SizeCarriers, needed_symbols

_HALF = "CeilToInt(IntTrueDiv(s0,2))"

GRAPH = f"""graph @g(%x: f32[s0, 4], %y: f32["{_HALF}", 4], %w: f32[s1] @meta) {{
  %z = torchloom.fusion_group(%y) : f32["{_HALF}", 4] region @k(%p: f32["{_HALF}", 4]) {{
    %t = aten.mul.Tensor(%p) {{other = 2}} : f32["{_HALF}", 4]
    return %t
  }}
  return %z
}}"""


def test_a_graph_input_holding_the_symbol_is_passed_for_its_shape(registry):
    graph = parse_graph(GRAPH)
    (group,) = groups(graph)
    assert needed_symbols(group) == ["s0"]
    result = SizeCarriers().run(graph, PassContext(registry=registry))
    verify(graph, registry)
    assert result.changed and result.stats == {"carriers": 1}
    assert [v.name for v in group.inputs] == ["y", "x"]
    carrier = group.region.inputs[1]
    assert not carrier.uses and str(carrier.type) == str(graph.inputs[0].type)
    assert needed_symbols(group) == []
    before = print_graph(graph)  # idempotent: a second run changes nothing
    assert not SizeCarriers().run(graph, PassContext(registry=registry)).changed
    assert print_graph(graph) == before


def test_an_int_that_is_the_symbol_is_the_carrier_first(registry):
    graph = parse_graph(GRAPH.replace("%w: f32[s1] @meta", "%n: int[s0]"))
    (group,) = groups(graph)
    assert SizeCarriers().run(graph, PassContext(registry=registry)).changed
    verify(graph, registry)
    assert [v.name for v in group.inputs] == ["y", "n"]
    assert str(group.region.inputs[1].type) == "ScalarType(kind='int', size='s0')"
    assert "%n_size: int[s0]" in print_graph(graph)


@pytest.mark.parametrize("case", ["held", "from an int", "other device", "no holder"])
def test_groups_that_need_no_carrier_or_have_none_are_left(registry, case):
    if case == "held":
        text = GRAPH.replace('region @k(%p: f32["' + _HALF + '", 4])',
                             'region @k(%p: f32["' + _HALF + '", 4], %q: f32[s0, 4])'
                             ).replace("fusion_group(%y)", "fusion_group(%y, %x)")
    elif case == "from an int":
        text = """graph @g(%x: f32["s0*s1", 4], %n: int, %m: int) {
  %z = torchloom.fusion_group(%x, %n, %m) : f32[s0, s1, 4] region @k(%p: f32["s0*s1", 4], %a: int, %b: int) {
    %v = aten.view.default(%p, %a, %b) {size = [$1, $2, 4]} : f32[s0, s1, 4]
    return %v
  }
  return %z
}"""
    elif case == "other device":
        text = GRAPH.replace("%x: f32[s0, 4]", "%x: f32[s0, 4] @meta")
    else:
        text = GRAPH.replace("%x: f32[s0, 4]", '%x: f32["2*s0", 4]')
    graph = parse_graph(text)
    assert not SizeCarriers().run(graph, PassContext(registry=registry)).changed



SHARED = f"""graph @g(%x: f32[s0, 4], %y: f32["{_HALF}", 4], %n: int[s0]) {{
  %a = torchloom.call_subgraph(%y) {{callee = "layer"}} : f32["{_HALF}", 4]
  %b = torchloom.call_subgraph(%a) {{callee = "layer"}} : f32["{_HALF}", 4]
  return %b
}}
graph @layer(%p: f32["{_HALF}", 4]) {{
  %z = torchloom.fusion_group(%p) : f32["{_HALF}", 4] region @k(%q: f32["{_HALF}", 4]) {{
    %t = aten.mul.Tensor(%q) {{other = 2}} : f32["{_HALF}", 4]
    return %t
  }}
  return %z
}}
"""


@pytest.mark.parametrize("holder", ["int", "tensor"])
def test_a_group_in_a_shared_subgraph_gets_the_carrier_through_every_call(registry, holder):
    text = SHARED if holder == "int" else SHARED.replace(", %n: int[s0]", "")
    graph = parse_graph(text)
    sub = graph.subgraphs["layer"]
    (group,) = groups(sub)
    ctx = PassContext(registry=registry)
    first = SizeCarriers().run(graph, ctx)  # as the pass manager runs it: the top level,
    second = SizeCarriers().run(sub, ctx)  # then each shared subgraph
    verify(graph, registry)
    assert first.stats == {"carriers": 1} and second.stats == {"carriers": 1}
    want = "n" if holder == "int" else "x"
    assert [v.name for v in sub.inputs] == ["p", f"{want}_size"]
    calls = [n for n in graph.nodes if n.op == "torchloom.call_subgraph"]
    assert [[v.name for v in c.inputs] for c in calls] == [["y", want], ["a", want]]
    assert group.inputs == sub.inputs and needed_symbols(group) == []
    before = print_graph(graph)  # idempotent
    assert not SizeCarriers().run(graph, ctx).changed and not SizeCarriers().run(sub, ctx).changed
    assert print_graph(graph) == before


def test_a_subgraph_called_inside_a_region_is_left(registry):
    """A call inside a region cannot see the top level's carrier: nothing is threaded
    (``add_subgraph_input`` itself refuses)."""
    from torchloom.api import add_subgraph_input
    text = SHARED.replace(
        '  %b = torchloom.call_subgraph(%a) {callee = "layer"} : f32["' + _HALF + '", 4]\n',
        '  %b = torchloom.fusion_group(%a) : f32["' + _HALF + '", 4] region @r(%u: f32["'
        + _HALF + '", 4]) {\n    %c = torchloom.call_subgraph(%u) {callee = "layer"} : f32["'
        + _HALF + '", 4]\n    return %c\n  }\n')
    graph = parse_graph(text)
    verify(graph, registry)
    SizeCarriers().run(graph, PassContext(registry=registry))  # (the region @r gets one)
    assert [v.name for v in graph.subgraphs["layer"].inputs] == ["p"]
    with pytest.raises(ValueError, match="called inside a region"):
        add_subgraph_input(graph.subgraphs["layer"], graph.inputs[2], "n_size")
    with pytest.raises(ValueError, match="no input of"):
        add_subgraph_input(graph.subgraphs["layer"], graph.nodes.__next__().outputs[0], "a")
