"""``load_pipeline``: read the pipeline, load the plugins it leaves enabled, build it;
written once (``torchloom.plugins.pipelines``), used by the compiler, ``check``, ``opt``
and ``reproduce``."""

from __future__ import annotations

import ast

import pytest

from torchloom.errors import PipelineError
from torchloom.passes.pipeline import parse_raw
from torchloom.plugins.loader import load_plugins
from torchloom.plugins.pipelines import load_pipeline
from test_layers import CORE, ROOT, core_modules

SEQUENCE = {"build_pipeline", "load_plugins"}


def calls_in(path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.id if isinstance(func, ast.Name) else getattr(func, "attr", ""))
    return names


def test_the_sequence_is_written_once():
    home = CORE / "plugins" / "pipelines.py"
    assert SEQUENCE <= calls_in(home)
    others = {str(p.relative_to(ROOT)): sorted(calls_in(p) & SEQUENCE) for p in core_modules()
              if p != home and calls_in(p) & SEQUENCE}
    # `torchloom plugins` lists what is installed: it loads plugins without a pipeline
    assert others == {"core/torchloom/cli/__init__.py": ["load_plugins"]}, others


def test_disabled_plugins_are_not_loaded_and_their_passes_are_unknown():
    loaded = load_pipeline({"pipeline": {"codegen": "eager"},
                            "plugins": {"disable": ["torchloom-fusion"]},
                            "pass": [{"name": "cse"}]})
    assert "torchloom-fusion" in loaded.plugins.disabled
    assert not any(n.startswith("fusion.") for n in loaded.plugins.passes)
    assert [s.name for s in loaded.pipeline.flat_steps()] == ["cse"]
    with pytest.raises(PipelineError, match="unknown pass 'fusion.vertical'"):
        load_pipeline({"plugins": {"disable": ["torchloom-fusion"]},
                       "pass": [{"name": "fusion.vertical"}]})


def test_a_given_plugin_set_and_a_parsed_pipeline_are_used_as_they_are():
    plugins = load_plugins()
    raw = parse_raw('[pipeline]\nname = "p"\n\n[[pass]]\nname = "dce"\n', "p.toml")
    loaded = load_pipeline(raw, plugins)
    assert loaded.plugins is plugins and loaded.raw is raw
    assert (loaded.pipeline.name, loaded.pipeline.source) == ("p", "p.toml")


def test_versions_name_every_loaded_plugin():
    plugins = load_plugins()
    versions = plugins.versions()
    assert set(versions["plugins"]) == set(plugins.plugins)
    assert versions["plugins"]["builtin"]["distribution"] == "torchloom"
    assert {"torchloom", "torch", "python"} <= set(versions)
