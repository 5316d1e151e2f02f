"""``[pipeline] extends``: a pipeline adds passes to another (a built-in or a file) with
``[[insert]]`` before/after a named pass and ``[[pass]]`` at the end, overriding its
settings, instead of copying it. Mistakes name file:line, with a did-you-mean."""

from __future__ import annotations

import pytest

from torchloom.errors import PipelineError
from torchloom.passes.pipeline import FixpointStep, build_pipeline, parse_raw
from torchloom.plugins.loader import load_plugins
from torchloom.plugins.pipelines import load_pipeline

from test_pipeline import assert_user_error, build, write
from test_plugins_support import fake_plugins, fake_site  # noqa: F401 (fixtures)

BASE = """
    [pipeline]
    name = "base"
    codegen = "eager"
    verify = "each"

    [plugins]
    disable = ["nothing-a"]

    [runtime]
    partitioner = "default"

    [[pass]]
    name = "cse"

    [[pass]]
    fixpoint = ["fake.flipper", "canonicalize"]
    max_iterations = 3

    [[pass]]
    name = "dce"
"""


def names(pipeline) -> list:
    return [[p.name for p in s.passes] if isinstance(s, FixpointStep) else s.name
            for s in pipeline.steps]


CHILD = """
    [pipeline]
    name = "mine"
    extends = "base.toml"

    [[insert]]
    name = "fake.tunable"
    after = "cse"
    limit = 7

    [[insert]]
    name = "fake.after-cse"
    before = "dce"

    [[pass]]
    name = "cse"
"""


def test_inserts_go_next_to_their_anchor_and_passes_go_last(tmp_path, fake_plugins):
    write(tmp_path, BASE, "base.toml")
    path = write(tmp_path, CHILD)
    pipeline = build(path, fake_plugins)
    assert names(pipeline) == ["cse", "fake.tunable", ["fake.flipper", "canonicalize"],
                               "fake.after-cse", "dce", "cse"]
    tunable = pipeline.steps[1]
    assert tunable.pass_.limit == 7 and (tunable.source, tunable.line) == (path, 5)
    base = str(tmp_path / "base.toml")
    assert (pipeline.steps[0].source, pipeline.steps[0].line) == (base, 12)
    assert pipeline.steps[2].passes[0].source == base


def test_an_anchor_in_a_fixpoint_group_places_the_pass_next_to_the_whole_group(
        tmp_path, fake_plugins):
    write(tmp_path, BASE, "base.toml")
    path = write(tmp_path, """
        [pipeline]
        extends = "base.toml"

        [[insert]]
        name = "fake.tunable"
        after = "fake.flipper"

        [[insert]]
        name = "fake.retype"
        before = "canonicalize"
    """)
    assert names(build(path, fake_plugins)) == [
        "cse", "fake.retype", ["fake.flipper", "canonicalize"], "fake.tunable", "dce"]


def test_settings_override_one_by_one_and_disable_adds_up(tmp_path, fake_plugins):
    write(tmp_path, BASE, "base.toml")
    path = write(tmp_path, """
        [pipeline]
        extends = "base.toml"
        verify = "end"

        [plugins]
        disable = ["nothing-b"]
    """, "child.toml")
    pipeline = build(path, fake_plugins)
    assert (pipeline.name, pipeline.verify, pipeline.codegens) == ("child", "end", ("eager",))
    assert (pipeline.partitioner, pipeline.partitioner_set) == ("default", True)
    assert pipeline.disable == ("nothing-a", "nothing-b")
    assert load_pipeline(path, fake_plugins).raw.disable == ("nothing-a", "nothing-b")
    assert names(pipeline) == ["cse", ["fake.flipper", "canonicalize"], "dce"]


def test_the_pipelines_text_stands_alone_and_builds_the_same_pipeline(tmp_path, fake_plugins):
    """What a reproducer keeps as pipeline.toml: one file, whatever it extends."""
    write(tmp_path, BASE, "base.toml")
    pipeline = build(write(tmp_path, CHILD), fake_plugins)
    assert "extends" not in pipeline.text and "[[insert]]" not in pipeline.text
    again = build_pipeline(parse_raw(pipeline.text, str(tmp_path / "elsewhere.toml")),
                           fake_plugins)
    assert names(again) == names(pipeline) and again.name == "mine"
    assert again.fingerprint() == pipeline.fingerprint()
    assert (again.verify, again.codegens, again.partitioner) == ("each", ("eager",), "default")


def test_adding_one_pass_to_the_default_pipeline():
    plugins = load_plugins()
    loaded = load_pipeline({"pipeline": {"name": "mine", "extends": "default"},
                            "insert": [{"name": "cse", "after": "fusion.vertical"}]}, plugins)
    default = load_pipeline("default", plugins).pipeline
    expected = names(default)
    at = expected.index(["fusion.vertical", "fusion.horizontal"]) + 1
    assert names(loaded.pipeline) == expected[:at] + ["cse"] + expected[at:]
    assert loaded.pipeline.codegens == default.codegens


@pytest.mark.parametrize("child, line, fragments", [
    ('[[insert]]\nname = "cse"\nafter = "fake.flipr"\n', 6,
     ["after = 'fake.flipr' names no pass of the pipeline it extends",
      "did you mean 'fake.flipper'?"]),
    ('[[insert]]\nname = "cse"\n', 4, ["needs exactly one of before", "after"]),
    ('[[insert]]\nname = "cse"\nbefore = "dce"\nafter = "dce"\n', 4, ["not both"]),
    ('[[insert]]\nname = "cse"\nafter = 3\n', 6, ["after must be a pass name"]),
    ('[[insert]]\nname = "fake.tunabel"\nafter = "cse"\n', 5,
     ["unknown pass 'fake.tunabel'", "did you mean 'fake.tunable'?"]),
    ('[[insert]]\nname = "fake.tunable"\nafter = "cse"\nlimt = 2\n', 7,
     ["has no option 'limt'", "did you mean 'limit'?"]),
])
def test_insert_mistakes_name_the_extending_file_and_line(tmp_path, fake_plugins, capsys,
                                                          child, line, fragments):
    write(tmp_path, BASE, "base.toml")
    path = write(tmp_path, '[pipeline]\nextends = "base.toml"\n\n' + child)
    assert_user_error(path, fake_plugins, capsys, f"{path}:{line}: ", *fragments)


def test_an_anchor_the_pipeline_runs_twice_is_ambiguous(tmp_path, fake_plugins, capsys):
    write(tmp_path, BASE + '\n[[pass]]\nname = "cse"\n', "base.toml")
    path = write(tmp_path, '[pipeline]\nextends = "base.toml"\n\n'
                           '[[insert]]\nname = "dce"\nafter = "cse"\n')
    base = tmp_path / "base.toml"
    assert_user_error(path, fake_plugins, capsys, f"{path}:6: after = 'cse' is ambiguous",
                      f"({base}:12, {base}:22)")


def test_a_mistake_in_the_extended_file_names_that_file(tmp_path, fake_plugins, capsys):
    write(tmp_path, '[pipeline]\nverify = "sometimes"\n', "base.toml")
    path = write(tmp_path, '[pipeline]\nextends = "base.toml"\n')
    assert_user_error(path, fake_plugins, capsys, f"{tmp_path / 'base.toml'}:2: verify = "
                                                  f"'sometimes' must be one of")


@pytest.mark.parametrize("extends, fragments", [
    ("defualt", ["extends = 'defualt': pipeline 'defualt' is neither a built-in pipeline",
                 "did you mean 'default'?"]),
    ("missing.toml", ["extends = 'missing.toml'", "nor an existing file"]),
    ("p.toml", ["extends = 'p.toml' makes a cycle", "cannot extend itself"]),
    ("[1]", ["extends must be the name of a built-in pipeline or a pipeline file"]),
])
def test_extends_mistakes_name_the_line(tmp_path, fake_plugins, capsys, extends, fragments):
    value = extends if extends.startswith("[") else f'"{extends}"'
    path = write(tmp_path, f'[pipeline]\nname = "p"\nextends = {value}\n')
    assert_user_error(path, fake_plugins, capsys, f"{path}:3: ", *fragments)


def test_a_cycle_through_two_files_shows_the_chain(tmp_path, fake_plugins):
    a = write(tmp_path, '[pipeline]\nextends = "b.toml"\n', "a.toml")
    write(tmp_path, '[pipeline]\nextends = "a.toml"\n', "b.toml")
    with pytest.raises(PipelineError, match=r"b\.toml:2: extends = 'a\.toml' makes a cycle "
                                            r"\(.*a\.toml -> .*b\.toml -> .*a\.toml\)"):
        build(a, fake_plugins)


def test_insert_without_extends_says_what_to_do(tmp_path, fake_plugins, capsys):
    path = write(tmp_path, '[pipeline]\nname = "p"\n\n[[insert]]\nname = "cse"\n'
                           'after = "dce"\n')
    assert_user_error(path, fake_plugins, capsys, f"{path}:4: [[insert]] places a pass",
                      'add [pipeline] extends = "default"')


def test_a_file_extending_a_file_in_another_folder_reads_it_from_there(tmp_path, fake_plugins):
    (tmp_path / "shared").mkdir()
    write(tmp_path / "shared", BASE, "base.toml")
    (tmp_path / "team").mkdir()
    mid = write(tmp_path / "shared", '[pipeline]\nextends = "base.toml"\n\n'
                                     '[[pass]]\nname = "fake.tunable"\n', "mid.toml")
    path = write(tmp_path / "team", '[pipeline]\nextends = "../shared/mid.toml"\n\n'
                                    '[[insert]]\nname = "fake.retype"\nbefore = "fake.tunable"\n')
    assert mid
    assert names(build(path, fake_plugins)) == [
        "cse", ["fake.flipper", "canonicalize"], "dce", "fake.retype", "fake.tunable"]


def test_the_documents_example_checks(tmp_path, capsys):
    """docs/pipelines.md's extends example builds against the installed plugins."""
    import re
    from pathlib import Path

    from torchloom.cli import main
    doc = (Path(__file__).resolve().parents[2] / "docs" / "pipelines.md").read_text()
    [example] = [b for b in re.findall(r"^```toml\n(.*?)^```$", doc, re.S | re.M)
                 if "extends =" in b]
    path = tmp_path / "plus.toml"
    path.write_text(example)
    pipeline = load_pipeline(str(path)).pipeline
    default = names(load_pipeline("default").pipeline)
    at = default.index(["fusion.vertical", "fusion.horizontal"]) + 1
    assert names(pipeline) == default[:at] + ["cse"] + default[at:] + ["canonicalize"]
    assert main(["check", str(path)]) == 0
    assert f"{path}: ok" in capsys.readouterr().out


def test_a_reproducer_of_an_extending_pipeline_replays_from_its_own_directory(
        tmp_path, fake_plugins):
    """The reproducer keeps the whole pipeline: it replays with the extended file gone."""
    import shutil

    from test_plugins_support import small_graph
    from torchloom.errors import PassError
    from torchloom.passes.base import PassContext
    from torchloom.passes.manager import PassManager
    from torchloom.compiler.reproduce import reproduce
    (tmp_path / "shared").mkdir()
    write(tmp_path / "shared", BASE, "base.toml")
    path = write(tmp_path, '[pipeline]\nextends = "shared/base.toml"\nverify = "end"\n\n'
                           '[[insert]]\nname = "fake.boom"\nafter = "cse"\n')
    pipeline = build(path, fake_plugins)
    with pytest.raises(PassError) as info:
        PassManager(pipeline, fake_plugins, repro_dir=tmp_path / "repro").run(
            small_graph(), PassContext(registry=fake_plugins.registry))
    shutil.rmtree(tmp_path / "shared")
    with pytest.raises(PassError, match="pass 'fake.boom'.* raised: RuntimeError: boom"):
        reproduce(info.value.reproducer, plugins=fake_plugins)
