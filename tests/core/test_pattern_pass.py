"""``torchloom.api.pattern_pass``: a rewrite written as two Python functions.

- a 9-line plugin rewriting ``x * sigmoid(x)`` into ``silu(x)`` fires in the forward and
  the backward graph of a SiLU MLP compiled with the torchloom backend, and the results
  (loss and gradients) are eager's;
- on a training graph whose forward returns the sigmoid (saved for the backward) the
  rewrite keeps it instead of failing with ``cannot erase %sigmoid: still used``;
- matching rules (unit level; the golden files of ``examples/third_party_plugin`` show
  them as IR): repeated names, commutativity, scalar equality, parameters, ``check``;
- errors name the pass and the rule; random graphs (alone, or as the region of a fusion
  group) stay verified and compute the same.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchloom.api import Match, Rewrite, pattern_pass
from torchloom.errors import PluginError
from torchloom.ir import Graph, parse_graph, print_graph, verify
from torchloom.ir.graph import FUSION_GROUP
from torchloom.ops.aten import default_registry
from torchloom.passes.base import PassContext
from torchloom.runtime.executor import build_function
from torchloom.testing.programs import random_program

from test_plugins_support import FakeSite, fake_site  # noqa: F401 (fixture)

REGISTRY = default_registry()

#: the whole plugin: 9 lines
SILU_PLUGIN = '''
import torch
from torchloom.api import hookimpl, pattern_pass

Silu = pattern_pass("mine.silu", lambda x: x * torch.sigmoid(x),
                    lambda x: torch.nn.functional.silu(x), [torch.randn(8)])

@hookimpl
def torchloom_passes():
    return [Silu]
'''


def run(pass_cls, text: str):
    g = parse_graph(text)
    ctx = PassContext(registry=REGISTRY)
    result = pass_cls().run(g, ctx)
    verify(g, REGISTRY)
    return g, result, ctx


# ---- the SiLU MLP, forward and backward --------------------------------------------------
@pytest.fixture
def silu_plugin(fake_site: FakeSite):
    fake_site.add("mine-silu", version="0.1.0", modules={"tl_mine_silu": SILU_PLUGIN},
                  entry_points={"mine": "tl_mine_silu"})
    return fake_site


class SiluMLP(torch.nn.Module):
    def __init__(self, checkpointed: bool):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
        self.checkpointed = checkpointed

    def block(self, x):
        h = self.l1(x)
        return self.l2(h * torch.sigmoid(h))

    def forward(self, x):
        if self.checkpointed:  # the backward recomputes the block: the pattern is there too
            return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)
        return self.block(x)


def compile_and_train(checkpointed: bool):
    from torchloom.backend import torchloom_backend
    from torchloom.compiler import Compiler
    assert len([ln for ln in SILU_PLUGIN.strip().splitlines() if ln.strip()]) < 10
    compiler = Compiler({"pipeline": {"name": "silu", "codegen": "eager"},
                         "pass": [{"name": "mine.silu"}, {"name": "dce"}]})
    torch.manual_seed(0)
    model = SiluMLP(checkpointed)
    x = torch.randn(6, 8, requires_grad=True)
    expected = model(x).square().sum()
    expected.backward()
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    loss = compiled(x).square().sum()
    loss.backward()
    torch._dynamo.reset()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close([p.grad for p in model.parameters()] + [x.grad], grads)
    fired = [sum(r.stats.get("rewritten", 0) for r in c.report.records if r.name == "mine.silu")
             for c in compiler.compilations]
    return compiler, fired


def test_silu_fires_in_the_forward_and_the_backward(silu_plugin):
    compiler, fired = compile_and_train(checkpointed=True)
    assert fired == [1, 1]  # forward, backward
    for c in compiler.compilations:
        ops = [n.op for n in c.graph.walk()]
        assert "aten.silu.default" in ops


def test_a_sigmoid_the_forward_returns_is_kept_not_erased(silu_plugin):
    compiler, fired = compile_and_train(checkpointed=False)
    forward = compiler.compilations[0].graph
    assert fired[0] == 1
    sigmoids = [n for n in forward.walk() if n.op == "aten.sigmoid.default"]
    # saved for the backward: still computed and returned, next to the new silu
    assert sigmoids and any(v in forward.outputs for n in sigmoids for v in n.outputs)
    assert "aten.silu.default" in [n.op for n in forward.walk()]


# ---- matching rules -----------------------------------------------------------------------
Silu = pattern_pass("t.silu", lambda x: x * torch.sigmoid(x),
                    lambda x: torch.nn.functional.silu(x), [torch.randn(8)])


def test_a_name_used_twice_must_be_one_value_and_mul_commutes():
    g, result, _ = run(Silu, """
        graph @g(%x: f32[4], %y: f32[4]) {
          %s = aten.sigmoid.default(%y) : f32[4]
          %a = aten.mul.Tensor(%x, %s) : f32[4]
          %b = aten.mul.Tensor(%s, %y) : f32[4]
          return %a, %b
        }
    """)
    assert result.stats == {"rewritten": 1, "kept": 1}  # %s stays: %a reads it
    assert "aten.silu.default(%y)" in print_graph(g) and "aten.mul.Tensor(%x, %s)" in print_graph(g)


def test_scalars_match_equal_scalars_of_the_same_type_only():
    Half = pattern_pass("t.half", lambda x: x * 0.5, lambda x: x / 2.0, [torch.randn(4)])
    g, result, _ = run(Half, """
        graph @g(%x: f32[4]) {
          %a = aten.mul.Tensor(%x) {other = 0.5} : f32[4]
          %b = aten.mul.Tensor(%x) {other = 0.25} : f32[4]
          %c = aten.mul.Tensor(%x) {other = 1} : f32[4]
          return %a, %b, %c
        }
    """)
    assert result.stats == {"rewritten": 1}
    assert "aten.div.Tensor(%x) {other = 2.0}" in print_graph(g)


def test_a_parameter_matches_any_number_the_same_wherever_it_appears():
    Twice = pattern_pass("t.twice", lambda x, a: (x * a) * a, lambda x, a: x * (a * a),
                         [torch.randn(4), 3.0], params=["a"])
    g, result, _ = run(Twice, """
        graph @g(%x: f32[4]) {
          %a = aten.mul.Tensor(%x) {other = 3.0} : f32[4]
          %b = aten.mul.Tensor(%a) {other = 3.0} : f32[4]
          %c = aten.mul.Tensor(%x) {other = 2} : f32[4]
          %d = aten.mul.Tensor(%c) {other = 2} : f32[4]
          %e = aten.mul.Tensor(%x) {other = 2.0} : f32[4]
          %f = aten.mul.Tensor(%e) {other = 5.0} : f32[4]
          return %b, %d, %f
        }
    """)
    # 3.0 * 3.0 traced as 9.0; 2 (an int) is a number for a float parameter; 2.0, 5.0 differ
    text = print_graph(g)
    assert result.stats == {"rewritten": 2}
    assert "{other = 9.0}" in text and "{other = 4}" in text and "{other = 5.0}" in text


def test_check_sees_the_match_and_can_refuse_it():
    seen: list[Match] = []

    def only_2d(match: Match) -> bool:
        seen.append(match)
        return len(match.values["x"].type.shape) == 2

    Checked = pattern_pass("t.checked", lambda x: x * torch.sigmoid(x),
                           lambda x: torch.nn.functional.silu(x), [torch.randn(8)],
                           check=only_2d)
    g, result, _ = run(Checked, """
        graph @g(%x: f32[4], %y: f32[2, 2]) {
          %s = aten.sigmoid.default(%x) : f32[4]
          %a = aten.mul.Tensor(%x, %s) : f32[4]
          %t = aten.sigmoid.default(%y) : f32[2, 2]
          %b = aten.mul.Tensor(%t, %y) : f32[2, 2]
          return %a, %b
        }
    """)
    assert result.stats == {"rewritten": 1, "refused": 1}
    assert [m.values["x"].name for m in seen] == ["x", "y"]
    assert [n.op for n in seen[1].nodes] == ["aten.sigmoid.default", "aten.mul.Tensor"]
    assert seen[1].root.op == "aten.mul.Tensor" and seen[1].rule == "pattern"


def test_a_replacement_returning_an_argument_is_declined_where_it_would_alias():
    Identity = pattern_pass("t.neg-neg", lambda x: -(-x), lambda x: x, [torch.randn(4)])
    g, result, ctx = run(Identity, """
        graph @g(%x: f32[4]) {
          %a = aten.neg.default(%x) : f32[4]
          %b = aten.neg.default(%a) : f32[4]
          %c = aten.neg.default(%x) : f32[4]
          %d = aten.neg.default(%c) : f32[4]
          %e = aten.exp.default(%d) : f32[4]
          return %b, %e
        }
    """)
    assert result.stats == {"rewritten": 1, "declined": 1}
    assert "aten.exp.default(%x)" in print_graph(g) and "returns an argument" in ctx.notes[0]


def test_symbolic_sizes_are_traced_as_symbols_and_expressions_declined():
    MaxSub = pattern_pass("t.maxsub", lambda x, y: torch.maximum(x, y) - y,
                          lambda x, y: torch.relu(x - y), [torch.randn(4), torch.randn(4)])
    g, result, ctx = run(MaxSub, """
        graph @g(%x: f32[s0, 8], %y: f32[s0, 8], %z: f32["2*s0"]) {
          %a = aten.maximum.default(%x, %y) : f32[s0, 8]
          %b = aten.sub.Tensor(%a, %y) : f32[s0, 8]
          %c = aten.maximum.default(%z, %z) : f32["2*s0"]
          %d = aten.sub.Tensor(%c, %z) : f32["2*s0"]
          return %b, %d
        }
    """)
    assert result.stats == {"rewritten": 1, "declined": 1}
    assert "aten.relu.default(%sub) : f32[s0, 8]" in print_graph(g)
    assert "2*s0" in ctx.notes[0] or "expression" in ctx.notes[0] or "symbols" in ctx.notes[0]


# ---- errors name the pass and the rule ------------------------------------------------------
@pytest.mark.parametrize("make, message", [
    (lambda: pattern_pass("t.bad", lambda x: x.item(), lambda x: x, [torch.randn(1)]),
     "pattern pass t.bad, rule pattern: the pattern cannot be traced"),
    (lambda: pattern_pass("t.bad", lambda x: (x.exp(), x.sin()), lambda x: x.exp(),
                          [torch.randn(4)]), "must compute and return one tensor"),
    (lambda: pattern_pass("t.bad", lambda x: x.exp(), lambda x: (x.exp(), x),
                          [torch.randn(4)]), "the replacement returns 2 values"),
    (lambda: pattern_pass("t.bad", lambda x: x.exp(), lambda x: x.exp().double(),
                          [torch.randn(4)]), "the replacement returns f64[4]"),
    (lambda: pattern_pass("t.bad", lambda x, a: x * (a + 1), lambda x, a: x,
                          [torch.randn(4), 1.0], params=["a"]), "parameter(s) a reach no op"),
    (lambda: pattern_pass("t.bad", lambda x, y: x.exp(), lambda x, y: y.exp(),
                          [torch.randn(4), torch.randn(4)]), "reads y, which the pattern"),
    (lambda: pattern_pass("t.bad", lambda x: x.exp(), lambda x: x.exp(), [1, 2]),
     "takes 1 argument(s)"),
], ids=["untraceable", "two-outputs", "replacement-count", "replacement-type", "param",
        "unbound", "arity"])
def test_errors_name_the_pass_and_the_rule(make, message):
    with pytest.raises(PluginError, match="t.bad") as info:
        make().rules()
    assert message in str(info.value)


def test_a_pattern_with_effects_is_refused_naming_the_rule():
    Writes = pattern_pass("t.writes", lambda x: x.add_(1.0), lambda x: x + 1.0,
                          [torch.randn(4)])
    with pytest.raises(PluginError, match=r"t.writes, rule pattern: .*aten.add_.Tensor"):
        run(Writes, """
            graph @g(%x: f32[4]) {
              %a = aten.exp.default(%x) : f32[4]
              return %a
            }
        """)


def test_a_bad_name_or_rule_list_fails_at_definition():
    with pytest.raises(PluginError, match="must be a pass name"):
        pattern_pass("Bad Name", lambda x: x, lambda x: x, [torch.randn(1)])
    with pytest.raises(PluginError, match="Rewrite objects"):
        pattern_pass("t.list", [lambda x: x])


# ---- random graphs ----------------------------------------------------------------------------
RULES = pattern_pass("t.random", [
    Rewrite(lambda x: x * torch.sigmoid(x), lambda x: torch.nn.functional.silu(x),
            [torch.randn(4)], name="silu"),
    Rewrite(lambda x: torch.relu(torch.relu(x)), lambda x: torch.relu(x), [torch.randn(4)],
            name="relu2"),
    Rewrite(lambda x: x + x, lambda x: x * 2.0, [torch.randn(4)], name="double"),
    Rewrite(lambda x: -(-x), lambda x: x, [torch.randn(4)], name="negneg"),
    Rewrite(lambda x, y: torch.maximum(x, y) - y, lambda x, y: torch.relu(x - y),
            [torch.randn(4), torch.randn(4)], name="maxsub"),
])


def in_a_group(body: Graph) -> Graph:
    """``body`` as the region of one fusion group of a graph of the same signature."""
    outer = Graph("outer")
    args = [outer.add_input(v.type, v.name) for v in body.inputs]
    group = outer.create(FUSION_GROUP, args, [v.type for v in body.outputs], region=body)
    outer.set_outputs(group.outputs)
    return outer


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.integers(1, 6), st.integers(4, 60), st.booleans())
def test_rewriting_random_graphs_keeps_them_verified_and_their_values(seed, window, n,
                                                                      grouped):
    program = random_program(n, seed, window=window, unary=0.6)
    graph = in_a_group(program.graph()) if grouped else program.graph()
    inputs = program.example_inputs(seed)
    expected = build_function(graph.clone(), REGISTRY).fn(*[t.clone() for t in inputs])
    result = RULES().run(graph, PassContext(registry=REGISTRY))
    verify(graph, REGISTRY)
    got = build_function(graph, REGISTRY).fn(*[t.clone() for t in inputs])
    torch.testing.assert_close(list(got), list(expected), equal_nan=True)
    assert result.changed == (result.stats["rewritten"] > 0)
    per_rule = sum(n for k, n in result.stats.items() if k.startswith("rewritten."))
    assert per_rule == result.stats["rewritten"]


def test_the_random_rules_do_fire_on_random_graphs():
    """The property above is not vacuous: over a few graphs every rule rewrites."""
    fired = {}
    for seed in range(40):
        stats = RULES().run(random_program(40, seed, window=3, unary=0.6).graph(),
                            PassContext(registry=REGISTRY)).stats
        for key, n in stats.items():
            fired[key] = fired.get(key, 0) + n
    assert all(fired.get(f"rewritten.{r.name}", 0) > 0 for r in RULES.rules())
    assert fired.get("kept", 0) > 0 and fired.get("declined", 0) > 0
