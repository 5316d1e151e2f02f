"""A renderer may give the lowering a ``spelling`` of its own (``torchloom.api.spelling``):
values spelt as expression nodes with the emitter at hand, where text methods are not
enough (a helper of the renderer's own, named with ``em.use`` and rendered from
``Lowered.needs``; an operand bound to a name first). ``scalar_c``
with its exp spelt as a helper of its module (in double): the source calls the helper on
an operand bound to a name and matches eager; what the spelling declines declines the
group with its reason; a ``spelling`` that is no Spelling is an error naming the renderer."""

from __future__ import annotations

import pytest
import torch

from torchloom.api import RendererCodegen, Unsupported, expr, parse_graph, spelling, stmt
from torchloom.errors import PluginError
from torchloom.testing.renderers import lowered_against_eager

HELPER = ("#include <math.h>\n"
          "static inline float my_exp(double x) { return (float)exp(x); }\n")
#: the renderer's module helpers, by the name its spelling asks for (``em.use``)
HELPERS = {"my_exp": HELPER}


class _HelperExp(spelling.TextSpelling):
    """scalar_c's spelling, but exp: ``my_exp`` (exp in double, rounded once) of its
    operand converted to double and bound to a name first; tanh declined."""

    def op(self, node, spec, named, compute, ir_dtype, given, em):
        if node.op == "aten.tanh.default":
            raise Unsupported("tanh: this renderer's spelling has none")
        if node.op == "aten.exp.default" and compute == "f32":
            em.use("my_exp")  # (the module defines it: render reads Lowered.needs)
            arg = em.emit(expr.Op("(double){0}", expr.LOWEST, (named["self"],)), "f64", "arg")
            return expr.Op("my_exp({0})", expr.POSTFIX, (arg.code,))
        return super().op(node, spec, named, compute, ir_dtype, given, em)


def _renderer(scalar_c, own=None):
    base, _ = scalar_c

    class WithHelper(base):
        name = "scalar_c_helper"

        def __init__(self):
            super().__init__()
            self.spelling = _HelperExp(self) if own is None else own

        def render(self, kernel) -> str:
            helpers = [HELPERS[name] for name in kernel.needs]
            return "".join(helpers) + super().render(kernel)
    return WithHelper()


def _graph(op: str, shape=(6, 10)) -> str:
    dims = ", ".join(map(str, shape))
    return f"""graph @g(%a: f32[{dims}]) {{
  %o = torchloom.fusion_group(%a) : f32[{dims}] region @k(%x: f32[{dims}]) {{
    %t0 = aten.mul.Tensor(%x) {{other = 0.5}} : f32[{dims}]
    %t1 = {op}(%t0) : f32[{dims}]
    return %t1
  }}
  return %o
}}
"""


@pytest.mark.parametrize("shape", [(6, 10), (1, 1), (3, 0), (257,)])
def test_a_renderer_spelling_writes_its_values(scalar_c, shape):
    renderer = _renderer(scalar_c)
    _, registry = scalar_c
    a = torch.randn(shape)
    a.view(-1)[: min(3, a.numel())] = torch.tensor([float("inf"), float("-inf"),
                                                    float("nan")])[: min(3, a.numel())]
    lowered = lowered_against_eager(renderer, registry, _graph("aten.exp.default", shape),
                                    (a,))  # (within an ulp of eager's exp)
    source = RendererCodegen(renderer).generate(next(parse_graph(
        _graph("aten.exp.default", shape)).nodes), registry).source
    assert lowered.needs == (("my_exp",) if a.numel() else ())
    assert (HELPER in source) == bool(a.numel())  # (an empty output computes nothing)
    if a.numel():
        assert "my_exp(arg" in source
        # the operand bound to a name first: a declaration of it, then exp's
        names = [s.name for s in stmt.walk(list(lowered.body)) if isinstance(s, stmt.Declare)]
        assert any(n.startswith("arg") for n in names), names


def test_what_the_spelling_declines_declines_the_group(scalar_c):
    renderer = _renderer(scalar_c)
    _, registry = scalar_c
    group = next(parse_graph(_graph("aten.tanh.default")).nodes)
    reason = RendererCodegen(renderer).supports(group, registry)
    assert reason is not None and "this renderer's spelling has none" in reason.message


def test_a_spelling_that_is_no_spelling_names_the_renderer(scalar_c):
    """Found when the codegen is made (in the plugin's hook: the loader reports it as the
    plugin's load error), not once per group."""
    renderer = _renderer(scalar_c, own="not a spelling")
    with pytest.raises(PluginError, match="renderer scalar_c_helper: its spelling is a str"):
        RendererCodegen(renderer)
