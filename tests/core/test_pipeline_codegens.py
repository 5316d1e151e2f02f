"""``[pipeline] codegen`` as a list: codegens tried in order for each group, ``eager``
last; malformed values are errors naming file and line; the compiler notes listed codegens
that are not installed."""

from __future__ import annotations

import textwrap

import pytest
from torchloom.tools import Compiler
from torchloom.errors import PipelineError
from torchloom.passes.pipeline import build_pipeline, read_pipeline
from torchloom.plugins.loader import load_plugins


def _pipeline(tmp_path, codegen: str):
    path = tmp_path / "p.toml"
    path.write_text(textwrap.dedent(f"""\
        [pipeline]
        name = "p"
        codegen = {codegen}
        """))
    return path


def test_a_list_is_tried_in_order_then_eager(tmp_path):
    plugins = load_plugins()
    pipeline = build_pipeline(read_pipeline(_pipeline(tmp_path, '["cpu", "triton"]')), plugins)
    assert pipeline.codegens == ("cpu", "triton") and pipeline.codegen == "cpu"
    chain = [c.name for c in plugins.codegen_chain(pipeline.codegens)]
    assert chain == ["cpu", "triton", "eager"]


def test_the_default_pipeline_lists_triton_then_cpu():
    pipeline = build_pipeline(read_pipeline("default"), load_plugins())
    assert pipeline.codegens == ("triton", "cpu")


@pytest.mark.parametrize("value", ["3", "[]", '["cpu", 2]'])
def test_malformed_codegen_names_file_and_line(tmp_path, value):
    path = _pipeline(tmp_path, value)
    with pytest.raises(PipelineError) as err:
        build_pipeline(read_pipeline(path), load_plugins())
    assert f"{path}:3:" in str(err.value) and "codegen" in str(err.value)


def test_codegens_not_installed_are_noted_each(tmp_path):
    compiler = Compiler(_pipeline(tmp_path, '["nosuch", "cpu"]'), cache_dir=tmp_path)
    assert any("'nosuch' is not installed" in n for n in compiler.notes)
    assert not any("'cpu'" in n for n in compiler.notes)
    assert [c.name for c in compiler.plugins.codegen_chain(compiler.pipeline.codegens)] == [
        "cpu", "eager"]
