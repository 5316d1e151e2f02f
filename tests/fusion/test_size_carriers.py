"""fusion.size-carriers: a group whose types name a size symbol that no tensor input holds
as a dim (and no int input gives) is passed a graph input that does, read for its shape
only; the cpu codegen then compiles what it declined ("size symbol s0 has no value in the
kernel"), values equal to eager's at every size."""

from __future__ import annotations

import math

import pytest
import torch

from fusion_testing import groups
from torchloom.api import PassContext, ScalarType, parse_graph, print_graph, verify
from torchloom.backend import torchloom_backend
from torchloom.tools import Compiler
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


def _fold(x: torch.Tensor) -> torch.Tensor:
    """MobileViT's unfolding into 2x2 patches and folding back (sizes from math.ceil)."""
    b, c, h, w = x.shape
    nh, nw = int(math.ceil(h / 2)), int(math.ceil(w / 2))
    y = x.reshape(b * c * nh, 2, nw, 2).transpose(1, 2)
    y = y.reshape(b, c, nh * nw, 4).transpose(1, 3)
    y = y.reshape(b, 4, nh * nw, c) + 1
    y = y.transpose(1, 3).reshape(b * c * nh, nw, 2, 2).transpose(1, 2)
    return y.reshape(b, c, h, w) * 2


def test_patches_of_ceil_sizes_compile_at_dynamic_sizes():
    """The groups of MobileViT's fold need the image's height and width, dims of no
    tensor the groups read: each compiles on cpu, the backward's with carriers, int
    inputs of the graph that are the symbols (``int[s0]``: Dynamo passes them; the
    forward's groups take them as their views' sizes)."""
    compiler = Compiler("default", compile_cache=False)
    torch._dynamo.reset()
    f = torch.compile(_fold, dynamic=True, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    g = torch.Generator().manual_seed(3)
    for h, w in ((6, 8), (8, 10), (10, 4)):
        x = torch.randn(2, 8, h, w, generator=g)
        weight = torch.randn(2, 8, h, w, generator=g)
        got, want = x.clone().requires_grad_(), x.clone().requires_grad_()
        out = f(got)
        torch.testing.assert_close(out, _fold(want))
        (out * weight).sum().backward()
        (_fold(want) * weight).sum().backward()
        torch.testing.assert_close(got.grad, want.grad)
    choices = [ch for c in compiler.compilations for ch in c.compiled.choices]
    assert [ch.codegen for ch in choices] == ["cpu"] * len(choices)
    carried = [v.type for c in compiler.compilations for n in c.compiled.graph.nodes
               if n.op == "torchloom.fusion_group" for v in n.region.inputs if not v.uses]
    assert carried and all(isinstance(t, ScalarType) and t.size for t in carried)
