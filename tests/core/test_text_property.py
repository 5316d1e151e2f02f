"""Property: any graph the IR can hold prints, parses back and prints identically, and
keeps its structural hash (200 random graphs; 10,000 with ``--fuzz``)."""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchloom.ir import DTYPES, Graph, InputRef, ScalarType, TensorType, parse_graph, print_graph
from torchloom.ir import structural_hash

DIMS = st.one_of(st.integers(0, 64), st.sampled_from(["s0", "s1", "2*s0", "s0 + 1", None]))
DEVICES = st.sampled_from(["cpu", "cuda:0", "cuda:1", "meta"])


@st.composite
def tensor_types(draw):
    shape = draw(st.lists(DIMS, max_size=4))
    strides = draw(st.none() | st.lists(st.integers(0, 512), min_size=len(shape),
                                        max_size=len(shape)))
    return TensorType.make(shape, draw(st.sampled_from(sorted(DTYPES))), draw(DEVICES), strides)


TYPES = st.one_of(tensor_types(), st.sampled_from(
    [ScalarType(k) for k in ("int", "float", "bool", "str", "none", "any")]))

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-2 ** 63, 2 ** 63 - 1),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from([torch.float16, torch.bool, torch.strided, torch.channels_last,
                     torch.preserve_format, torch.device("cpu"), torch.device("cuda", 2)]))


def attr_values(inputs: int):
    leaves = SCALARS if inputs == 0 else st.one_of(SCALARS, st.integers(0, inputs - 1).map(InputRef))
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=3).map(tuple), max_leaves=6)


NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)
OPS = st.sampled_from(["aten.add.Tensor", "aten.native_layer_norm.default", "my.op",
                       "torchloom.constant", "python.operator.getitem"])


@st.composite
def graphs(draw, depth: int = 0, input_types=None):
    g = Graph(draw(NAMES | st.text(min_size=1, max_size=6)))
    types = input_types if input_types is not None else draw(st.lists(TYPES, max_size=3))
    values = [g.add_input(t, draw(NAMES)) for t in types]
    for _ in range(draw(st.integers(0, 4))):
        inputs = draw(st.lists(st.sampled_from(values), max_size=3)) if values else []
        keys = draw(st.lists(NAMES, max_size=3, unique=True))
        attrs = {k: draw(attr_values(len(inputs))) for k in keys}
        region = None
        if depth < 1 and draw(st.booleans()):
            region = draw(graphs(depth + 1, [v.type for v in inputs]))
            out_types = [v.type for v in region.outputs]
        else:
            out_types = draw(st.lists(TYPES, max_size=3))
        names = [draw(NAMES) for _ in out_types]
        node = g.create(draw(OPS), inputs, out_types, attrs, names=names, region=region)
        values.extend(node.outputs)
    if values:
        g.set_outputs(draw(st.lists(st.sampled_from(values), max_size=3)))
    return g


def test_random_graphs_round_trip_exactly(fuzz):
    @settings(max_examples=10_000 if fuzz else 200, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(graphs())
    def check(g):
        text = print_graph(g)
        back = parse_graph(text)
        assert print_graph(back) == text
        assert structural_hash(back) == structural_hash(g)
        for a, b in zip(g.walk(), back.walk()):
            assert a.op == b.op and len(a.outputs) == len(b.outputs)
            for key, value in a.attrs.items():
                assert _same(b.attrs[key], value), key

    check()


def _same(a, b) -> bool:
    if isinstance(b, float) and math.isnan(b):
        return isinstance(a, float) and math.isnan(a)
    if isinstance(b, tuple):
        return isinstance(a, tuple) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(b, float):  # -0.0 keeps its sign
        return type(a) is float and a == b and math.copysign(1, a) == math.copysign(1, b)
    return type(a) is type(b) and a == b
