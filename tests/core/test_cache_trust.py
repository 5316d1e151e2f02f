"""What the kernel cache (runtime/cache.py) and the compile cache (runtime/graph_cache.py)
read stays inside their directory, and forged entries (paths out of the directory,
symlinks out of it, JSON nested far too deep) are damaged entries: reported, rebuilt and
rewritten, like a torn write."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import pytest
import torch

from torchloom.api import parse_graph
from torchloom.tools import EagerCodegen
from torchloom.ops.aten import default_registry
from torchloom.passes.manager import RunReport
from torchloom.runtime.cache import KernelCache, checksum
from torchloom.runtime.graph_cache import GraphCache

GROUP = """\
graph @main(%x: f32[4, 8]) {
  %a = torchloom.fusion_group(%x) : f32[4, 8] region @g0(%p: f32[4, 8]) {
    %s = aten.mul.Tensor(%p, %p) : f32[4, 8]
    %t = aten.tanh.default(%s) : f32[4, 8]
    return %t
  }
  return %a
}
"""

LAYER = """\
graph @layer(%x: f32[4, 8], %w: f32[8]) {
  %m = aten.mul.Tensor(%x, %w) : f32[4, 8]
  %g = aten.gelu.default(%m) : f32[4, 8]
  return %g
}
"""


def _group():
    return next(iter(parse_graph(GROUP).nodes))


def _warm(directory: Path) -> Path:
    """A kernel cache directory with one good entry; returns the entry's JSON file."""
    KernelCache(directory).get_or_compile(EagerCodegen(), _group(), default_registry())
    (entry,) = directory.glob("*.json")
    return entry


def _rewrite(entry: Path, **changes) -> None:
    """Change fields of an entry and make its checksum agree (a forged entry)."""
    data = json.loads(entry.read_text())
    data.pop("checksum")
    data.update(changes)
    entry.write_text(json.dumps({**data, "checksum": checksum(data)}))


def _forge(kind: str, entry: Path, outside: Path) -> Path:
    """Point the entry at a file outside the cache directory that holds the right source
    (so only the path is wrong); returns the file outside."""
    data = json.loads(entry.read_text())
    source_path = entry.parent / data["source_file"]
    planted = outside / "planted.src"
    planted.write_text(source_path.read_text())
    if kind == "dotdot":
        _rewrite(entry, source_file=os.path.relpath(planted, entry.parent))
    elif kind == "absolute":
        _rewrite(entry, source_file=str(planted))
    elif kind == "source_symlink":
        source_path.unlink()
        source_path.symlink_to(planted)
    elif kind == "entry_symlink":
        planted = outside / "planted.json"
        planted.write_text(entry.read_text())
        (entry.parent / data["source_file"]).rename(outside / data["source_file"])
        _rewrite(planted, source_file=os.path.relpath(outside / data["source_file"],
                                                       entry.parent))
        entry.unlink()
        entry.symlink_to(planted)
    return planted


def _assert_rebuilt(directory: Path, entry: Path, caplog) -> None:
    cache = KernelCache(directory)
    with caplog.at_level(logging.WARNING, logger="torchloom.cache"):
        kernel = cache.get_or_compile(EagerCodegen(), _group(), default_registry())
    x = torch.randn(4, 8)
    torch.testing.assert_close(kernel(x)[0], torch.tanh(x * x))
    assert (cache.corrupt, cache.compiles, cache.disk_hits) == (1, 1, 0)
    assert any("corrupt" in r.getMessage() and entry.name in r.getMessage()
               for r in caplog.records)
    again = KernelCache(directory)  # rewritten: the next process loads it from disk
    again.get_or_compile(EagerCodegen(), _group(), default_registry())
    assert (again.corrupt, again.compiles, again.disk_hits) == (0, 0, 1)


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "source_symlink", "entry_symlink"])
def test_kernel_entries_never_read_outside_the_cache_directory(tmp_path, caplog, kind):
    directory, outside = tmp_path / "cache" / "kernels", tmp_path / "outside"
    outside.mkdir()
    entry = _warm(directory)
    planted = _forge(kind, entry, outside)
    before = planted.read_text()
    _assert_rebuilt(directory, entry, caplog)
    assert planted.read_text() == before  # the file outside is neither used nor written
    assert not entry.is_symlink() and not any(p.is_symlink() for p in directory.iterdir())


def test_a_compile_cache_directory_linked_out_of_the_cache_is_not_used(tmp_path, caplog):
    identity = {"pipeline": "p"}
    graph = parse_graph(LAYER)
    elsewhere = GraphCache(tmp_path / "elsewhere", identity)
    key = elsewhere.key(graph)
    elsewhere.store(key, graph, RunReport([], ["written elsewhere"]))
    planted = elsewhere.path(key)
    before = planted.read_text()
    cache = GraphCache(tmp_path / "cache" / "graphs", identity)
    cache.path(key).parent.parent.mkdir(parents=True)
    cache.path(key).parent.symlink_to(planted.parent)
    with caplog.at_level(logging.WARNING, logger="torchloom.cache"):
        assert cache.load(key, default_registry()) is None
    assert cache.corrupt == 1
    assert any("outside the cache directory" in r.getMessage() for r in caplog.records)
    cache.store(key, graph, RunReport([], ["rebuilt"]))
    assert not cache.path(key).parent.is_symlink() and planted.read_text() == before
    hit = GraphCache(tmp_path / "cache" / "graphs", identity).load(key, default_registry())
    assert hit is not None and hit.report.notes == ["rebuilt"]


DEEP_JSON = "[" * 100_000 + "]" * 100_000
DEEP_IR = ("graph @g0(%p: f32[4, 8]) {\n"
           f"  %s = aten.mul.Tensor(%p, %p) {{alpha = {'[' * 100_000}1{']' * 100_000}}} : f32[4, 8]\n"
           "  return %s\n}\n")


@pytest.mark.parametrize("where", ["entry", "source"])
def test_a_kernel_entry_nested_too_deep_is_damaged_and_rebuilt(tmp_path, caplog, where):
    directory = tmp_path / "kernels"
    entry = _warm(directory)
    if where == "entry":
        entry.write_text(DEEP_JSON)
    else:  # the eager codegen's source is IR text
        data = json.loads(entry.read_text())
        (directory / data["source_file"]).unlink()
        name = f"{entry.stem}-{hashlib.sha256(DEEP_IR.encode()).hexdigest()[:16]}.src"
        (directory / name).write_text(DEEP_IR)
        _rewrite(entry, source_file=name,
                 source_sha256=hashlib.sha256(DEEP_IR.encode()).hexdigest())
    _assert_rebuilt(directory, entry, caplog)


@pytest.mark.parametrize("where", ["entry", "ir"])
def test_a_compile_cache_entry_nested_too_deep_is_damaged_and_rebuilt(tmp_path, caplog, where):
    identity = {"pipeline": "p"}
    graph = parse_graph(LAYER)
    cache = GraphCache(tmp_path / "graphs", identity)
    key = cache.key(graph)
    cache.store(key, graph, RunReport([], []))
    path = cache.path(key)
    if where == "entry":
        path.write_text(DEEP_JSON)
    else:
        data = json.loads(path.read_text())
        data.pop("checksum")
        data["ir"] = DEEP_IR
        path.write_text(json.dumps({**data, "checksum": checksum(data)}))
    with caplog.at_level(logging.WARNING, logger="torchloom.cache"):
        assert cache.load(key, default_registry()) is None
    assert cache.corrupt == 1
    assert any(path.name in r.getMessage() and "unusable" in r.getMessage()
               for r in caplog.records)
    cache.store(key, graph, RunReport([], ["rebuilt"]))
    assert GraphCache(tmp_path / "graphs", identity).load(
        key, default_registry()).report.notes == ["rebuilt"]


def test_a_reproducer_nested_too_deep_is_a_clear_error(tmp_path, capsys):
    from torchloom.cli import main
    from torchloom.ir.text import MAX_NESTING
    d = tmp_path / "repro"
    d.mkdir()
    (d / "before.ir").write_text(DEEP_IR.replace("@g0", "@main"))
    (d / "pass.json").write_text(json.dumps({"pass": "dce", "options": {}}))
    assert main(["reproduce", str(d)]) == 2
    err = capsys.readouterr().err
    assert f"before.ir:2:" in err and f"nested more than {MAX_NESTING} levels deep" in err
    assert "Traceback" not in err and len(err.splitlines()) == 1
