"""The views issue's must-show workloads through ``explain`` (default pipeline, eager
codegen, CPU): one kernel each, no copy kernels, equal to eager; and output aliasing and
strides exactly as eager gives them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from torchloom.api import FUSION_GROUP
from torchloom.tools import count_kernels
from torchloom.report.explain import explain

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["gelu_bookend", "transpose_bookend", "three_view_a",
                                  "three_view_b", "three_view_c"])
def test_view_workload_is_one_kernel(eager_default, name):
    result = explain(ROOT / "examples" / f"{name}.py", pipeline=eager_default)
    data = result.data
    assert data["kernels"] == 1 and data["fusion_groups"] == 1
    assert not data["fallbacks"]
    assert data["max_abs_error"] <= 1e-5
    graph = result.compiler.compilations[0].graph
    registry = result.compiler.registry
    outside = [n for n in graph.nodes if n.op != FUSION_GROUP]
    # everything outside the single group is a free view: no copy kernels
    assert all(registry.get(n.op).category == "view" for n in outside)
    assert count_kernels(graph, registry) == 1


def test_bookend_views_are_outside_the_group(eager_default):
    result = explain(ROOT / "examples" / "gelu_bookend.py", pipeline=eager_default)
    graph = result.compiler.compilations[0].graph
    group = next(n for n in graph.nodes if n.op == FUSION_GROUP)
    assert [n.op for n in group.region.nodes] == ["aten.gelu.default"]
    assert group.inputs[0].producer.op == "aten.view.default"


def _compile(fn, pipeline):
    torch._dynamo.reset()
    return torch.compile(fn, backend="torchloom", options={"pipeline": pipeline})


@pytest.mark.parametrize("fn", [
    lambda x: x.view(6, 8),
    lambda x: x.t(),
    lambda x: x.transpose(0, 1)[1:],
], ids=["view", "t", "transpose-slice"])
def test_view_of_an_input_aliases_it_like_eager(eager_default, fn):
    x = torch.randn(8, 6)
    expected = fn(x)
    actual = _compile(fn, eager_default)(x)
    torch.testing.assert_close(actual, expected)
    assert actual.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert actual.stride() == expected.stride()
    assert actual.storage_offset() == expected.storage_offset()


@pytest.mark.parametrize("fn", [
    lambda x: (x + 1).view(6, 8),
    lambda x: torch.relu(x.t() * 2).t(),
], ids=["add-view", "transpose-bookends"])
def test_fresh_results_do_not_alias_the_input(eager_default, fn):
    x = torch.randn(8, 6)
    expected = fn(x)
    actual = _compile(fn, eager_default)(x)
    torch.testing.assert_close(actual, expected)
    assert actual.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert actual.shape == expected.shape and actual.stride() == expected.stride()
