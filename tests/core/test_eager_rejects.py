"""Calls eager rejects for their dtypes (``ops.registry.eager_rejects``): fake tensors take
``abs`` of bool or ``softmax`` of int64, so such graphs reach the compiler; the cpu codegen
declines those groups and ``fusion.decompose`` keeps such composites, so eager runs them
and raises its own error, as eager and ``aot_eager`` do (found by a hostile tester)."""

from __future__ import annotations

import pytest
import torch
from torchloom.api import eager_rejects, parse_graph
from torchloom.tools import load_plugins


@pytest.fixture(scope="module")
def registry():
    return load_plugins().registry


def node_of(text: str):
    return next(parse_graph(text).nodes)


def one_op(op: str, inputs: str, attrs: str, out: str) -> str:
    """A graph of one ``op`` call; ``inputs``: the input types, separated by ``;``."""
    types = [t.strip() for t in inputs.split(";")]
    args = ", ".join(f"%{chr(97 + i)}" for i in range(len(types)))
    params = ", ".join(f"%{chr(97 + i)}: {t}" for i, t in enumerate(types))
    return (f"graph @g({params}) {{\n  %r = {op}({args}){attrs} : {out}\n  return %r\n}}\n")


REJECTED = [
    ("aten.abs.default", "b8[2, 3]", "", "b8[2, 3]", "not implemented for 'Bool'"),
    ("aten.relu.default", "b8[4]", "", "b8[4]", "Boolean inputs not supported"),
    ("aten.argmax.default", "b8[2, 3]", " {dim = -1}", "i64[2]", "does not support bool"),
    ("aten._softmax.default", "i64[2, 3]", " {dim = -1, half_to_float = false}", "i64[2, 3]",
     "not implemented for 'Long'"),
    ("aten.var.correction", "i64[2, 3]", " {correction = 1, dim = [-1]}", "i64[2]",
     "only support floating point"),
    ("aten.pow.Tensor_Scalar", "i64[5]", " {exponent = -1}", "i64[5]", "negative integer"),
]
ACCEPTED = [
    ("aten.abs.default", "i32[2, 3]", "", "i32[2, 3]"),
    ("aten.relu.default", "f16[4]", "", "f16[4]"),
    ("aten._softmax.default", "bf16[2, 3]", " {dim = -1, half_to_float = false}", "bf16[2, 3]"),
    ("aten.add.Tensor", "i64[2, 3]; f32[3]", "", "f32[2, 3]"),
    ("aten.pow.Tensor_Scalar", "i64[5]", " {exponent = 2}", "i64[5]"),
    # fails on one element whatever the dtype: says nothing of dtypes
    ("aten.view.default", "f32[2, 3]", " {size = [6]}", "f32[6]"),
]


@pytest.mark.parametrize("op, inputs, attrs, out, words", REJECTED)
def test_calls_eager_rejects_are_named_with_eagers_words(registry, op, inputs, attrs, out,
                                                         words):
    node = node_of(one_op(op, inputs, attrs, out))
    assert words in (eager_rejects(registry.get(op), node) or "")
    assert eager_rejects(registry.get(op), node) == eager_rejects(registry.get(op), node)


@pytest.mark.parametrize("op, inputs, attrs, out", ACCEPTED)
def test_calls_eager_takes_are_not(registry, op, inputs, attrs, out):
    assert eager_rejects(registry.get(op), node_of(one_op(op, inputs, attrs, out))) is None


def test_not_asked_of_other_devices(registry):
    text = one_op("aten.abs.default", "b8[2] @cuda:0", "", "b8[2] @cuda:0")
    assert eager_rejects(registry.get("aten.abs.default"), node_of(text)) is None


def test_inside_a_fake_mode_the_kernels_are_still_real(registry):
    """torch.compile calls backends with fake and tracing modes around them."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    node = node_of(one_op("aten.abs.default", "b8[3]", "", "b8[3]"))
    registry = load_plugins().registry  # an empty memo
    with FakeTensorMode():
        assert "Bool" in eager_rejects(registry.get("aten.abs.default"), node)


CASES = {
    "argmax_bool": (lambda x: x.argmax(-1), lambda: torch.tensor([[3, -1, 2]]) > 0),
    "abs_bool": (torch.abs, lambda: torch.tensor([[3, -1, 2]]) > 0),
    "relu_bool_then_more": (lambda x: torch.relu(x) & x, lambda: torch.tensor([1, 0]) > 0),
    "softmax_int64": (lambda x: torch.softmax(x * 2, -1), lambda: torch.tensor([[3, -1, 2]])),
    "log_softmax_int64": (lambda x: torch.log_softmax(x, -1), lambda: torch.tensor([[3, 1]])),
    "var_int64": (lambda x: (x + 1).var(-1), lambda: torch.tensor([[3, -1, 2]])),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_graphs_raise_eagers_error(tmp_path, name):
    from torchloom.backend import torchloom_backend
    from torchloom.tools import Compiler
    fn, make = CASES[name]
    with pytest.raises(Exception) as eager:
        fn(make())
    compiler = Compiler("default", cache_dir=tmp_path, compile_cache=False)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": compiler}))
    with pytest.raises(type(eager.value)) as ours:
        compiled(make())
    assert str(eager.value).split("\n")[0] in str(ours.value)


def test_the_probe_warns_nothing(tmp_path, capfd):
    """var of one element warns (degrees of freedom, from C++ to stderr); eager's run of the
    program does not, so neither may its compilation (found by a second hostile tester)."""
    import warnings
    from torchloom.backend import torchloom_backend
    from torchloom.tools import Compiler
    compiler = Compiler("default", cache_dir=tmp_path, compile_cache=False)
    torch._dynamo.reset()
    fn = torch.compile(lambda x: x.var(-1) * 2 + x.std(-1), backend=lambda gm, ex:
                       torchloom_backend(gm, ex, options={"compiler": compiler}))
    x = torch.randn(4, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(fn(x), x.var(-1) * 2 + x.std(-1))
    assert not [w for w in caught if "degrees of freedom" in str(w.message)], caught
    assert "degrees of freedom" not in capfd.readouterr().err
