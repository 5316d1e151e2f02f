"""``verify = "numeric"``: a pass that keeps the graph valid but changes its values is
named with its plugin, rolled back under ``on_error = "skip"``, and leaves a reproducer
holding the inputs that showed the difference; the comparator never flags equal graphs
(NaN-producing ops included), tolerates rounding and flags real changes."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchloom.cli import main
from torchloom.errors import NumericError, PassError, PipelineError, TorchloomError, VerifyError
from torchloom.ir.graph import Graph
from torchloom.ir.text import parse_graph
from torchloom.ir.types import TensorType
from torchloom.passes import numeric
from torchloom.passes.base import PassContext
from torchloom.passes.manager import PassManager
from torchloom.passes.numeric import (NumericCheck, compare_values, input_sets, read_inputs,
                                      write_inputs)
from torchloom.passes.pipeline import build_pipeline, parse_raw
from torchloom.compiler.reproduce import reproduce

from numeric_support import WORKLOAD, WRONG, wrong_plugins, write_pipeline  # noqa: F401 (fixture)
from test_plugins_support import fake_site  # noqa: F401 (fixture)

SILU_IR = """\
graph @g(%x: f32[4, 8], %y: f32[4, 8]) {
  %a = aten.add.Tensor(%x, %y) : f32[4, 8]
  %s = aten.sigmoid.default(%a) : f32[4, 8]
  %m = aten.mul.Tensor(%a, %s) : f32[4, 8]
  %e = aten.exp.default(%m) : f32[4, 8]
  return %e
}
"""


def run_pipeline(text, graph, plugins, tmp_path, **kwargs):
    pipeline = build_pipeline(parse_raw(text, str(tmp_path / "p.toml")), plugins)
    manager = PassManager(pipeline, plugins, repro_dir=tmp_path / "repro", **kwargs)
    return manager.run(graph, PassContext(registry=plugins.registry))


def pipeline_text(verify, on_error="raise", passes=("cse", "wrong.silu")):
    head = f'[pipeline]\nname = "t"\nverify = "{verify}"\non_error = "{on_error}"\n'
    return head + "".join(f'\n[[pass]]\nname = "{p}"\n' for p in passes)


# ---- the pass manager ------------------------------------------------------------------

def test_a_pass_that_changes_values_is_named_and_leaves_its_inputs(wrong_plugins, tmp_path):
    graph = parse_graph(SILU_IR)
    with pytest.raises(PassError) as err:
        run_pipeline(pipeline_text("numeric"), graph, wrong_plugins, tmp_path)
    message = str(err.value)
    assert "pass 'wrong.silu' (distribution wrong-passes 0.1.0) changed the values the graph" \
        " computes" in message
    assert "output 0 (%e)" in message and "before the pass" in message
    assert str(graph) == str(parse_graph(SILU_IR))  # rolled back
    repro = err.value.reproducer
    saved = read_inputs(Path(repro))
    assert [tuple(t.shape) for t in saved] == [(4, 8), (4, 8)]
    assert json.loads((Path(repro) / "pass.json").read_text())[
        "verify"] == "numeric"
    with pytest.raises(PassError, match="changed the values"):  # replays on the saved inputs
        reproduce(repro, wrong_plugins)


def test_structural_verification_alone_lets_it_through(wrong_plugins, tmp_path):
    graph = parse_graph(SILU_IR)
    report = run_pipeline(pipeline_text("each"), graph, wrong_plugins, tmp_path)
    assert "aten.relu.default" in str(graph) and not any(r.skipped for r in report.records)


def test_on_error_skip_rolls_the_pass_back(wrong_plugins, tmp_path):
    graph = parse_graph(SILU_IR)
    report = run_pipeline(pipeline_text("numeric", "skip"), graph, wrong_plugins, tmp_path)
    assert str(graph) == str(parse_graph(SILU_IR))
    assert [r.name for r in report.records if r.skipped] == ["wrong.silu"]
    assert any("wrong.silu" in n and "skipped" in n for n in report.notes)


def test_structural_checks_still_run_under_numeric(fake_site, tmp_path):
    from test_plugins_support import FAKE_PASSES
    from torchloom.plugins.loader import load_plugins
    fake_site.add("fake-passes", version="1.2.3", modules={"tl_fake_passes": FAKE_PASSES},
                  entry_points={"fake": "tl_fake_passes"})
    plugins = load_plugins(entry_points=fake_site.entry_points())
    with pytest.raises(PassError, match="left a graph the verifier rejects"):
        run_pipeline(pipeline_text("numeric", passes=("fake.retype",)), parse_graph(SILU_IR),
                     plugins, tmp_path)


def test_correct_passes_pass_on_nan_producing_graphs(tmp_path):
    from torchloom.tools import load_plugins
    plugins = load_plugins()
    graph = parse_graph("""\
graph @g(%x: f32[4, 8]) {
  %l = aten.log.default(%x) : f32[4, 8]
  %l2 = aten.log.default(%x) : f32[4, 8]
  %s = aten.sqrt.default(%x) : f32[4, 8]
  %d = aten.div.Tensor(%s, %x) : f32[4, 8]
  %a = aten.add.Tensor(%l, %l2) : f32[4, 8]
  %m = aten.mul.Tensor(%a, %d) : f32[4, 8]
  %r = aten.sum.dim_IntList(%m) {dim = [-1], keepdim = true} : f32[4, 1]
  return %m, %r
}""")
    report = run_pipeline(pipeline_text("numeric", passes=("cse", "canonicalize", "dce")),
                          graph, plugins, tmp_path)
    assert str(graph).count("aten.log.default") == 1  # cse ran and was not blamed
    assert not any(r.skipped for r in report.records) and not report.notes


def test_random_graphs_are_skipped_with_a_note(tmp_path):
    from torchloom.tools import load_plugins
    plugins = load_plugins()
    graph = parse_graph("""\
graph @g(%x: f32[4, 8]) {
  %r = aten.rand_like.default(%x) : f32[4, 8]
  %a = aten.add.Tensor(%x, %r) : f32[4, 8]
  return %a
}""")
    report = run_pipeline(pipeline_text("numeric", passes=("cse",)), graph, plugins, tmp_path)
    assert any("draws random numbers" in n for n in report.notes)


def test_numeric_costs_nothing_under_other_policies(wrong_plugins, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("numeric verification ran under verify = 'each'")
    monkeypatch.setattr(numeric, "NumericCheck", refuse)
    for verify in ("each", "end", "off"):
        run_pipeline(pipeline_text(verify), parse_graph(SILU_IR), wrong_plugins, tmp_path)


# ---- the CLI and the backend -----------------------------------------------------------

@pytest.mark.parametrize("wrong", WRONG)
def test_explain_exits_1_naming_the_pass_and_its_plugin(wrong_plugins, tmp_path, capsys, wrong):
    work = tmp_path / "work.py"
    work.write_text(WORKLOAD)
    pipeline = write_pipeline(tmp_path / "wrong.toml", wrong=wrong)
    assert main(["explain", str(work), "--pipeline", str(pipeline)]) == 1
    err = capsys.readouterr().err
    assert f"pass '{wrong}' (distribution wrong-passes 0.1.0) changed the values" in err
    repro = re.search(r"Reproducer: (\S+) \(", err).group(1)
    assert (Path(repro) / "inputs.json").is_file()
    write_pipeline(pipeline, verify="each", wrong=wrong)  # valid structure: explain succeeds
    assert main(["explain", str(work), "--pipeline", str(pipeline)]) == 0


def test_the_backend_option(wrong_plugins, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path / "cache"))
    pipeline = write_pipeline(tmp_path / "wrong.toml", verify="each")

    def f(x):
        return x * torch.sigmoid(x) + 1

    x = torch.randn(8, 8)
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="torchloom",
                             options={"pipeline": str(pipeline), "verify": "numeric"})
    torch.testing.assert_close(compiled(x), f(x))  # the failing graph ran eagerly
    assert any("changed the values" in r.getMessage() for r in caplog.records)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="verify 'sometimes' must be one of"):
        torch.compile(f, backend="torchloom", options={"pipeline": str(pipeline),
                                                       "verify": "sometimes"})(x)
    torch._dynamo.reset()


def test_check_accepts_numeric(wrong_plugins, tmp_path, capsys):
    assert main(["check", str(write_pipeline(tmp_path / "wrong.toml"))]) == 0
    assert "verify numeric" in capsys.readouterr().out


# ---- inputs ----------------------------------------------------------------------------

def test_inputs_cover_edge_values_and_symbols():
    graph = parse_graph("""\
graph @g(%x: f32[s0, 8], %i: i64[s0], %b: b8[3], %n: int) {
  return %x, %i, %b, %n
}""")
    [(_, plain), (_, edges)] = input_sets(graph)
    x, i, b, n = plain
    assert x.shape == (numeric.SYMBOL_SIZE, 8) and n == numeric.SYMBOL_SIZE
    flat = x.view(-1)
    assert flat[1] == 0 and math.copysign(1, flat[3]) == -1 and flat[5] == -1
    assert (x < 0).any() and 0 <= int(i.min()) and int(i.max()) < numeric.SYMBOL_SIZE
    assert b.dtype == torch.bool
    assert torch.isnan(edges[0]).any() and torch.isinf(edges[0]).any()
    again = input_sets(graph)[0][1][0]
    assert torch.equal(x, again)  # seeded


def test_inputs_laid_out_as_their_types_even_where_elements_share_memory():
    """An input whose strides overlap (an expanded one: a stride of 0, or a window
    sliding by less than its length) is a view of a storage that many of its elements
    read, not a copy the strides cannot take."""
    graph = parse_graph("""\
graph @g(%x: f32[4, 8] strided[0, 1], %w: f32[3, 4] strided[2, 1], %y: f32[2, 3]) {
  return %x, %w, %y
}""")
    for _, (x, w, y) in input_sets(graph):
        assert x.shape == (4, 8) and x.stride() == (0, 1)
        assert w.shape == (3, 4) and w.stride() == (2, 1)
        assert torch.equal(x[0], x[3]) and torch.equal(w[0, 2:], w[1, :2])
        assert y.stride() == (3, 1)


def test_saved_inputs_round_trip(tmp_path):
    values = [torch.randn(3, 4).t(), torch.randn(5).to(torch.bfloat16),
              torch.tensor([True, False]), torch.arange(6).view(2, 3), 7, 0.25, None,
              torch.tensor([math.nan, math.inf])]
    write_inputs(tmp_path, values)
    back = read_inputs(tmp_path)
    for a, b in zip(values, back):
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.stride() == b.stride()
            torch.testing.assert_close(a, b, equal_nan=True)
        else:
            assert a == b
    (tmp_path / "inputs.bin").write_bytes(b"\0")
    with pytest.raises(TorchloomError, match="inputs.json: not a reproducer's saved inputs"):
        read_inputs(tmp_path)
    assert read_inputs(tmp_path / "nothing") is None


# ---- the comparator --------------------------------------------------------------------

UNARY = ("aten.log.default", "aten.sqrt.default", "aten.exp.default", "aten.tanh.default",
         "aten.neg.default", "aten.reciprocal.default", "aten.sigmoid.default",
         "aten.relu.default", "aten.abs.default")
BINARY = ("aten.add.Tensor", "aten.mul.Tensor", "aten.div.Tensor", "aten.sub.Tensor")


@st.composite
def graphs(draw):
    """A random pointwise graph over two inputs, with NaN-producing ops (log, sqrt of
    negatives, division by zero) and a row sum."""
    dtype = draw(st.sampled_from(["f32", "f64", "f16", "bf16"]))
    t = TensorType.make((3, 5), dtype)
    g = Graph("g")
    values = [g.add_input(t, "x"), g.add_input(t, "y")]
    for _ in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            op, args = draw(st.sampled_from(UNARY)), [draw(st.sampled_from(values))]
        else:
            op = draw(st.sampled_from(BINARY))
            args = [draw(st.sampled_from(values)), draw(st.sampled_from(values))]
        values.append(g.create(op, args, [t]).output)
    last = values[-1]
    total = g.create("aten.sum.dim_IntList", [last], [TensorType.make((3, 1), dtype)],
                     {"dim": (-1,), "keepdim": True}).output
    g.set_outputs([last, total])
    return g


@settings(max_examples=40, deadline=None)
@given(graphs())
def test_equal_graphs_are_never_flagged(graph):
    from torchloom.tools import load_plugins
    check = NumericCheck(graph, load_plugins().registry)
    assert check.skipped is None
    assert check.check(graph.clone()) is None


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e30, 1e30, allow_nan=False), min_size=1, max_size=20))
def test_one_ulp_in_f32_is_tolerated_and_a_sign_flip_is_not(values):
    a = torch.tensor(values, dtype=torch.float32)
    assert compare_values(a, torch.nextafter(a, torch.full_like(a, math.inf))) is None
    if bool((a.abs() > 1e-3).any()):
        assert "differs" in compare_values(a, -a)


def test_nan_positions_must_match():
    a = torch.tensor([1.0, math.nan, 3.0])
    assert compare_values(a, a.clone()) is None
    assert "NaN in one graph only" in compare_values(a, torch.tensor([math.nan, math.nan, 3.0]))
    assert "NaN in one graph only" in compare_values(torch.tensor([1.0, 2.0]),
                                                     torch.tensor([1.0, math.nan]))
    assert "infinity" in compare_values(torch.tensor([math.inf]), torch.tensor([-math.inf]))
    assert "differs" in compare_values(torch.tensor([1, 2]), torch.tensor([1, 3]))
    assert "is f64" in compare_values(torch.zeros(2), torch.zeros(2, dtype=torch.float64))


def test_an_unknown_verify_policy_is_a_pipeline_error(wrong_plugins, tmp_path):
    with pytest.raises(PipelineError, match="must be one of each, end, off, numeric"):
        build_pipeline(parse_raw(pipeline_text("numbers"), "p.toml"), wrong_plugins)


def test_a_numeric_error_is_a_verify_error():
    assert issubclass(NumericError, VerifyError)


def test_opt_keeps_numeric_under_verify_each(wrong_plugins, tmp_path, capsys):
    ir = tmp_path / "silu.ir"
    ir.write_text(SILU_IR)
    pipeline = write_pipeline(tmp_path / "wrong.toml")
    assert main(["opt", str(ir), "--pipeline", str(pipeline), "--verify-each"]) == 1
    assert "changed the values the graph computes" in capsys.readouterr().err
    write_pipeline(pipeline, verify="each")
    assert main(["opt", str(ir), "--pipeline", str(pipeline)]) == 0
    assert "aten.relu.default" in capsys.readouterr().out


def test_int_inputs_used_as_sizes_agree_with_the_tensors():
    from torchloom.tools import load_plugins
    graph = parse_graph("""\
graph @g(%n: int, %x: f32[s0, s1, 4]) {
  %v = aten.view.default(%x, %n) {size = [$1, 4]} : f32["s0*s1", 4]
  %e = aten.exp.default(%v) : f32["s0*s1", 4]
  return %e
}""")
    [(_, (n, x)), _] = input_sets(graph)
    assert n == numeric.SYMBOL_SIZE ** 2 and x.shape == (5, 5, 4)
    check = NumericCheck(graph, load_plugins().registry)
    assert check.skipped is None and check.check(graph.clone()) is None
