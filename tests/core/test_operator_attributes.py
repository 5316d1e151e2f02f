"""Torch operators as attribute values (``#op:aten.native_dropout.default``): activation
checkpointing's ``run_and_save_rng_state``/``run_with_rng_state`` take the op they run as
an argument. Such a graph had no IR text form, so every checkpointed graph that drew
random numbers (dropout, and SDPA on the CPU, whose kernel takes a dropout probability)
ran on eager whole; now it compiles, its random ops opaque, and the recomputation in the
backward draws eager's masks."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch.utils.checkpoint import checkpoint

from torchloom.api import parse_graph, print_graph, verify
from torchloom.errors import ParseError
from torchloom.ir.printer import format_attr
from torchloom.ir.torch_ops import find_callable, operator_name
from torchloom.ops.aten import default_registry
from torchloom.tools import Compiler

TEXT = """graph @g(%x: f32[4, 8]) {
  %r = higher_order.run_and_save_rng_state(%x) {args = [#op:aten.native_dropout.default, $0, 0.1, true]} : any
  return %r
}
"""


@pytest.mark.parametrize("op", [torch.ops.aten.native_dropout.default,
                                torch.ops.aten.add.Tensor,
                                torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
                                torch.ops.higher_order.run_with_rng_state])
def test_an_operator_prints_and_parses_back_to_itself(op):
    text = format_attr(op)
    assert text == f"#op:{operator_name(op)}"
    assert find_callable(operator_name(op)) is op
    graph = parse_graph(TEXT.replace("aten.native_dropout.default", operator_name(op)))
    (node,) = graph.nodes
    assert node.attrs["args"][0] is op
    assert print_graph(parse_graph(print_graph(graph))) == print_graph(graph)


def test_the_graph_verifies_and_round_trips():
    graph = parse_graph(TEXT)
    verify(graph, default_registry())
    assert print_graph(graph) == TEXT


@pytest.mark.parametrize("name", ["aten.no_such_op.default", "load_library.__self__.x",
                                  "aten.add.__call__", "higher_order.__class__", "os.system",
                                  "python.operator.getitem"])
def test_a_name_no_torch_operator_has_is_a_parse_error(name):
    with pytest.raises(ParseError, match="no torch operator of that name"):
        parse_graph(TEXT.replace("aten.native_dropout.default", name))


class Layers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Dropout(0.25),
            torch.nn.Linear(32, 16), torch.nn.LayerNorm(16)) for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = x + checkpoint(block, x, use_reentrant=False)
        return x


@pytest.mark.parametrize("dropout", [0.25, 0.0])
def test_checkpointed_layers_with_dropout_compile_and_draw_eagers_masks(tmp_path, dropout):
    torch.manual_seed(0)
    eager = Layers()
    for m in eager.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = dropout
    ours = Layers()
    ours.load_state_dict(eager.state_dict())
    for m in ours.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = dropout
    compiler = Compiler("default", cache_dir=tmp_path, compile_cache=False)
    torch._dynamo.reset()
    from torchloom.backend import torchloom_backend
    fn = torch.compile(ours, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    x = torch.randn(8, 16)
    states, grads, outs = [], [], []
    for model, call in ((eager, eager), (ours, fn)):
        torch.manual_seed(7)
        y = call(x)
        (y * torch.linspace(-1, 1, 16)).sum().backward()
        states.append(torch.get_rng_state())
        outs.append(y.detach())
        grads.append([p.grad for p in model.parameters()])
    torch._dynamo.reset()
    assert torch.equal(states[0], states[1])  # as many draws as eager
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)  # eager's masks
    for got, want in zip(*grads[::-1]):
        # recomputed: the same up to f32 rounding, which an element that cancels (a sum of
        # products of both signs) shows relative to the gradient's scale, not its own
        # (eager's own error against float64 here: 3.4e-7 of the largest gradient)
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6 * max(scale, 1.0))
    assert compiler.compilations and all(c.fallback_reason is None
                                         for c in compiler.compilations), \
        [c.fallback_reason for c in compiler.compilations]
    assert sum(len(c.compiled.choices) for c in compiler.compilations) > 0
