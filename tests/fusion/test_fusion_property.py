"""Property test of the whole fusion pipeline on random DAGs.

Random graphs of pointwise (with broadcasting), reduction, view and opaque ops, over
varied shapes and dtypes, go through decompose, functionalize, the vertical/horizontal
fixpoint and merge-groups with random limits. Afterwards the graph verifies (after every
pass), every group respects the limits, the result equals running the original graph
op by op, and fusing again gives the same graph. 300 examples normally; 10,000 with
``--fuzz``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion_testing import fusion_pipeline, groups, plugin_registry, run_graph, run_passes
from torchloom.api import Graph, TensorType, clone_graph, print_graph

UNARY = ["aten.exp.default", "aten.neg.default", "aten.tanh.default", "aten.sigmoid.default",
         "aten.abs.default", "aten.relu.default", "aten.sin.default"]
BINARY = ["aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor", "aten.maximum.default"]
REDUCTIONS = [("aten.sum.dim_IntList", {}), ("aten.amax.default", {}),
              ("aten.mean.dim", {}), ("aten.amin.default", {})]


def _make(graph: Graph, env: dict, op: str, inputs: list, attrs: dict | None = None):
    """Add one node, computing its value eagerly to learn its type (and check it runs)."""
    opdef = plugin_registry().get(op)
    args, kwargs = opdef.bind([env[v] for v in inputs], attrs or {})
    result = opdef.fn(*args, **kwargs)
    node = graph.create(op, inputs, [TensorType.of(result)], attrs or {})
    env[node.output] = result
    return node.output


def _build(data) -> tuple[Graph, list]:
    rows = data.draw(st.sampled_from([1, 2, 3, 5]), label="rows")
    cols = data.draw(st.sampled_from([1, 4, 6]), label="cols")
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64]), label="dtype")
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    graph = Graph("random")
    env: dict = {}
    inputs = []
    for i, shape in enumerate([(rows, cols), (rows, 1), (cols,), (rows, cols)]
                              [:data.draw(st.integers(1, 4), label="n_inputs")]):
        v = graph.add_input(TensorType.make(shape, dtype), f"x{i}")
        env[v] = torch.randn(shape, generator=gen, dtype=dtype)
        inputs.append(env[v])
    pool = list(graph.inputs)
    for _ in range(data.draw(st.integers(1, 14), label="n_ops")):
        kind = data.draw(st.sampled_from(["unary", "binary", "binary", "reduce", "view",
                                          "opaque", "cast"]))
        x = data.draw(st.sampled_from(pool))
        shape = tuple(x.type.shape)
        if kind == "unary":
            pool.append(_make(graph, env, data.draw(st.sampled_from(UNARY)), [x]))
        elif kind == "binary":
            y = data.draw(st.sampled_from(pool))
            try:
                torch.broadcast_shapes(shape, tuple(y.type.shape))
            except RuntimeError:
                continue
            if x.type.dtype != y.type.dtype:
                continue
            pool.append(_make(graph, env, data.draw(st.sampled_from(BINARY)), [x, y]))
        elif kind == "reduce" and len(shape) >= 1:
            op, _ = data.draw(st.sampled_from(REDUCTIONS))
            dim = data.draw(st.sampled_from([-1, 0]))
            if op == "aten.mean.dim" and x.type.dtype not in ("f32", "f64"):
                continue
            pool.append(_make(graph, env, op, [x], {"dim": (dim,), "keepdim": True}))
        elif kind == "view" and len(shape) == 2:
            which = data.draw(st.sampled_from(["t", "view", "unsqueeze", "expand"]))
            if which == "t":
                pool.append(_make(graph, env, "aten.t.default", [x]))
            elif which == "view" and x.type.strides is None:
                flat = _make(graph, env, "aten.view.default", [x], {"size": (shape[0] * shape[1],)})
                pool.append(_make(graph, env, "aten.view.default", [flat], {"size": shape}))
            elif which == "unsqueeze":
                u = _make(graph, env, "aten.unsqueeze.default", [x], {"dim": 0})
                pool.append(_make(graph, env, "aten.sum.dim_IntList", [u],
                                  {"dim": (0,), "keepdim": False}))
            elif which == "expand" and shape[1] == 1:
                pool.append(_make(graph, env, "aten.expand.default", [x],
                                  {"size": (shape[0], cols)}))
        elif kind == "opaque" and len(shape) == 2:
            if data.draw(st.booleans()):
                pool.append(_make(graph, env, "aten.cumsum.default", [x], {"dim": 1}))
            else:
                t = _make(graph, env, "aten.t.default", [x])
                pool.append(_make(graph, env, "aten.mm.default", [x, t]))
        elif kind == "cast":
            other = torch.float64 if x.type.dtype == "f32" else torch.float32
            c = _make(graph, env, "aten._to_copy.default", [x], {"dtype": other})
            pool.append(_make(graph, env, "aten._to_copy.default", [c],
                              {"dtype": x.type.torch_dtype}))
    produced = [v for v in pool if v.producer is not None] or pool[:1]
    extra = data.draw(st.lists(st.sampled_from(produced), max_size=3, unique=True))
    graph.set_outputs(list(dict.fromkeys([produced[-1], *extra])))
    return graph, inputs


def _check(data) -> None:
    registry = plugin_registry()
    graph, inputs = _build(data)
    limits = {"max_group_inputs": data.draw(st.sampled_from([1, 2, 3, 128]), label="max_in"),
              "max_group_outputs": data.draw(st.sampled_from([1, 2, 64]), label="max_out")}
    original = clone_graph(graph)[0]
    run_passes(graph, fusion_pipeline(**limits), registry)  # verifies after every pass
    for g in groups(graph):
        assert len(g.inputs) <= limits["max_group_inputs"]
        assert len(g.outputs) <= limits["max_group_outputs"]
        assert len(g.region) >= 1
    expected = run_graph(original, registry, inputs)
    actual = run_graph(graph, registry, inputs)
    for e, a in zip(expected, actual, strict=True):
        torch.testing.assert_close(a, e, equal_nan=True)
    again = clone_graph(original)[0]
    run_passes(again, fusion_pipeline(**limits), registry)
    assert print_graph(again) == print_graph(graph)


_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(max_examples=300, **_SETTINGS)
@given(st.data())
def _property_300(data):
    _check(data)


@settings(max_examples=10_000, **_SETTINGS)
@given(st.data())
def _property_fuzz(data):
    _check(data)


@pytest.mark.slow
def test_random_graphs_fuse_correctly(fuzz):
    """300 random graphs (10,000 with --fuzz): verify, limits, numerics, determinism."""
    (_property_fuzz if fuzz else _property_300)()
