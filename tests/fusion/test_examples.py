"""The issue's must-show counts on the example workloads, through ``torchloom explain``
with the default pipeline on the eager codegen (CPU); numerics forward and backward."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchloom.api import FUSION_GROUP
from torchloom.tools import count_kernels
from torchloom.report.explain import explain

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
#: explain's max_abs_error bound: assert_close's float32 atol
TOLERANCE = 1e-5


def _explain(name: str, pipeline: str):
    result = explain(EXAMPLES / f"{name}.py", pipeline=pipeline)
    assert not result.data["fallbacks"], result.data["fallbacks"]
    assert result.data["max_abs_error"] <= TOLERANCE
    forward = result.compiler.compilations[0]
    return result, forward.graph, result.compiler.registry


def _outside_ops(graph, registry) -> list[tuple[str, str]]:
    """(op, category) of every node outside fusion groups."""
    return [(n.op, registry.get(n.op).category) for n in graph.nodes if n.op != FUSION_GROUP]


def _groups(graph) -> list:
    return [n for n in graph.nodes if n.op == FUSION_GROUP]


@pytest.mark.slow
def test_gelu_is_one_group_through_the_cli(eager_default):
    out = subprocess.run([sys.executable, "-m", "torchloom", "explain",
                          str(EXAMPLES / "gelu.py"), "--pipeline", eager_default, "--json"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["fusion_groups"] == 1 and data["kernels"] == 1
    assert data["max_abs_error"] <= TOLERANCE


@pytest.mark.parametrize("name", ["layer_norm", "softmax"])
def test_normalization_forward_is_one_group(eager_default, name):
    result, forward, registry = _explain(name, eager_default)
    assert result.data["backward"] is True
    assert len(_groups(forward)) == 1
    assert count_kernels(forward, registry) == 1
    assert all(cat == "view" for _, cat in _outside_ops(forward, registry))


def test_lstm_cell_everything_after_the_matmuls_is_one_group(eager_default):
    result, forward, registry = _explain("lstm_cell", eager_default)
    assert result.data["backward"] is True
    assert len(_groups(forward)) == 1
    assert count_kernels(forward, registry) <= 3
    outside = _outside_ops(forward, registry)
    assert [op for op, cat in outside if cat != "view"] == ["aten.mm.default"] * 2
    inside = {n.op for n in _groups(forward)[0].region.nodes}
    assert {"aten.sigmoid.default", "aten.tanh.default", "aten.split.Tensor",
            "aten.add.Tensor", "aten.mul.Tensor"} <= inside


def test_bias_gelu_is_one_group_beside_the_matmul(eager_default):
    result, forward, registry = _explain("bias_gelu", eager_default)
    assert result.data["backward"] is True
    (group,) = _groups(forward)
    assert {n.op for n in group.region.nodes} == {"aten.add.Tensor", "aten.gelu.default"}
    assert [op for op, cat in _outside_ops(forward, registry) if cat != "view"] == \
        ["aten.mm.default"]
    assert count_kernels(forward, registry) == 2


def test_transformer_block_leaves_no_pointwise_op_outside_a_group(eager_default):
    result, _, registry = _explain("transformer_block", eager_default)
    assert result.data["backward"] is True and result.data["graphs"] == 2
    for comp in result.compiler.compilations:
        outside = _outside_ops(comp.graph, registry)
        assert not [op for op, cat in outside if cat in ("pointwise", "reduction")], outside
        assert not [op for op, _ in outside if "layer_norm" in op or "softmax" in op]
    assert result.data["fusion_groups"] >= 8
