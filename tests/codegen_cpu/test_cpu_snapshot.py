"""Generated-source snapshots: the C source of a few kernels, compared with checked-in
files. After an intended codegen change, regenerate them with
``TORCHLOOM_UPDATE_SNAPSHOTS=1 pytest tests/codegen_cpu/test_cpu_snapshot.py`` and review the
diff like any other code change. A kernel's snapshot holds its function only: the prelude
every translation unit starts with is prelude.py's text, checked once by building it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from torchloom.api import parse_graph

from conftest import group_text
from torchloom_codegen_cpu import ops
from torchloom_codegen_cpu.prelude import prelude
from test_cpu_reduction import CASES as REDUCTIONS

SNAPSHOTS = Path(__file__).parent / "snapshots"

KERNELS = {
    # a pointwise kernel reading through interior views (reshape, transpose, expand)
    "cpu_pointwise_views": group_text("%a: f32[4, 6], %b: f32[24], %c: f32[6]", """
        %v = aten.view.default(%b) {size = [4, 6]} : f32[4, 6]
        %t = aten.t.default(%v) : f32[6, 4]
        %u = aten.transpose.int(%t) {dim0 = 0, dim1 = 1} : f32[4, 6]
        %q = aten.unsqueeze.default(%c) {dim = 0} : f32[1, 6]
        %e = aten.expand.default(%q) {size = [4, 6]} : f32[4, 6]
        %s = aten.add.Tensor(%a, %u) : f32[4, 6]
        %g = aten.gelu.default(%s) : f32[4, 6]
        %m = aten.mul.Tensor(%g, %e) : f32[4, 6]""", "%m: f32[4, 6]"),
    # softmax over long rows: two reductions and the epilogue, rows in parallel
    "cpu_softmax_bf16": REDUCTIONS["softmax_bf16_long_rows_parallel"][0],
    # layer_norm's backward: a row nest and a column nest in one function
    "cpu_layer_norm_backward": REDUCTIONS["layer_norm_backward_rows_and_columns"][0],
}


def _matches_snapshot(name: str, source: str) -> None:
    path = SNAPSHOTS / f"{name}.c"
    if os.environ.get("TORCHLOOM_UPDATE_SNAPSHOTS") == "1":
        path.write_text(source)
    assert path.exists(), f"no snapshot {path}; run with TORCHLOOM_UPDATE_SNAPSHOTS=1"
    assert source == path.read_text(), (
        f"generated source differs from {path}; if intended, regenerate with "
        f"TORCHLOOM_UPDATE_SNAPSHOTS=1 and review the diff")


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_generated_source_matches_snapshot(registry, codegen, name, monkeypatch):
    # the GELU a kernel calls is the form eager's kernel has on this CPU (ops.GELU_FORMS):
    # the snapshots hold the first form, whatever CPU runs them
    monkeypatch.setattr(ops, "eager_gelu_form", lambda dtype: ops.GELU_FORMS[0])
    source = codegen.generate(next(parse_graph(KERNELS[name]).nodes), registry).source
    head = prelude()
    assert source.startswith(head + "\n")  # every kernel's translation unit starts so
    _matches_snapshot(name, source[len(head) + 1:])


def test_prelude_builds_on_its_own(codegen):
    """The prelude (its text is prelude.py's, so it has no snapshot) builds alone, with the
    toolchain's flags and libraries: its declarations and helpers are valid C on their own."""
    from torchloom_codegen_cpu.toolchain import build
    path = build(prelude() + "void tl_prelude_only(void) {}\n", codegen.toolchain(),
                 codegen.cache_dir, codegen.timeout)
    assert path.exists()
