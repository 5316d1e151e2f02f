"""A pass failing under ``torch.compile``: the graph runs eagerly and the one-line warning
names the reproducer (replayable); the same failure in a later process start reuses that
reproducer instead of writing another one, and says so."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch

from torchloom.errors import PassError
from torchloom.compiler.reproduce import reproduce

from test_plugins_support import fake_plugins, fake_site  # noqa: F401 (fixtures)

PIPELINE = """
[pipeline]
name = "boom"
codegen = "eager"

[[pass]]
name = "cse"

[[pass]]
name = "fake.boom"
"""


def f(x, y):
    return torch.exp(x + y) * 2


def compile_and_run(pipeline: Path, cache: Path, caplog, *shape) -> list[str]:
    """One process start: a new backend (so a new Compiler), its warnings."""
    torch._dynamo.reset()
    caplog.clear()
    compiled = torch.compile(f, backend="torchloom",
                             options={"pipeline": str(pipeline), "cache_dir": str(cache)})
    x, y = torch.randn(*shape), torch.randn(*shape)
    with caplog.at_level(logging.WARNING, logger="torchloom"):
        torch.testing.assert_close(compiled(x, y), f(x, y))  # eager fallback: still right
    torch._dynamo.reset()
    return [r.getMessage() for r in caplog.records if "eagerly" in r.getMessage()]


def reproducer_of(warning: str) -> Path:
    match = re.search(r"Reproducer: (\S+) \(", warning)
    assert match, warning
    return Path(match.group(1))


@pytest.fixture
def setup(fake_plugins, tmp_path):
    path = tmp_path / "boom.toml"
    path.write_text(PIPELINE)
    return path, tmp_path / "cache"


def test_the_fallback_warning_names_a_replayable_reproducer(setup, caplog):
    pipeline, cache = setup
    [warning] = compile_and_run(pipeline, cache, caplog, 4, 8)
    assert "pass 'fake.boom' (distribution fake-passes 1.2.3) raised: RuntimeError: boom" \
        in warning
    repro = reproducer_of(warning)
    assert repro.parent == cache / "reproducers" and (repro / "before.ir").is_file()
    assert f"(replay with: torchloom reproduce {repro})" in warning
    with pytest.raises(PassError, match="boom: the pass gave up half way"):
        reproduce(repro)


def test_the_same_failure_reuses_its_reproducer_and_says_so(setup, caplog):
    pipeline, cache = setup
    [first] = compile_and_run(pipeline, cache, caplog, 4, 8)
    repro = reproducer_of(first)
    written = (repro / "pass.json").stat().st_mtime_ns
    assert "earlier identical failure" not in first
    [again] = compile_and_run(pipeline, cache, caplog, 4, 8)  # as a new process would
    assert reproducer_of(again) == repro
    assert "written by an earlier identical failure" in again
    assert (repro / "pass.json").stat().st_mtime_ns == written  # not rewritten
    assert [p.name for p in (cache / "reproducers").iterdir()] == [repro.name]
    # a different failure (another graph before the pass) gets its own
    [other] = compile_and_run(pipeline, cache, caplog, 2, 3)
    assert reproducer_of(other) != repro and "earlier identical failure" not in other
    assert len(list((cache / "reproducers").iterdir())) == 2


def test_the_pass_manager_writes_one_reproducer_per_failure(fake_plugins, tmp_path):
    from torchloom.ir.text import parse_graph
    from torchloom.passes.base import PassContext
    from torchloom.passes.manager import PassManager
    from torchloom.passes.pipeline import build_pipeline, parse_raw

    from test_plugins_support import SMALL_IR
    pipeline = build_pipeline(parse_raw(PIPELINE, "boom.toml"), fake_plugins)
    other_ir = SMALL_IR.replace("aten.exp.default", "aten.tanh.default")
    found = []
    for text in (SMALL_IR, SMALL_IR, other_ir):  # each run: a new manager, as a new process
        manager = PassManager(pipeline, fake_plugins, repro_dir=tmp_path / "repro")
        with pytest.raises(PassError) as info:
            manager.run(parse_graph(text), PassContext(registry=fake_plugins.registry))
        found.append((info.value.reproducer, str(info.value)))
    assert found[0][0] == found[1][0] != found[2][0]
    assert ["written by an earlier identical failure" in m for _, m in found] == [
        False, True, False]
    assert sorted(str(p) for p in (tmp_path / "repro").iterdir()) == sorted(
        {found[0][0], found[2][0]})
    assert (Path(found[2][0]) / "before.ir").read_text() == other_ir  # cse changed nothing
