"""``clone_graph`` with sizes mapped: the copy has the new sizes in every type (inputs,
node outputs, regions) and attribute, verifies, and the original is untouched."""

from hypothesis import given, settings
from hypothesis import strategies as st

from torchloom.ir import ScalarType, clone_graph, parse_graph, print_graph, verify

TEXT = """graph @g(%x: f32[4, 6], %s: f32[24]) {
  %t = aten.exp.default(%x) : f32[4, 6]
  %n = torchloom.fusion_group(%t, %s) : f32[24] region @fused_n(%a: f32[4, 6], %b: f32[24]) {
    %v = aten.view.default(%a) {size = [24]} : f32[24]
    %m = aten.mul.Tensor(%v, %b) : f32[24]
    return %m
  }
  return %n
}
"""


def _resize(old: int, new: int):
    def dim(d):
        return new if d == old and type(d) is int else d

    def attr(a):
        return type(a)(attr(x) for x in a) if isinstance(a, (list, tuple)) else dim(a)
    return dim, attr


def test_sizes_map_in_types_regions_and_attributes():
    graph = parse_graph(TEXT)
    before = print_graph(graph)
    dim, attr = _resize(24, 12)
    copy, mapping = clone_graph(graph, dim=lambda d: 2 if d == 4 else dim(d), attr=attr)
    verify(copy)
    assert print_graph(graph) == before  # the original is untouched
    assert copy.inputs[0].type.shape == (2, 6) and copy.inputs[1].type.shape == (12,)
    region = next(n for n in copy.nodes if n.region is not None).region
    assert [v.type.shape for v in region.inputs] == [(2, 6), (12,)]
    view = next(n for n in region.nodes if n.op == "aten.view.default")
    assert list(view.attrs["size"]) == [12]
    assert set(mapping) >= set(graph.inputs) and all(v.graph is copy for v in mapping.values()
                                                     if v.producer is None)


def test_without_maps_the_copy_prints_the_same():
    graph = parse_graph(TEXT)
    copy, _ = clone_graph(graph)
    assert print_graph(copy) == print_graph(graph)
    verify(copy)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 64))
def test_any_size_consistent_everywhere_verifies(n):
    """Mapping a size that every type and attribute shares keeps the graph valid."""
    graph = parse_graph(TEXT.replace("f32[4, 6]", "f32[24]"))
    dim, attr = _resize(24, n)
    copy, _ = clone_graph(graph, dim=dim, attr=attr)
    verify(copy)
    assert {v.type.shape for v in copy.inputs} == {(n,)}


def test_a_dim_map_maps_an_int_that_is_a_size_too():
    """``int[s0]`` follows the dims it is one of: renamed with them, and a plain int
    where the map makes the size a number (``torchloom reduce``)."""
    g = parse_graph("""graph @g(%x: f32[s0, 4], %n: int[s0]) {
  %y = aten.mul.Tensor(%x) {other = 2} : f32[s0, 4]
  return %y
}""")
    renamed = clone_graph(g, dim=lambda d: "s7" if d == "s0" else d)[0]
    assert [str(v.type) for v in renamed.inputs][1] == "ScalarType(kind='int', size='s7')"
    fixed = clone_graph(g, dim=lambda d: 5 if d == "s0" else d)[0]
    assert fixed.inputs[1].type == ScalarType("int")
