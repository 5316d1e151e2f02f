"""The pass manager: verify policies, timing and change counts, instruments, dumps,
exact rollback, reproducers, ``on_error = "skip"`` and fixpoint groups."""

from __future__ import annotations

import json
import logging
import re
import textwrap
from pathlib import Path

import attrs
import pytest

from torchloom.cli import main
from torchloom.errors import PassError, PipelineError, VerifyError
from torchloom.ir.text import parse_graph
from torchloom.ir.verify import verify
from torchloom.passes.base import PassContext
from torchloom.passes.manager import PassManager
from torchloom.compiler.reproduce import reproduce
from torchloom.passes.pipeline import build_pipeline, parse_raw

from test_plugins_support import SMALL_IR, fake_plugins, fake_site, small_graph  # noqa: F401

CSE_IR = """\
graph @g(%x: f32[4], %y: f32[4]) {
  %a = aten.exp.default(%x) : f32[4]
  %b = aten.exp.default(%x) : f32[4]
  %dead = aten.neg.default(%y) : f32[4]
  %c = aten.add.Tensor(%a, %b) : f32[4]
  return %c
}
"""


def pipeline_of(plugins, body: str, source: str = "test.toml", **head):
    settings = "".join(f'{k} = "{v}"\n' for k, v in head.items())
    text = f"[pipeline]\nname = \"t\"\n{settings}\n{textwrap.dedent(body)}"
    return build_pipeline(parse_raw(text, source), plugins)


def run(plugins, pipeline, graph, **kwargs):
    ctx = PassContext(registry=plugins.registry)
    report = PassManager(pipeline, plugins, **kwargs).run(graph, ctx)
    return report, ctx


def test_records_time_change_flags_and_summed_stats(fake_plugins):
    pipeline = pipeline_of(fake_plugins, """
        [[pass]]
        name = "cse"
        [[pass]]
        name = "dce"
        [[pass]]
        name = "fake.tunable"
        limit = 9
    """)
    graph = parse_graph(CSE_IR)
    report, ctx = run(fake_plugins, pipeline, graph)
    assert [(r.name, r.changed, r.stats, r.distribution) for r in report.records] == [
        ("cse", True, {"merged": 1}, "torchloom"),
        ("dce", True, {"removed": 1}, "torchloom"),
        ("fake.tunable", False, {"limit": 9}, "fake-passes")]
    assert all(r.ms >= 0 for r in report.records)
    assert report.total_ms() == pytest.approx(sum(r.ms for r in report.records))
    assert ctx.stats == {"cse.merged": 1, "dce.removed": 1, "fake.tunable.limit": 9}
    assert graph.num_nodes() == 2


def test_instruments_are_called_around_every_pass_in_order(fake_plugins):
    calls = []

    class Recorder:
        def before_pass(self, pass_, graph, ctx):
            calls.append(("before", pass_.name, graph.num_nodes()))

        def after_pass(self, pass_, graph, ctx, result, seconds):
            assert seconds >= 0
            calls.append(("after", pass_.name, graph.num_nodes(), result.changed))

    pipeline = pipeline_of(fake_plugins, """
        [[pass]]
        name = "cse"
        [[pass]]
        name = "dce"
    """)
    run(fake_plugins, pipeline, parse_graph(CSE_IR), instruments=[Recorder()])
    assert calls == [("before", "cse", 4), ("after", "cse", 3, True),
                     ("before", "dce", 3), ("after", "dce", 2, True)]


def test_instruments_from_the_plugin_hook_are_used(fake_site):
    from torchloom.plugins.loader import load_plugins
    fake_site.add("timing-dist", modules={"tl_timing": """
        from torchloom.api import hookimpl

        class Seen:
            names = []
            def after_pass(self, pass_, graph, ctx, result, seconds):
                Seen.names.append(pass_.name)

        @hookimpl
        def torchloom_instruments():
            return [Seen()]
    """}, entry_points={"timing": "tl_timing"})
    plugins = load_plugins(entry_points=fake_site.entry_points())
    pipeline = pipeline_of(plugins, '[[pass]]\nname = "dce"\n[[pass]]\nname = "cse"\n')
    run(plugins, pipeline, parse_graph(CSE_IR))
    import tl_timing
    assert tl_timing.Seen.names == ["dce", "cse"]
    assert plugins.instruments[0].distribution == "timing-dist"


def test_dump_dir_holds_the_ir_after_each_pass_numbered(fake_plugins, tmp_path):
    pipeline = pipeline_of(fake_plugins, """
        [[pass]]
        name = "cse"
        [[pass]]
        name = "dce"
    """)
    graph = parse_graph(CSE_IR)
    run(fake_plugins, pipeline, graph, dump_dir=tmp_path / "dump")
    files = sorted(p.name for p in (tmp_path / "dump").iterdir() if p.suffix == ".ir")
    assert files == ["00-input.ir", "01-cse.ir", "02-dce.ir"]
    texts = [(tmp_path / "dump" / f).read_text() for f in files]
    assert texts[0] == CSE_IR
    assert str(parse_graph(texts[2])) == str(graph)  # the last dump is the result
    assert "%b = " not in texts[1] and "%dead = " in texts[1]  # after cse, before dce


def test_dump_dir_holds_a_unified_diff_per_pass_that_patch_applies(fake_plugins, tmp_path):
    import shutil
    import subprocess
    pipeline = pipeline_of(fake_plugins, """
        [[pass]]
        name = "cse"
        [[pass]]
        name = "dce"
        [[pass]]
        name = "cse"
    """)
    run(fake_plugins, pipeline, parse_graph(CSE_IR), dump_dir=tmp_path / "dump")
    dump = tmp_path / "dump"
    diffs = sorted(p.name for p in dump.iterdir() if p.suffix == ".diff")
    assert diffs == ["01-cse.diff", "02-dce.diff", "03-cse.diff"]  # one per pass
    assert "-  %b = aten.exp.default(%x)" in (dump / "01-cse.diff").read_text()
    assert "-  %dead = aten.neg.default(%y)" in (dump / "02-dce.diff").read_text()
    assert (dump / "03-cse.diff").read_text() == ""  # nothing left to change
    for before, after in [("00-input", "01-cse"), ("01-cse", "02-dce")]:
        work = tmp_path / "apply"
        work.mkdir(exist_ok=True)  # git apply patches the file the diff names after "+++"
        (work / f"{after}.ir").write_text((dump / f"{before}.ir").read_text())
        subprocess.run([shutil.which("git") or "git", "apply", "-p0",
                        str(dump / f"{after}.diff")], cwd=work, check=True)
        assert (work / f"{after}.ir").read_text() == (dump / f"{after}.ir").read_text()


@pytest.mark.parametrize("policy, name, caught, problem", [
    ("each", "fake.corrupt", True, "is used before it is defined"),
    ("off", "fake.corrupt", True, "is used before it is defined"),  # off still checks order
    ("each", "fake.retype", True, "is declared f64[4, 8] but aten.exp.default gives"),
    ("off", "fake.retype", False, "is declared f64[4, 8] but aten.exp.default gives"),
])
def test_verify_each_catches_a_corrupting_pass_and_off_only_a_broken_order(
        fake_plugins, policy, name, caught, problem):
    pipeline = pipeline_of(fake_plugins, f'[[pass]]\nname = "{name}"\n', verify=policy)
    graph = small_graph()
    if caught:
        with pytest.raises(PassError) as info:
            run(fake_plugins, pipeline, graph)
        message = str(info.value)
        assert message.startswith(f"pass '{name}' (distribution fake-passes 1.2.3) left "
                                  "a graph the verifier rejects: VerifyError:")
        assert problem in message
        assert "The graph from before the pass was restored." in message
        assert (info.value.pass_name, info.value.distribution) == (name, "fake-passes")
        assert str(graph) == SMALL_IR
    else:
        report, _ = run(fake_plugins, pipeline, graph)
        assert report.records[0].changed
        with pytest.raises(VerifyError, match=re.escape(problem)):
            verify(graph, fake_plugins.registry)


def test_verify_end_rolls_back_the_whole_pipeline_and_says_how_to_find_the_pass(
        fake_plugins, tmp_path, capsys):
    pipeline = pipeline_of(fake_plugins, """
        [[pass]]
        name = "fake.flipper"
        [[pass]]
        name = "fake.retype"
    """, verify="end")
    graph = small_graph()
    with pytest.raises(PassError) as info:
        run(fake_plugins, pipeline, graph, repro_dir=tmp_path / "repro")
    message = str(info.value)
    assert message.startswith("test.toml: the graph after pipeline 't' fails verification")
    assert 'set verify = "each" to name the pass' in message
    assert str(graph) == SMALL_IR  # the flipper's change is rolled back too
    assert main(["reproduce", info.value.reproducer]) == 1
    assert "fails verification" in capsys.readouterr().err


def test_a_raising_pass_is_rolled_back_exactly_and_reproduced(fake_plugins, tmp_path,
                                                              capsys):
    pipeline = pipeline_of(fake_plugins, """
        [[pass]]
        name = "fake.flipper"
        [[pass]]
        name = "fake.boom"
    """)
    graph = small_graph()
    nodes_before = list(graph.nodes)
    with pytest.raises(PassError) as info:
        run(fake_plugins, pipeline, graph, repro_dir=tmp_path / "repro")
    err = info.value
    assert str(err).startswith("pass 'fake.boom' (distribution fake-passes 1.2.3) raised: "
                               "RuntimeError: boom: the pass gave up half way")
    flipped = SMALL_IR.replace("(%x, %y)", "(%y, %x)")
    assert str(graph) == flipped  # the state after fake.flipper, before fake.boom
    assert list(graph.nodes) == nodes_before  # the same objects, relinked
    verify(graph, fake_plugins.registry)
    repro = Path(err.reproducer)
    assert f"Reproducer: {repro} (replay with: torchloom reproduce {repro})" in str(err)
    assert (repro / "before.ir").read_text() == flipped
    assert (repro / "pipeline.toml").read_text() == pipeline.text
    meta = json.loads((repro / "pass.json").read_text())
    assert (meta["pass"], meta["distribution"], meta["version"]) == ("fake.boom",
                                                                     "fake-passes", "1.2.3")
    assert "Traceback" in meta["traceback"] and meta["device"] == "cpu"
    versions = json.loads((repro / "versions.json").read_text())
    assert versions["plugins"]["fake"] == {"distribution": "fake-passes", "version": "1.2.3"}
    # the replay raises the same error (without writing another reproducer)
    with pytest.raises(PassError) as again:
        reproduce(repro, fake_plugins)
    assert str(again.value).splitlines()[0] == str(err).splitlines()[0]
    # and through the CLI: exit code 1, the same first line, no traceback by default
    assert main(["reproduce", str(repro)]) == 1
    out, stderr = capsys.readouterr()
    assert stderr.startswith("torchloom reproduce: error: " + str(err).splitlines()[0])
    assert "Traceback" not in stderr
    assert main(["--traceback", "reproduce", str(repro)]) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_reproduce_of_a_fixed_pass_says_it_now_runs(fake_plugins, tmp_path, capsys):
    pipeline = pipeline_of(fake_plugins, '[[pass]]\nname = "fake.boom"\n')
    with pytest.raises(PassError) as info:
        run(fake_plugins, pipeline, small_graph(), repro_dir=tmp_path / "repro")
    repro = Path(info.value.reproducer)
    meta = json.loads((repro / "pass.json").read_text())
    (repro / "pass.json").write_text(json.dumps({**meta, "pass": "fake.tunable"}))
    assert main(["reproduce", str(repro)]) == 0
    assert "pass 'fake.tunable' ran without error" in capsys.readouterr().out
    assert main(["reproduce", str(tmp_path)]) == 2
    assert "is not a reproducer directory" in capsys.readouterr().err


def test_on_error_skip_continues_and_says_so_once(fake_plugins, caplog):
    pipeline = pipeline_of(fake_plugins, """
        [[pass]]
        fixpoint = ["fake.boom", "cse"]
        max_iterations = 3
        [[pass]]
        name = "dce"
    """, on_error="skip")
    warned: set[str] = set()
    with caplog.at_level(logging.WARNING, logger="torchloom.passes"):
        for _ in range(2):  # two graphs of one compilation
            graph = parse_graph(CSE_IR)
            report, _ = run(fake_plugins, pipeline, graph, warned=warned)
            assert graph.num_nodes() == 2  # cse and dce still ran
            skipped = [r for r in report.records if r.skipped]
            assert [r.name for r in skipped] == ["fake.boom", "fake.boom"]
            assert "RuntimeError: boom" in skipped[0].skipped
            notes = [n for n in report.notes if "fake.boom" in n]
            assert notes == ["pass 'fake.boom' skipped after it failed: RuntimeError: boom: "
                             "the pass gave up half way"]
    logged = [r.getMessage() for r in caplog.records if "fake.boom" in r.getMessage()]
    assert len(logged) == 1


@pytest.mark.parametrize("idempotent, expected", [
    # until a round changes nothing
    ("neither", [("cse", True), ("dce", True), ("cse", False), ("dce", False)]),
    # dce idempotent: after round 1 nothing changed since its run once cse finds nothing
    ("dce", [("cse", True), ("dce", True), ("cse", False)]),
    # cse idempotent: dce changed the graph after it, so it runs again; dce always runs
    ("cse", [("cse", True), ("dce", True), ("cse", False), ("dce", False)]),
    # both: round 2 runs cse (dce changed the graph since) and skips dce
    ("both", [("cse", True), ("dce", True), ("cse", False)]),
])
def test_fixpoint_runs_until_nothing_changes_skipping_idempotent_passes_left_alone(
        fake_plugins, monkeypatch, idempotent, expected):
    from torchloom.passes.builtin.cse import CommonSubexpressionElimination
    from torchloom.passes.builtin.dce import DeadCodeElimination
    for cls, name in ((CommonSubexpressionElimination, "cse"), (DeadCodeElimination, "dce")):
        monkeypatch.setattr(cls, "idempotent", idempotent in (name, "both"))
    pipeline = pipeline_of(fake_plugins, """
        [[pass]]
        fixpoint = ["cse", "dce"]
        max_iterations = 5
    """)
    graph = parse_graph(CSE_IR)
    report, _ = run(fake_plugins, pipeline, graph)
    assert [(r.name, r.changed) for r in report.records] == expected
    assert "%b" not in str(graph) and "%dead" not in str(graph)


def test_fixpoint_that_does_not_converge_is_reported(fake_plugins, tmp_path, capsys):
    body = """
        [[pass]]
        name = "cse"

        [[pass]]
        fixpoint = ["fake.flipper", "dce"]
        max_iterations = 3
    """
    pipeline = pipeline_of(fake_plugins, body, source="loop.toml")
    with pytest.raises(PipelineError) as info:
        run(fake_plugins, pipeline, small_graph())
    assert str(info.value) == (
        "loop.toml:8: fixpoint group [fake.flipper, dce] did not converge in 3 iterations "
        "(still changing: fake.flipper); raise max_iterations or fix the pass that keeps "
        "changing the graph")
    skip = pipeline_of(fake_plugins, body, source="loop.toml", on_error="skip")
    report, _ = run(fake_plugins, skip, small_graph())
    assert [r.name for r in report.records].count("fake.flipper") == 3
    assert any("did not converge in 3 iterations" in n for n in report.notes)
    # through the CLI: explain with this pipeline exits 2 with the same message
    path = tmp_path / "loop.toml"
    path.write_text(f"[pipeline]\nname = \"loop\"\n{textwrap.dedent(body)}")
    workload = tmp_path / "add.py"
    workload.write_text("import torch\n\ndef workload():\n"
                        "    return (lambda x, y: (x + y).exp()), [torch.ones(4), torch.ones(4)]\n")
    assert main(["explain", str(workload), "--pipeline", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"torchloom explain: error: {path}:7: fixpoint group "
                          f"[fake.flipper, dce] did not converge in 3 iterations")
    assert "Traceback" not in err


def test_an_instrument_that_raises_is_named(fake_site):
    from torchloom.errors import PluginError
    from torchloom.plugins.loader import load_plugins
    fake_site.add("bad-timing", modules={"tl_bad_timing": """
        from torchloom.api import hookimpl

        class Clock:
            def before_pass(self, pass_, graph, ctx):
                raise OSError("clock unavailable")

        @hookimpl
        def torchloom_instruments():
            return [Clock()]
    """}, entry_points={"badclock": "tl_bad_timing"})
    plugins = load_plugins(entry_points=fake_site.entry_points())
    pipeline = pipeline_of(plugins, '[[pass]]\nname = "cse"\n')
    with pytest.raises(PluginError) as info:
        run(plugins, pipeline, parse_graph(CSE_IR))
    assert str(info.value) == ("instrument Clock from plugin 'badclock' (bad-timing) raised in "
                               "before_pass of pass 'cse': OSError: clock unavailable")


def test_a_pass_not_returning_a_pass_result_is_a_pass_error(fake_plugins):
    from torchloom.passes.base import Pass

    @attrs.frozen
    class Forgetful(Pass):
        name = "fake.forgetful"

        def run(self, graph, ctx):
            graph.last.op = "aten.cos.default"  # edits, then forgets to return a result

    from torchloom.passes.pipeline import PassStep, Pipeline
    pipeline = Pipeline("t", "t.toml", "", steps=(PassStep(Forgetful(), 1, "here", "0"),))
    with pytest.raises(PassError, match=r"pass 'fake.forgetful' \(distribution here 0\) raised: "
                                        r"TypeError: run\(\) returned NoneType, not PassResult"):
        run(fake_plugins, pipeline, graph := small_graph())
    assert str(graph) == SMALL_IR


def test_an_interrupt_during_a_pass_leaves_the_graph_from_before_it(fake_plugins):
    from torchloom.passes.base import Pass
    from torchloom.passes.pipeline import PassStep, Pipeline

    @attrs.frozen
    class Interrupted(Pass):
        name = "fake.interrupted"

        def run(self, graph, ctx):
            graph.last.op = "aten.cos.default"
            raise KeyboardInterrupt

    pipeline = Pipeline("t", "t.toml", "", steps=(PassStep(Interrupted(), 1),))
    graph = small_graph()
    with pytest.raises(KeyboardInterrupt):
        run(fake_plugins, pipeline, graph)
    assert str(graph) == SMALL_IR


def test_verify_each_blames_an_invalid_input_graph_not_the_first_pass(fake_plugins):
    graph = small_graph()
    graph.last.inputs.append(graph.inputs[1])  # read, but not in %y's use list
    pipeline = pipeline_of(fake_plugins, '[[pass]]\nname = "fake.flipper"\n', verify="each")
    with pytest.raises(VerifyError) as info:
        run(fake_plugins, pipeline, graph)
    assert str(info.value).startswith("the graph given to pipeline 't' (test.toml) fails "
                                      "verification before any pass ran:")
    assert "use list of %y records this node 0 time(s)" in str(info.value)


def test_verify_each_rechecks_only_the_units_a_pass_changed(fake_plugins, monkeypatch):
    import torchloom.passes.manager as manager
    checked = []

    def spy(graph, registry=None, *, only=None, unchanged=None, typed=None):
        checked.append(None if only is None else sorted(g.name for g in only))
        return verify(graph, registry, only=only, unchanged=unchanged, typed=typed)

    monkeypatch.setattr(manager, "verify", spy)
    pipeline = pipeline_of(fake_plugins, """
        [[pass]]
        name = "fake.flipper"
        [[pass]]
        name = "fake.tunable"
        [[pass]]
        name = "fake.flipper"
    """, verify="each")
    run(fake_plugins, pipeline, small_graph())
    # the whole graph after the first pass; nothing after a pass that changed nothing
    assert checked == [None, [], ["g"]]


def test_a_subgraph_edited_from_the_top_level_is_checked_against_its_calls(fake_plugins):
    from torchloom.passes.base import Pass, PassResult
    from torchloom.passes.pipeline import PassStep, Pipeline
    from torchloom.ir.types import TensorType

    @attrs.frozen
    class Retype(Pass):
        name = "fake.retype"

        def run(self, graph, ctx):  # on the top level only: the calls go stale
            if graph.parent is None and "layer" in graph.subgraphs:
                layer = graph.subgraphs["layer"]
                layer.inputs[0].type = layer.first.output.type = TensorType.make([2, 8])
                return PassResult(True)
            return PassResult(False)

    text = """\
graph @main(%x: f32[4, 8]) {
  %a = torchloom.call_subgraph(%x) {callee = "layer"} : f32[4, 8]
  return %a
}
graph @layer(%p: f32[4, 8]) {
  %s = aten.tanh.default(%p) : f32[4, 8]
  return %s
}
"""
    steps = (PassStep(pipeline_of(fake_plugins, '[[pass]]\nname = "fake.flipper"\n')
                      .steps[0].pass_, 1, "fake-passes", "1"),
             PassStep(Retype(), 2, "here", "0"))
    graph = parse_graph(text)
    with pytest.raises(PassError, match=r"pass 'fake.retype' .* @layer input 0 is "
                                        r"f32\[2, 8\] but the call passes f32\[4, 8\]"):
        run(fake_plugins, Pipeline("t", "t.toml", "", steps=steps), graph)
    assert str(graph) == text


def test_records_cpu_time_apart_from_wall_time(fake_plugins):
    """``ms`` is wall time; ``cpu_ms`` counts only this process's CPU (a pass that waits
    costs wall time, not CPU), the manager's verification of the pass included."""
    import time
    from torchloom.passes.base import Pass, PassResult
    from torchloom.passes.pipeline import PassStep, Pipeline

    @attrs.frozen
    class Waits(Pass):
        name = "fake.waits"

        def run(self, graph, ctx):
            time.sleep(0.2)
            return PassResult(False)

    @attrs.frozen
    class Spins(Pass):
        name = "fake.spins"

        def run(self, graph, ctx):
            end = time.process_time() + 0.05
            while time.process_time() < end:
                pass
            return PassResult(False)

    # (the first pass's record also holds the first check of the whole graph)
    pipeline = Pipeline("t", "t.toml", "", steps=(PassStep(Spins(), 1, "here", "0"),
                                                  PassStep(Waits(), 2, "here", "0")))
    report, _ = run(fake_plugins, pipeline, small_graph())
    spins, waits = report.records
    assert waits.ms >= 200 and waits.cpu_ms < 100
    assert spins.cpu_ms >= 50
