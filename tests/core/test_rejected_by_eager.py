"""``rejected_by_eager``: a codegen declines a group where eager's kernel raises for one of
its ops at these dtypes (a negative power of an integer, ``abs`` of a bool), so that the
compiled graph raises as eager does instead of computing something; every codegen asks
it (cpu, triton, a renderer's)."""

from __future__ import annotations

import pytest

from torchloom.api import parse_graph, rejected_by_eager
from torchloom.tools import load_plugins


def _group(call: str, dtype: str):
    """A group of one op ``call`` (its name and attributes) over an ``dtype[8]`` input."""
    text = f"""graph @g(%a: {dtype}[8]) {{
  %o = torchloom.fusion_group(%a) : {dtype}[8] region @k(%x: {dtype}[8]) {{
    %t = {call} : {dtype}[8]
    return %t
  }}
  return %o
}}
"""
    return next(parse_graph(text).nodes)


@pytest.fixture(scope="module")
def registry():
    return load_plugins().registry


@pytest.mark.parametrize("call, dtype, why", [
    ("aten.pow.Tensor_Scalar(%x) {exponent = -1}", "i64", "Integers to negative integer powers"),
    ("aten.pow.Tensor_Scalar(%x) {exponent = -2}", "i32", "Integers to negative integer powers"),
    ("aten.abs.default(%x)", "b8", "Bool"),
])
def test_a_group_eager_raises_for_is_declined_with_eager_s_error(registry, call, dtype, why):
    reason = rejected_by_eager("mine", _group(call, dtype), registry)
    assert reason is not None and reason.codegen == "mine"
    assert why in reason.message and "eager runs the group and raises it" in reason.message


@pytest.mark.parametrize("call, dtype", [
    ("aten.pow.Tensor_Scalar(%x) {exponent = 2}", "i64"),
    ("aten.pow.Tensor_Scalar(%x) {exponent = -1}", "f32"),
    ("aten.abs.default(%x)", "i32"),
])
def test_a_group_eager_takes_is_not(registry, call, dtype):
    assert rejected_by_eager("mine", _group(call, dtype), registry) is None
