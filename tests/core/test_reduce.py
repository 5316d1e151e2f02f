"""``torchloom reduce DIR``: a failing reproducer (a pass that changes values, raises or
breaks the graph) shrinks to a graph of a few nodes that still fails the same way, written
beside it as IR that ``torchloom opt`` replays; the result always still fails and is never
larger; user errors exit 2."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchloom.cli import main
from torchloom.errors import PassError, TorchloomError
from torchloom.ir.graph import Graph
from torchloom.ir.text import parse_graph
from torchloom.ir.types import TensorType
from torchloom.passes.base import PassContext
from torchloom.passes.manager import PassManager
from torchloom.passes.pipeline import build_pipeline, parse_raw
from torchloom.progress import Progress
from torchloom.cli.reduce import failure_of, reduce_reproducer, size_of
from torchloom.compiler.reproduce import load_reproducer

from numeric_support import WORKLOAD, WRONG, wrong_plugins, write_pipeline  # noqa: F401 (fixture)
from test_plugins_support import FAKE_PASSES, fake_site  # noqa: F401 (fixture)


def reproducer_for(graph, plugins, root: Path, passes, verify="numeric") -> Path:
    text = f'[pipeline]\nname = "t"\nverify = "{verify}"\n' + "".join(
        f'\n[[pass]]\nname = "{p}"\n' for p in passes)
    pipeline = build_pipeline(parse_raw(text, str(root / "p.toml")), plugins)
    with pytest.raises(PassError) as err:
        PassManager(pipeline, plugins, repro_dir=root / "repro").run(
            graph, PassContext(registry=plugins.registry))
    return Path(err.value.reproducer)


def chain_graph(n: int, middle: str) -> Graph:
    """``n`` pointwise ops over [16, 32] inputs with ``middle`` (``"silu"``: x *
    sigmoid(x); ``"tanh"``; ``""``: nothing) in the middle, and several outputs."""
    t = TensorType.make((16, 32), "f32")
    g = Graph("chain")
    x, y = g.add_input(t, "x"), g.add_input(t, "y")
    ops = ["aten.add.Tensor", "aten.mul.Tensor", "aten.sin.default", "aten.neg.default"]
    values, outs = [x, y], []
    for i in range(n):
        op = ops[i % len(ops)]
        args = [values[-1], values[i % 2]] if op.endswith("Tensor") else [values[-1]]
        values.append(g.create(op, args, [t]).output)
        if i % 5 == 4:
            outs.append(values[-1])
        if i == n // 2 and middle == "silu":
            h = values[-1]
            s = g.create("aten.sigmoid.default", [h], [t]).output
            values.append(g.create("aten.mul.Tensor", [h, s], [t]).output)
        elif i == n // 2 and middle == "tanh":
            values.append(g.create("aten.tanh.default", [values[-1]], [t]).output)
    g.set_outputs([*outs, values[-1]])
    return g


@pytest.mark.parametrize("wrong", WRONG)
def test_explain_then_reduce_gives_a_few_nodes_that_opt_replays(wrong_plugins, tmp_path,
                                                                capsys, monkeypatch, wrong):
    work = tmp_path / "work.py"
    work.write_text(WORKLOAD)
    pipeline = write_pipeline(tmp_path / "wrong.toml", wrong=wrong)
    assert main(["explain", str(work), "--pipeline", str(pipeline)]) == 1
    repro = re.search(r"Reproducer: (\S+) \(", capsys.readouterr().err).group(1)
    assert main(["reduce", repro]) == 0
    out = capsys.readouterr().out
    assert f"still fails: pass '{wrong}' changes values" in out
    reduced = parse_graph((Path(repro) / "reduced.ir").read_text())
    assert 1 <= reduced.num_nodes() <= 3
    assert {n.op for n in reduced.nodes} >= {"aten.sigmoid.default", "aten.mul.Tensor"}
    before = parse_graph((Path(repro) / "before.ir").read_text())
    assert size_of(reduced) < size_of(before)
    monkeypatch.chdir(repro)  # the RUN line names reduced.toml beside it
    assert main(["opt", "reduced.ir", "--pipeline", "reduced.toml"]) == 1
    assert f"pass '{wrong}' (distribution wrong-passes 0.1.0) changed the values" in \
        capsys.readouterr().err


def test_a_pass_that_raises_reduces_to_the_node_it_raises_on(wrong_plugins, tmp_path, capsys):
    graph = chain_graph(30, "tanh")
    repro = reproducer_for(graph, wrong_plugins, tmp_path, ["wrong.crash-on-tanh"],
                           verify="each")
    result = reduce_reproducer(repro, wrong_plugins, progress=Progress("t", delay=1e9))
    assert result.failure.kind == "raised" and result.failure.error_type == "RuntimeError"
    assert [n.op for n in result.graph.nodes] == ["aten.tanh.default"]
    assert result.graph.inputs[0].type.shape == (1, 1)  # shapes shrank too
    assert main(["opt", str(result.ir_path), "--pipeline", str(result.pipeline_path)]) == 1
    assert "cannot handle tanh" in capsys.readouterr().err


def test_a_pass_that_breaks_the_graph_reduces(fake_site, tmp_path):
    from torchloom.plugins.loader import load_plugins
    fake_site.add("fake-passes", version="1.2.3", modules={"tl_fake_passes": FAKE_PASSES},
                  entry_points={"fake": "tl_fake_passes"})
    plugins = load_plugins(entry_points=fake_site.entry_points())
    repro = reproducer_for(chain_graph(20, ""), plugins, tmp_path, ["fake.corrupt"],
                           verify="each")
    result = reduce_reproducer(repro, plugins, progress=Progress("t", delay=1e9))
    assert result.failure.kind == "verify" and result.nodes_after == 1


def test_progress_is_shown_on_long_work(wrong_plugins, tmp_path):
    repro = reproducer_for(chain_graph(12, "silu"), wrong_plugins, tmp_path, ["wrong.silu"])
    stream = io.StringIO()
    reduce_reproducer(repro, wrong_plugins, progress=Progress("reduce", stream=stream,
                                                              tty=True, delay=0))
    assert "reduce" in stream.getvalue() and "candidates" in stream.getvalue()


def test_user_errors_exit_2(wrong_plugins, tmp_path, capsys):
    assert main(["reduce", str(tmp_path)]) == 2
    assert "is not a reproducer directory" in capsys.readouterr().err
    repro = reproducer_for(chain_graph(6, "silu"), wrong_plugins, tmp_path, ["wrong.silu"])
    (repro / "before.ir").write_text("graph @g(%x: f32[4]) {\n  %e = aten.exp.default(%x)"
                                     " : f32[4]\n  return %e\n}\n")
    (repro / "inputs.json").unlink()
    assert main(["reduce", str(repro)]) == 2
    assert "no longer fails" in capsys.readouterr().err
    with pytest.raises(TorchloomError, match="no longer fails"):
        reduce_reproducer(repro, wrong_plugins)


@st.composite
def silu_graphs(draw):
    """Random pointwise graphs over [rows, cols] inputs holding at least one SiLU, some
    outputs anywhere."""
    rows, cols = draw(st.integers(1, 6)), draw(st.integers(1, 9))
    t = TensorType.make((rows, cols), "f32")
    g = Graph("g")
    values = [g.add_input(t, "x"), g.add_input(t, "y")]
    silu_at = draw(st.integers(0, 10))
    for i in range(draw(st.integers(silu_at + 1, 14))):
        if i == silu_at:
            v = draw(st.sampled_from(values))
            s = g.create("aten.sigmoid.default", [v], [t]).output
            values.append(g.create("aten.mul.Tensor", [v, s], [t]).output)
            continue
        op = draw(st.sampled_from(["aten.add.Tensor", "aten.mul.Tensor", "aten.tanh.default",
                                   "aten.abs.default", "aten.sigmoid.default"]))
        args = [draw(st.sampled_from(values))]
        if op.endswith("Tensor"):
            args.append(draw(st.sampled_from(values)))
        values.append(g.create(op, args, [t]).output)
    outs = draw(st.lists(st.sampled_from(values[2:]), min_size=1, max_size=4))
    g.set_outputs([*outs, values[-1]])
    return g


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(silu_graphs())
def test_the_reduced_graph_still_fails_and_is_never_larger(wrong_plugins, tmp_path_factory,
                                                           graph):
    root = tmp_path_factory.mktemp("r")
    original = graph.clone()
    try:
        repro = reproducer_for(graph, wrong_plugins, root, ["wrong.silu"])
    except BaseException:  # the SiLU's result is unused or hidden: nothing to reduce
        return
    r = load_reproducer(repro, wrong_plugins)
    failure = failure_of(r.graph, r)
    result = reduce_reproducer(repro, wrong_plugins, progress=Progress("t", delay=1e9))
    assert result.failure == failure
    assert failure_of(parse_graph(result.ir_path.read_text()), r) == failure
    assert size_of(result.graph) <= size_of(original)
    assert result.nodes_after <= 2


def test_a_whole_pipeline_failure_reduces_with_its_pipeline(fake_site, tmp_path, capsys):
    from torchloom.plugins.loader import load_plugins
    fake_site.add("fake-passes", version="1.2.3", modules={"tl_fake_passes": FAKE_PASSES},
                  entry_points={"fake": "tl_fake_passes"})
    plugins = load_plugins(entry_points=fake_site.entry_points())
    repro = reproducer_for(chain_graph(20, ""), plugins, tmp_path, ["cse", "fake.retype"],
                           verify="end")
    assert repro.name.startswith("pipeline-")  # verify = "end" pins it on no pass
    result = reduce_reproducer(repro, plugins, progress=Progress("t", delay=1e9))
    assert result.failure.pass_name == "<pipeline>" and result.nodes_after == 1
    assert "fake.retype" in result.pipeline_path.read_text()  # the whole pipeline replays


def test_a_long_chain_reduces_in_few_candidates(wrong_plugins, tmp_path):
    repro = reproducer_for(chain_graph(400, "tanh"), wrong_plugins, tmp_path,
                           ["wrong.crash-on-tanh"], verify="each")
    result = reduce_reproducer(repro, wrong_plugins, progress=Progress("t", delay=1e9))
    assert result.nodes_before == 401 and result.nodes_after == 1
    assert result.tests < 80  # chunks halve: about log2(n) candidates per step, not n
