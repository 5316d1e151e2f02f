"""A deliberately wrong pass, as a fake installed plugin, for the tests of
``verify = "numeric"`` and ``torchloom reduce`` (no test functions here).

``wrong.silu`` rewrites ``x * sigmoid(x)`` (SiLU) into ``relu(x)``: the graph stays valid,
only its values change, so only numeric verification catches it. ``wrong.silu-pattern`` is
the same mistake written as a pattern pass (``pattern_pass``), as a user would write it.
"""

from __future__ import annotations

import pytest

WRONG_PASSES = '''
from typing import ClassVar

import attrs

import torch

from torchloom.api import Pass, PassResult, hookimpl, pattern_pass

WrongSiluPattern = pattern_pass("wrong.silu-pattern", lambda x: x * torch.sigmoid(x),
                                lambda x: torch.relu(x), [torch.randn(8)])


@attrs.frozen
class WrongSilu(Pass):
    """Rewrites x * sigmoid(x) into relu(x), which is wrong for negative x."""
    name: ClassVar[str] = "wrong.silu"

    def run(self, graph, ctx):
        rewritten = 0
        for node in list(graph.nodes):
            if node.op != "aten.mul.Tensor" or len(node.inputs) != 2:
                continue
            a, b = node.inputs
            for x, s in ((a, b), (b, a)):
                sig = s.producer
                if sig is not None and sig.op == "aten.sigmoid.default" and sig.inputs[0] is x:
                    relu = graph.create("aten.relu.default", [x], [node.output.type],
                                        before=node)
                    graph.replace_all_uses(node.output, relu.output)
                    graph.erase(node)
                    rewritten += 1
                    break
        return PassResult(rewritten > 0, {"rewritten": rewritten})


@attrs.frozen
class Crash(Pass):
    """Raises on any graph holding an aten.tanh.default."""
    name: ClassVar[str] = "wrong.crash-on-tanh"

    def run(self, graph, ctx):
        if any(n.op == "aten.tanh.default" for n in graph.nodes):
            raise RuntimeError("cannot handle tanh")
        return PassResult(False)


@hookimpl
def torchloom_passes():
    return [WrongSilu, Crash, WrongSiluPattern]
'''

PIPELINE = """\
[pipeline]
name = "wrong"
codegen = "eager"
verify = "{verify}"
on_error = "{on_error}"

[[pass]]
name = "cse"

[[pass]]
name = "{wrong}"
"""

#: a SiLU MLP's forward: the SiLU sits among other ops, so reduction has work to do
WORKLOAD = """\
import torch

def workload():
    torch.manual_seed(0)
    w1, w2 = torch.randn(16, 32) / 4, torch.randn(32, 8) / 4

    def mlp(x):
        h = x @ w1
        h = torch.tanh(h) + h
        h = h * torch.sigmoid(h)
        y = torch.exp(h @ w2 - 1.0)
        return y.sum(dim=-1), h.abs().amax()

    return mlp, [torch.randn(6, 16)]
"""


@pytest.fixture
def wrong_plugins(fake_site):
    """The core built-ins plus the ``wrong-passes`` distribution (entry point ``wrong``)."""
    from torchloom.plugins.loader import load_plugins
    fake_site.add("wrong-passes", version="0.1.0", modules={"tl_wrong_passes": WRONG_PASSES},
                  entry_points={"wrong": "tl_wrong_passes"})
    return load_plugins(entry_points=fake_site.entry_points())


#: the wrong rewrite written by hand and as a pattern pass
WRONG = ["wrong.silu", "wrong.silu-pattern"]


def write_pipeline(path, verify="numeric", on_error="raise", wrong="wrong.silu"):
    path.write_text(PIPELINE.format(verify=verify, on_error=on_error, wrong=wrong))
    return path
