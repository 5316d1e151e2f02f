"""A cache directory torchloom cannot use (a regular file in its place, a read-only or
unreadable directory) costs speed, never correctness: every group still compiles, the
caches are kept in memory with one warning, and a failing pass is still named with its
plugin, its reproducer written to the temporary directory instead.

Tests run as root here, and root ignores mode bits: the permission cases then simulate
the denial at the ``os``/``io`` level (:func:`deny`); as any other user they chmod."""

from __future__ import annotations

import errno
import io
import logging
import os
import tempfile
from pathlib import Path

import pytest
import torch

from torchloom.cli import main
from torchloom.compiler import Compiler
from torchloom.errors import PassError
from torchloom.ir.text import parse_graph
from torchloom.compiler.reproduce import reproduce

from test_plugins_support import fake_plugins, fake_site  # noqa: F401 (fixtures)

#: two fusion groups of different structure (two kernels), an mm between them
TWO_GROUPS = """\
graph @g(%x: f32[8, 8], %y: f32[8, 8]) {
  %a = aten.add.Tensor(%x, %y) : f32[8, 8]
  %e = aten.exp.default(%a) : f32[8, 8]
  %m = aten.mm.default(%e, %y) : f32[8, 8]
  %n = aten.neg.default(%m) : f32[8, 8]
  %s = aten.sin.default(%n) : f32[8, 8]
  return %s
}
"""

FUSE = """\
[pipeline]
codegen = "eager"

[[pass]]
fixpoint = ["fusion.vertical", "fusion.horizontal"]
"""

ROOT = os.geteuid() == 0


def reference(x, y):
    return torch.sin(-(torch.exp(x + y) @ y))


def compile_two_groups(tmp_path, cache_dir: Path, **options) -> Compiler:
    """Compile TWO_GROUPS once; every group must have compiled on the eager codegen and
    the result must match eager."""
    (tmp_path / "fuse.toml").write_text(FUSE)
    compiler = Compiler(tmp_path / "fuse.toml", cache_dir=cache_dir, **options)
    comp = compiler.compile_graph(parse_graph(TWO_GROUPS))
    assert [(c.codegen, c.fallback_reasons) for c in comp.compiled.choices] == [
        ("eager", []), ("eager", [])]
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    torch.testing.assert_close(comp.fn(x, y)[0], reference(x, y))
    return compiler


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and r.name.startswith("torchloom")]


@pytest.fixture
def deny(monkeypatch):
    """``deny(path, "none")`` makes ``path`` behave as mode 000 would for a user who does
    not own it (nothing inside can be listed, read or written); ``deny(path, "read")`` as
    mode 0o555 (read-only). Real chmod for a user, a simulation for root."""
    rules: list[tuple[str, str]] = []

    def denied(path, *, inside_only: bool, writing: bool) -> bool:
        if isinstance(path, int):
            return False
        try:
            path = os.path.abspath(os.fspath(path))
        except TypeError:
            return False
        for root, mode in rules:
            inside = path.startswith(root + os.sep) or (not inside_only and path == root)
            if inside and (mode == "none" or writing):
                return True
        return False

    def guard(fn, *, inside_only=True, writing=lambda *a, **k: False):
        def wrapper(path, *args, **kwargs):
            if denied(path, inside_only=inside_only, writing=writing(*args, **kwargs)):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return fn(path, *args, **kwargs)
        return wrapper

    def apply(path: Path, mode: str) -> None:
        if not ROOT:
            os.chmod(path, 0o000 if mode == "none" else 0o555)
            undo.append(path)
            return
        if not rules:
            write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT
            monkeypatch.setattr(os, "stat", guard(os.stat))
            monkeypatch.setattr(os, "listdir", guard(os.listdir, inside_only=False))
            monkeypatch.setattr(os, "scandir", guard(os.scandir, inside_only=False))
            monkeypatch.setattr(os, "mkdir", guard(os.mkdir, writing=lambda *a, **k: True))
            monkeypatch.setattr(os, "unlink", guard(os.unlink, writing=lambda *a, **k: True))
            monkeypatch.setattr(os, "open", guard(os.open, writing=lambda flags, *a, **k:
                                                  bool(flags & write_flags)))
            monkeypatch.setattr(io, "open", guard(io.open, writing=lambda mode="r", *a, **k:
                                                  any(c in mode for c in "wax+")))
        rules.append((os.path.abspath(path), mode))

    undo: list[Path] = []
    yield apply
    for path in undo:
        os.chmod(path, 0o755)


def test_a_file_in_place_of_the_cache_dir_keeps_compiling_with_one_warning(tmp_path,
                                                                             caplog):
    caplog.set_level(logging.WARNING, logger="torchloom")
    cache = tmp_path / "cache"
    cache.write_text("not a directory")
    compiler = compile_two_groups(tmp_path, cache, compile_cache=True)
    assert compiler.kernel_cache.compiles == 2
    again = compiler.compile_graph(parse_graph(TWO_GROUPS))  # the compile cache, in memory
    assert again.cached and compiler.graph_cache.hits == 1
    [warning] = warnings_of(caplog)
    assert warning.startswith(f"torchloom: cache directory {cache} is unusable (a file is in "
                              f"its place); the compile and kernel caches are kept in memory")
    assert cache.read_text() == "not a directory"


def test_a_file_in_place_of_the_kernels_dir_warns_once(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="torchloom")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "kernels").write_text("not a directory")
    compiler = compile_two_groups(tmp_path, tmp_path / "cache")
    assert compiler.kernel_cache.compiles == 2
    [warning] = warnings_of(caplog)
    assert warning.startswith(f"torchloom: kernel cache directory {tmp_path / 'cache'}"
                              f"/kernels is unusable (")
    assert "kernels are cached in memory only" in warning


def test_a_file_in_place_of_the_graphs_dir_keeps_the_compile_cache_in_memory(tmp_path,
                                                                            caplog):
    caplog.set_level(logging.WARNING, logger="torchloom")
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "graphs").write_text("not a directory")
    compiler = compile_two_groups(tmp_path, tmp_path / "cache", compile_cache=True)
    for _ in range(2):
        assert compiler.compile_graph(parse_graph(TWO_GROUPS)).cached
    assert compiler.graph_cache.stats() == {"hits": 2, "misses": 1, "stores": 1,
                                            "corrupt": 0}
    [warning] = warnings_of(caplog)
    assert warning.startswith(f"torchloom: compile cache directory {tmp_path / 'cache'}"
                              f"/graphs is unusable (Not a directory); compiled graphs are "
                              f"cached in memory only")


def test_an_unreadable_kernels_dir_still_compiles_every_group(tmp_path, caplog, deny):
    cache = tmp_path / "cache"
    compile_two_groups(tmp_path, cache)  # fills kernels/ with both entries
    assert len(list((cache / "kernels").glob("*.json"))) == 2
    caplog.set_level(logging.WARNING, logger="torchloom")
    deny(cache / "kernels", "none")
    compiler = compile_two_groups(tmp_path, cache)
    assert (compiler.kernel_cache.compiles, compiler.kernel_cache.disk_hits) == (2, 0)
    [warning] = warnings_of(caplog)
    assert warning.startswith(f"torchloom: kernel cache directory {cache / 'kernels'} is "
                              f"unusable (Permission denied)")


@pytest.mark.parametrize("mode", ["read", "none"])
def test_a_read_only_or_unreadable_cache_dir_keeps_compiling_with_one_warning(
        tmp_path, caplog, deny, mode):
    cache = tmp_path / "cache"
    cache.mkdir()
    caplog.set_level(logging.WARNING, logger="torchloom")
    deny(cache, mode)
    compiler = compile_two_groups(tmp_path, cache, compile_cache=True)
    assert compiler.kernel_cache.compiles == 2
    assert compiler.compile_graph(parse_graph(TWO_GROUPS)).cached
    [warning] = warnings_of(caplog)
    assert warning.startswith(f"torchloom: cache directory {cache} is unusable (Permission "
                              f"denied); the compile and kernel caches are kept in memory")


def test_a_failing_pass_is_named_and_its_reproducer_goes_to_the_temporary_directory(
        fake_plugins, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    cache = tmp_path / "cache"
    cache.write_text("not a directory")
    (tmp_path / "boom.toml").write_text('[[pass]]\nname = "fake.boom"\n')
    compiler = Compiler(tmp_path / "boom.toml", plugins=fake_plugins, cache_dir=cache,
                        strict=True)
    with pytest.raises(PassError) as info:
        compiler.compile_graph(parse_graph(TWO_GROUPS))
    message = str(info.value)
    assert message.startswith("pass 'fake.boom' (distribution fake-passes 1.2.3) raised: "
                              "RuntimeError: boom: the pass gave up half way")
    repro = Path(info.value.reproducer)
    assert repro.parent == tmp_path / "tmp" / "torchloom-reproducers"
    assert (f"\nReproducer: {repro} ({cache / 'reproducers'} cannot be written (Not a "
            f"directory), so it went to the temporary directory; replay with: torchloom "
            f"reproduce {repro})") in message
    with pytest.raises(PassError) as again:
        reproduce(repro, fake_plugins)
    assert str(again.value).splitlines()[0] == message.splitlines()[0]


def test_explain_with_a_file_as_cache_dir_still_names_the_failing_pass(
        fake_plugins, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").write_text("not a directory")
    (tmp_path / "boom.toml").write_text('[[pass]]\nname = "fake.boom"\n')
    (tmp_path / "work.py").write_text("import torch\n\ndef workload():\n"
                                      "    return torch.exp, [torch.randn(4)]\n")
    assert main(["explain", str(tmp_path / "work.py"), "--pipeline",
                 str(tmp_path / "boom.toml")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("torchloom explain: error: pass 'fake.boom' (distribution "
                          "fake-passes 1.2.3) raised: RuntimeError: boom")
    assert f"Reproducer: {tmp_path / 'tmp' / 'torchloom-reproducers'}" in err
    assert "so it went to the temporary directory" in err and "Traceback" not in err
