"""A cache directory the cpu codegen cannot use costs speed, not compiled groups (issue
#40): with a file in place of the cache directory, or of its ``cpu/`` directory, the
codegen builds its libraries in a temporary directory (one warning, removed at exit), so
every group still compiles on ``cpu``, no group falls back to eager, no reproducer is
written, and the kernel cache's valid entries are hits, not "corrupt"."""

from __future__ import annotations

import gc
import logging
import tempfile

import pytest
import torch
import torchloom.compiler

from conftest import codegens
from torchloom_codegen_cpu import CpuCodegen


def pointwise(x, y):
    return torch.sigmoid(x * y) + torch.exp(-x)


@pytest.fixture
def compilers(monkeypatch):
    """Every Compiler ``torch.compile(backend="torchloom")`` makes, in order."""
    made = []

    class Recorded(torchloom.compiler.Compiler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(torchloom.compiler, "Compiler", Recorded)
    return made


@pytest.fixture
def temporary(tmp_path, monkeypatch):
    """The temporary directory (reproducers and fallback libraries go there)."""
    path = tmp_path / "tmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


def _compile_and_check(compilers, monkeypatch, cache_dir):
    """torch.compile(pointwise, backend="torchloom") with TORCHLOOM_CACHE_DIR=cache_dir, run
    and compared with eager; the compiler it made."""
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(cache_dir))
    torch._dynamo.reset()
    x, y = torch.randn(64, 33), torch.randn(64, 33)
    before = len(compilers)
    got = torch.compile(pointwise, backend="torchloom")(x, y)
    torch.testing.assert_close(got, pointwise(x, y))
    assert len(compilers) == before + 1
    return compilers[-1]


def _failures(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "raised while compiling" in r.getMessage()]


def test_a_file_in_place_of_the_cache_dir_still_compiles_every_group_on_cpu(
        tmp_path, monkeypatch, caplog, compilers, temporary):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file")
    caplog.set_level(logging.WARNING)
    compiler = _compile_and_check(compilers, monkeypatch, blocked)
    ran = codegens(compiler)
    assert ran and set(ran) == {"cpu"}, ran
    assert _failures(caplog) == []
    assert not (temporary / "torchloom-reproducers").exists()
    moved = [r.getMessage() for r in caplog.records if "library directory" in r.getMessage()]
    assert len(moved) == 1 and f"{blocked / 'cpu'} is unusable" in moved[0], moved
    assert blocked.read_text() == "a file"


def test_a_file_named_cpu_leaves_the_kernel_entries_valid(tmp_path, monkeypatch, caplog,
                                                          compilers, temporary):
    cache = tmp_path / "cache"
    first = _compile_and_check(compilers, monkeypatch, cache)
    assert set(codegens(first)) == {"cpu"} and first.kernel_cache.stats()["compiles"] >= 1
    for library in (cache / "cpu").iterdir():
        library.unlink()
    (cache / "cpu").rmdir()
    (cache / "cpu").write_text("blocks the libraries' directory")
    caplog.set_level(logging.WARNING)
    again = _compile_and_check(compilers, monkeypatch, cache)
    stats = again.kernel_cache.stats()
    assert stats["corrupt"] == 0 and stats["disk_hits"] >= 1, stats
    assert set(codegens(again)) == {"cpu"} and _failures(caplog) == []
    assert not (temporary / "torchloom-reproducers").exists()


def test_the_temporary_directory_is_made_once_per_codegen_and_removed(tmp_path, temporary):
    blocked = tmp_path / "file"
    blocked.write_text("")
    codegen = CpuCodegen(cache_dir=blocked)
    directory = codegen.directory()
    assert directory.is_dir() and directory.parent == temporary
    assert codegen.directory() == directory and codegen.toolchain() is not None
    assert codegen.cache_dir == blocked / "cpu"
    del codegen
    gc.collect()
    assert not directory.exists()


def test_a_usable_cache_dir_is_used(tmp_path):
    codegen = CpuCodegen(cache_dir=tmp_path)
    assert codegen.directory() == tmp_path / "cpu"
