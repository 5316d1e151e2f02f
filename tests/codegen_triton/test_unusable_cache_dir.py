"""A kernel directory the triton codegen cannot write (here a regular file where the cache
directory should be) costs the on-disk copy, not the kernel: sources go to a temporary
directory for the process, with one warning, and the group still runs on triton."""

from __future__ import annotations

import logging
import tempfile

import torch

from conftest import Checker, group_text
from torchloom_codegen_triton import TritonCodegen

GROUP = group_text("%a: f32[4, 8], %b: f32[4, 8]", """
    %s = aten.add.Tensor(%a, %b) : f32[4, 8]
    %e = aten.exp.default(%s) : f32[4, 8]""", "%e: f32[4, 8]")
OTHER = GROUP.replace("aten.exp.default", "aten.sin.default")


def test_a_file_in_place_of_the_cache_dir_still_compiles_on_triton(registry, tmp_path,
                                                                     monkeypatch, caplog):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    (tmp_path / "cache").write_text("not a directory")
    caplog.set_level(logging.WARNING, logger="torchloom")
    codegen = TritonCodegen(cache_dir=tmp_path / "cache", autotune=False)
    check = Checker(registry, codegen)
    for text in (GROUP, OTHER):  # two kernels, one warning
        check(text, torch.randn(4, 8), torch.randn(4, 8))
    assert codegen.scratch_dir.parent == tmp_path / "tmp"
    assert len(list(codegen.scratch_dir.glob("k*.py"))) == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [f"torchloom: triton kernel directory {tmp_path / 'cache' / 'triton'} "
                        f"is unusable (Not a directory); kernel sources go to "
                        f"{codegen.scratch_dir} for this process"]
    assert (tmp_path / "cache").read_text() == "not a directory"
