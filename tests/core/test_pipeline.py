"""Pipeline files: every mistake is a PipelineError naming file:line (with a did-you-mean
where one helps), and ``torchloom check`` exits 2 with that message; good files build."""

from __future__ import annotations

import textwrap

import pytest

from torchloom.cli import main
from torchloom.errors import PipelineError
from torchloom.passes.pipeline import (FixpointStep, PassStep, build_pipeline,
                                       builtin_pipelines, read_pipeline)
from torchloom.plugins.loader import load_plugins

from test_plugins_support import fake_plugins, fake_site  # noqa: F401 (fixtures)


def write(tmp_path, text: str, name: str = "p.toml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return str(path)


def build(path: str, plugins):
    raw = read_pipeline(path)
    return build_pipeline(raw, plugins)


def check(path: str, capsys) -> tuple[int, str, str]:
    """``torchloom check PATH`` through the CLI entry point: (exit code, stdout, stderr)."""
    rc = main(["check", path])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_user_error(path: str, plugins, capsys, *fragments: str) -> None:
    """The builder raises PipelineError containing every fragment; the CLI exits 2 with
    a one-line message holding them too, and no traceback."""
    with pytest.raises(PipelineError) as info:
        build(path, plugins)
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))
    rc, out, err = check(path, capsys)
    assert rc == 2
    assert out == ""
    assert err.startswith("torchloom check: error: ")
    for fragment in fragments:  # installed plugins may add to the list of passes
        assert fragment in err, (fragment, err)
    assert err.count("\n") == 1 and "Traceback" not in err


def test_malformed_toml_names_file_line_and_column(tmp_path, fake_plugins, capsys):
    path = write(tmp_path, """
        [pipeline]
        name = "broken"
        verify = each
    """)
    assert_user_error(path, fake_plugins, capsys, f"{path}:3:10: malformed TOML")


def test_misspelt_pass_name_suggests_the_installed_one(tmp_path, fake_plugins, capsys):
    path = write(tmp_path, """
        [pipeline]
        name = "typo"

        [[pass]]
        name = "cse"

        [[pass]]
        name = "fake.tunabel"
    """)
    assert_user_error(path, fake_plugins, capsys, f"{path}:8:",
                      "unknown pass 'fake.tunabel'", "did you mean 'fake.tunable'?")


def test_unknown_table_and_pipeline_key_suggest_the_right_one(tmp_path, fake_plugins, capsys):
    path = write(tmp_path, """
        [pipline]
        name = "x"
    """)
    assert_user_error(path, fake_plugins, capsys, f"{path}:1:", "unknown table [pipline]",
                      "did you mean 'pipeline'?")
    path = write(tmp_path, """
        [pipeline]
        name = "x"
        verfy = "end"
    """, "key.toml")
    assert_user_error(path, fake_plugins, capsys, f"{path}:3:", "unknown key 'verfy'",
                      "did you mean 'verify'?")


def test_unknown_option_names_its_line_and_the_known_options(tmp_path, fake_plugins, capsys):
    path = write(tmp_path, """
        [pipeline]
        name = "x"

        [[pass]]
        name = "fake.tunable"
        scale = 2.0
        limt = 3
    """)
    assert_user_error(path, fake_plugins, capsys, f"{path}:7:",
                      "pass 'fake.tunable' has no option 'limt'", "did you mean 'limit'?",
                      "options: limit, scale, enabled, mode, ops")


@pytest.mark.parametrize("line, expected", [
    ('limit = "four"', "option 'limit': expected an int, got str 'four'"),
    ("limit = true", "option 'limit': expected an int, got bool True"),
    ('scale = "big"', "option 'scale': expected a number"),
    ("enabled = 1", "option 'enabled': expected true/false, got 1"),
    ('mode = "slow"', "option 'mode': 'slow' is not one of ['fast', 'exact']"),
    ("ops = [1, 2]", "option 'ops': list item: expected a string, got 1"),
    ('ops = "aten.add"', "option 'ops': expected a list"),
])
def test_wrong_option_type_is_rejected_at_its_line(tmp_path, fake_plugins, capsys, line,
                                                   expected):
    path = write(tmp_path, f"""
        [pipeline]
        name = "x"

        [[pass]]
        name = "fake.tunable"
        {line}
    """)
    assert_user_error(path, fake_plugins, capsys, f"{path}:6:", expected)


def test_out_of_range_option_reports_the_validator(tmp_path, fake_plugins, capsys):
    path = write(tmp_path, """
        [pipeline]
        name = "x"

        [[pass]]
        name = "fake.tunable"
        mode = "exact"
        limit = 0
    """)
    assert_user_error(path, fake_plugins, capsys, f"{path}:7:",
                      "pass 'fake.tunable': invalid option value", "'limit' must be >= 1")


def test_inline_fixpoint_member_options_are_checked(tmp_path, fake_plugins, capsys):
    path = write(tmp_path, """
        [pipeline]
        name = "x"

        [[pass]]
        fixpoint = ["cse",
                    { name = "fake.tunable", limit = "x" }]
        max_iterations = 3
    """)
    assert_user_error(path, fake_plugins, capsys, f"{path}:6:",
                      "option 'limit': expected an int")
    path = write(tmp_path, """
        [[pass]]
        fixpoint = ["cse", "fake.flipr"]
        max_iterations = 0
    """, "iters.toml")
    assert_user_error(path, fake_plugins, capsys, f"{path}:3:",
                      "max_iterations must be an int >= 1")


def test_requires_violation_names_both_passes(tmp_path, fake_plugins, capsys):
    missing = write(tmp_path, """
        [[pass]]
        name = "fake.needs-tunable"
    """)
    assert_user_error(missing, fake_plugins, capsys, f"{missing}:1:",
                      "pass 'fake.needs-tunable' requires 'fake.tunable' to run before it",
                      "it is not in the pipeline")
    late = write(tmp_path, """
        [[pass]]
        name = "fake.needs-tunable"

        [[pass]]
        name = "fake.tunable"
    """, "late.toml")
    assert_user_error(late, fake_plugins, capsys, f"{late}:1:", "it comes later")


def test_after_violation_names_the_line_of_the_other_pass(tmp_path, fake_plugins, capsys):
    path = write(tmp_path, """
        [[pass]]
        name = "fake.after-cse"

        [[pass]]
        name = "cse"
    """)
    assert_user_error(path, fake_plugins, capsys, f"{path}:1:",
                      "pass 'fake.after-cse' must run after 'cse'", "(line 4)")


def test_bad_policies_and_unknown_pipeline_name(tmp_path, fake_plugins, capsys):
    path = write(tmp_path, """
        [pipeline]
        verify = "always"
    """)
    assert_user_error(path, fake_plugins, capsys, f"{path}:2:",
                      "verify = 'always' must be one of each, end, off")
    path = write(tmp_path, """
        [pipeline]
        on_error = "ignore"
    """, "on_error.toml")
    assert_user_error(path, fake_plugins, capsys, f"{path}:2:",
                      "on_error = 'ignore' must be one of raise, skip")
    with pytest.raises(PipelineError, match="did you mean 'default'"):
        read_pipeline("defualt")
    assert main(["check", "defualt"]) == 2
    assert "neither a built-in pipeline" in capsys.readouterr().err


def test_a_good_pipeline_builds_in_file_order_with_typed_options(tmp_path, fake_plugins,
                                                                 capsys):
    path = write(tmp_path, """
        [pipeline]
        name = "good"
        codegen = "eager"
        verify = "end"
        on_error = "skip"

        [[pass]]
        name = "fake.tunable"
        limit = 7
        scale = 2
        enabled = false
        mode = "exact"
        ops = ["aten.add.Tensor"]

        [[pass]]
        fixpoint = ["cse", { name = "dce", regions = false }]
        max_iterations = 4

        [[pass]]
        name = "fake.after-cse"

        [[pass]]
        name = "not.installed"
        optional = true
    """)
    pipeline = build(path, fake_plugins)
    assert (pipeline.name, pipeline.codegen, pipeline.verify, pipeline.on_error) == \
        ("good", "eager", "end", "skip")
    first, fix, last = pipeline.steps
    assert isinstance(first, PassStep) and isinstance(fix, FixpointStep)
    assert first.pass_.options() == {"limit": 7, "scale": 2, "enabled": False,
                                     "mode": "exact", "ops": ["aten.add.Tensor"]}
    assert (first.distribution, first.version, first.line) == ("fake-passes", "1.2.3", 7)
    assert [s.name for s in fix.passes] == ["cse", "dce"] and fix.max_iterations == 4
    assert fix.passes[1].pass_.regions is False
    assert last.name == "fake.after-cse"
    assert pipeline.missing_optional == ("not.installed",)
    rc, out, err = check(path, capsys)
    assert rc == 0 and err == ""
    assert f"{path}: ok (4 passes, codegen eager, verify end, fingerprint " \
           f"{pipeline.fingerprint()})" in out
    assert "optional pass 'not.installed' is not installed" in out


def test_shipped_pipelines_are_selectable_by_name():
    plugins = load_plugins(entry_points=[])
    assert {"default", "none"} <= set(builtin_pipelines())
    none = build_pipeline(read_pipeline("none"), plugins)
    assert none.steps == () and none.codegen == "eager"
    default = build_pipeline(read_pipeline("default"), plugins)
    names = [s.name for s in default.flat_steps()]
    # plugin passes are optional there; canonicalize and cse also run before dedup.regions
    assert names == ["canonicalize", "cse", "canonicalize", "cse", "dce"]
    assert "fusion.vertical" in default.missing_optional


@pytest.mark.parametrize("text, line, message", [
    ('[[pipeline]]\nname = "x"\n', 1, "pipeline must be a table: write [pipeline]"),
    ('pass = "cse"\n', 1, "pass must be an array of tables: write [[pass]] before each pass"),
    ("pass = [1]\n", 1, "pass must be an array of tables"),
    ('[pipeline]\ncodegen = "eager"\nname = 3\n', 3, "[pipeline] name must be a string, got 3"),
    ('[plugins]\ndisable = "fake"\n', 2, "[plugins] disable must be a list of plugin or "
                                         "distribution names, got 'fake'"),
    ('[[pass]]\nname = "cse"\n\n[[pass]]\nname = "dce"\noptional = "yes"\n', 6,
     "optional must be true or false, got 'yes'"),
])
def test_wrongly_shaped_entries_are_errors_not_crashes(tmp_path, fake_plugins, capsys, text,
                                                       line, message):
    path = tmp_path / "shape.toml"
    path.write_text(text)
    assert_user_error(str(path), fake_plugins, capsys, f"{path}:{line}: {message}")


def test_the_pipeline_document_example_checks(tmp_path, fake_plugins, capsys):
    """docs/pipelines.md's complete example is a valid pipeline (its plugin passes are
    optional, so it checks with or without the fusion plugin installed)."""
    import re
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[2] / "docs" / "pipelines.md").read_text()
    example = re.findall(r"^```toml\n(.*?)^```$", doc, re.S | re.M)[0]
    path = tmp_path / "my.toml"
    path.write_text(example)
    pipeline = build(str(path), fake_plugins)
    assert pipeline.disable == ("some-plugin",) and pipeline.verify == "each"
    assert [s.name for s in pipeline.flat_steps()][:2] == ["canonicalize", "cse"]
    assert pipeline.flat_steps()[1].pass_.regions is False
    assert main(["check", str(path)]) == 0
    assert f"{path}: ok" in capsys.readouterr().out
