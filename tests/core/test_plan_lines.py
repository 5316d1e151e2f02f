"""A boxed plan's body has the line numbers of ``Plan.source`` (diagnose maps the line of a
failing frame of the generated code to its node): for a failure at each node of a chain,
the traceback's line in ``run_boxed`` and in ``run`` is the source line calling that node."""

from __future__ import annotations

import pytest
import torch

from torchloom.codegen.plan import build_function
from torchloom.ir import parse_graph
from torchloom.ops.aten import default_registry

CHAIN = """graph @g(%x: f32[4], %y: f32[4]) {
  %a = aten.add.Tensor(%x, %y) : f32[4]
  %b = aten.mul.Tensor(%a, %y) : f32[4]
  %c = aten.sub.Tensor(%b, %x) : f32[4]
  %d = aten.div.Tensor(%c, %a) : f32[4]
  return %d
}
"""


def _failing_line(call, args) -> int:
    with pytest.raises(RuntimeError, match="planted") as info:
        call(args)
    tb, line = info.value.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith("<torchloom @"):
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


@pytest.mark.parametrize("victim", range(4))
def test_boxed_and_plain_plans_fail_at_the_same_source_line(victim):
    registry = default_registry()
    plan = build_function(parse_graph(CHAIN), registry, boxed=True)
    name = f"f{victim}"
    fn = plan.fn.__globals__[name]

    def planted(*args, **kwargs):
        raise RuntimeError("planted")
    plan.fn.__globals__[name] = planted  # run and run_boxed share their globals
    try:
        x, y = torch.randn(4), torch.randn(4)
        plain = _failing_line(lambda a: plan.fn(*a), [x, y])
        boxed = _failing_line(plan.boxed, [x, y])
    finally:
        plan.fn.__globals__[name] = fn
    assert plain == boxed
    assert f"{name}(" in plan.source.splitlines()[plain - 1]
    args = [x, y]
    torch.testing.assert_close(plan.boxed(args)[0], plan.fn(x, y)[0])
    assert args == []  # the boxed entry took the caller's references
