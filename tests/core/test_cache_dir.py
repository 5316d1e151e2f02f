"""Where the caches live: $TORCHLOOM_CACHE_DIR, else $XDG_CACHE_HOME/torchloom (when
absolute, as the XDG spec says), else ~/.cache/torchloom; the codegens' caches follow."""

from __future__ import annotations

from pathlib import Path

from torchloom.compiler import Compiler
from torchloom.environment import default_cache_dir


def test_cache_dir_order(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHLOOM_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "torchloom"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: ignored
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "torchloom"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "torchloom"
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"


def test_the_compiler_and_codegens_use_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHLOOM_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    compiler = Compiler("none")
    assert compiler.cache_dir == tmp_path / "xdg" / "torchloom"
    from torchloom_codegen_cpu import CpuCodegen
    from torchloom_codegen_triton import TritonCodegen
    for cg in (CpuCodegen(), TritonCodegen()):
        assert Path(cg.cache_dir).is_relative_to(tmp_path / "xdg" / "torchloom")
