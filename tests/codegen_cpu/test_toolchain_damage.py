"""Libraries in the cpu codegen's cache directory that cannot be trusted (issue #40): one
that is a symlink leading outside the directory is rejected as kernel and graph entries
are, reported once as damaged and rebuilt; a library whose bytes do not match its digest
is reported once, however many times it is looked at before it is rebuilt."""

from __future__ import annotations

import json
import logging
import shutil

import torch
from torchloom.api import parse_graph
from torchloom.tools import EagerCodegen
from torchloom.runtime.executor import CompiledGraph

from conftest import group_text
from torchloom_codegen_cpu import CpuCodegen
from torchloom_codegen_cpu.toolchain import build, cached_library, probe

TEXT = group_text("%a: f32[8, 16]", """
    %e = aten.exp.default(%a) : f32[8, 16]
    %y = aten.mul.Tensor(%e, %a) : f32[8, 16]""", "%y: f32[8, 16]")


def _library(registry, cache_dir):
    """The library loading TEXT's kernel builds, built (not loaded) into ``cache_dir``."""
    codegen = CpuCodegen(cache_dir=cache_dir)
    kernel = codegen.generate(next(parse_graph(TEXT).nodes), registry)
    return build(codegen.translation_unit([kernel]), codegen.toolchain(), codegen.cache_dir, 60)


def _run_fresh(registry, cache_dir) -> str:
    """The codegen a fresh cpu codegen ran TEXT's group on, checked against eager."""
    compiled = CompiledGraph(parse_graph(TEXT), registry, [CpuCodegen(cache_dir=cache_dir),
                                                           EagerCodegen()])
    a = torch.randn(8, 16)
    (y,) = compiled(a)
    torch.testing.assert_close(y, torch.exp(a) * a)
    return compiled.choices[0].codegen


def _damage_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "cached library" in r.getMessage()]


def test_a_library_symlinked_outside_the_cache_is_rejected_and_rebuilt(registry, tmp_path,
                                                                     caplog):
    path = _library(registry, tmp_path / "cache")
    outside = tmp_path / "elsewhere" / "lib.so"
    outside.parent.mkdir()
    shutil.copy(path, outside)  # the same bytes: its digest beside the link still matches
    path.unlink()
    path.symlink_to(outside)
    assert not cached_library(path)
    caplog.clear()
    caplog.set_level(logging.WARNING)
    assert _run_fresh(registry, tmp_path / "cache") == "cpu"
    assert not path.is_symlink() and cached_library(path)  # rebuilt in place of the link
    assert outside.read_bytes() != b"" and outside.exists()
    warnings = _damage_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert str(path) in warnings[0] and "leads outside the cache directory" in warnings[0]


def test_a_digest_symlinked_outside_the_cache_is_rejected(registry, tmp_path, caplog):
    path = _library(registry, tmp_path / "cache")
    sidecar = path.with_name(path.name + ".sha256")
    outside = tmp_path / "digest"
    shutil.copy(sidecar, outside)
    sidecar.unlink()
    sidecar.symlink_to(outside)
    caplog.set_level(logging.WARNING)
    assert not cached_library(path)
    assert "leads outside the cache directory" in caplog.text


def test_a_library_linked_inside_the_cache_is_used(registry, tmp_path):
    path = _library(registry, tmp_path / "cache")
    inside = path.with_name("kept.so")
    path.rename(inside)
    path.symlink_to(inside.name)
    assert cached_library(path)


def test_a_checksum_mismatch_is_reported_once(registry, tmp_path, caplog):
    path = _library(registry, tmp_path / "cache")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    caplog.clear()
    caplog.set_level(logging.WARNING)
    assert _run_fresh(registry, tmp_path / "cache") == "cpu"
    assert cached_library(path)
    warnings = _damage_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert str(path) in warnings[0] and "does not match its checksum" in warnings[0]


def test_a_toolchain_record_symlinked_outside_the_cache_is_probed_again(registry, tmp_path):
    codegen = CpuCodegen(cache_dir=tmp_path / "cache")
    real = codegen.toolchain()
    (record,) = codegen.cache_dir.glob("toolchain-*.json")
    forged = tmp_path / "elsewhere.json"
    forged.write_text(record.read_text().replace(json.dumps(real.version),
                                                 json.dumps("forged 0.1")))
    record.unlink()
    record.symlink_to(forged)
    again = probe(real.cc, codegen.cache_dir, 60)
    assert again.version == real.version != "forged 0.1"
    assert not record.is_symlink() and "forged" not in record.read_text()
    assert "forged 0.1" in forged.read_text()
