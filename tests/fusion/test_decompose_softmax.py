"""Softmax over the last dim on the CPU decomposes as eager's kernel computes it:
``exp(x - max) * (1 / sum)`` (``_vec_softmax_lastdim``), not torch's ``exp / sum``; other
dims and other devices keep the division. Checked on the IR, and end to end against
eager on the C codegen: ordinary rows, rows with -inf, +inf and NaN, all -inf rows, and
every float dtype."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusion_testing import run_passes
from torchloom.api import parse_graph
from torchloom.backend import torchloom_backend
from torchloom.tools import Compiler
from torchloom_fusion.decompose import Decompose


def _decomposed_ops(text: str, registry) -> list[str]:
    graph = parse_graph(text)
    run_passes(graph, [Decompose()], registry)
    return [n.op for n in graph.nodes]


@pytest.mark.parametrize("dim, device, reciprocal", [
    (-1, "", True), (2, "", True), (1, "", False), (-1, " @cuda:0", False)])
def test_only_last_dim_cpu_softmax_multiplies_by_the_reciprocal(registry, dim, device,
                                                                 reciprocal):
    t = f"f32[4, 5, 16]{device}"
    text = f"""graph @g(%x: {t}) {{
      %y = aten._softmax.default(%x) {{dim = {dim}, half_to_float = false}} : {t}
      return %y
    }}"""
    ops = _decomposed_ops(text, registry)
    assert "aten._softmax.default" not in ops  # decomposed
    assert ("aten.reciprocal.default" in ops) == reciprocal
    assert ("aten.div.Tensor" in ops) == (not reciprocal)


def test_bf16_softmax_takes_the_reciprocal_in_f32(registry):
    text = """graph @g(%x: bf16[4, 16]) {
      %y = aten._softmax.default(%x) {dim = -1, half_to_float = false} : bf16[4, 16]
      return %y
    }"""
    graph = parse_graph(text)
    run_passes(graph, [Decompose()], registry)
    (rcp,) = [n for n in graph.nodes if n.op == "aten.reciprocal.default"]
    assert rcp.output.type.dtype == "f32"


def _compiled(fn, tmp_path):
    comp = Compiler("default", cache_dir=tmp_path, compile_cache=False, strict=True)
    torch._dynamo.reset()
    return torch.compile(fn, backend=lambda gm, ex: torchloom_backend(
        gm, ex, options={"compiler": comp})), comp


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        # the f16 cases check the cpu kernels, also with a compiler whose f16 conversions do
        # not vectorize (there the cpu codegen leaves f16 groups to eager by default)
        mp.setenv("TORCHLOOM_CPU_F16", "compile")
        yield tmp_path_factory.mktemp("softmax")
    torch._dynamo.reset()


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 9), cols=st.integers(1, 300),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]),
       scale=st.sampled_from([0.1, 4.0, 80.0]),
       specials=st.lists(st.tuples(st.integers(0, 10 ** 6),
                                   st.sampled_from([float("-inf"), float("inf"), float("nan"),
                                                    -0.0, 1e-40])), max_size=4),
       dead_row=st.booleans())
def test_softmax_matches_eager(cache, rows, cols, dtype, scale, specials, dead_row):
    fn, comp = _compiled(lambda x: torch.softmax(x, -1), cache)
    torch.manual_seed(rows * 1000 + cols)
    x = (torch.randn(rows, cols, dtype=torch.float64) * scale).to(dtype)
    flat = x.view(-1)
    for pos, value in specials:
        flat[pos % flat.numel()] = value
    if dead_row:
        x[0] = float("-inf")  # every element -inf: NaN, as eager
    expected = torch.softmax(x, -1)
    actual = fn(x)
    torch.testing.assert_close(actual, expected, equal_nan=True)
    assert torch.equal(actual.isnan(), expected.isnan())
    (compilation,) = comp.compilations  # (it ran compiled, not as Dynamo's fallback)
    assert [c.codegen for c in compilation.compiled.choices] == ["cpu"]


@pytest.mark.parametrize("device, as_eager_cpu", [("", True), (" @cuda:0", False)])
def test_cpu_softmax_backward_is_y_times_g_minus_sum(registry, device, as_eager_cpu):
    """Eager's CPU softmax backward computes ``y * (g - sum(g * y))``; the decomposition's
    ``g * y - y * sum(g * y)`` gives +0.0 where eager gives -0.0 (a masked element whose
    ``g - sum`` is negative): on the CPU the former (CUDA keeps the decomposition's)."""
    t = f"f32[4, 16]{device}"
    text = f"""graph @g(%g: {t}, %y: {t}) {{
      %d = aten._softmax_backward_data.default(%g, %y) {{dim = -1, input_dtype = #f32}} : {t}
      return %d
    }}"""
    graph = parse_graph(text)
    run_passes(graph, [Decompose()], registry)
    last = graph.outputs[0].producer
    assert "aten._softmax_backward_data.default" not in [n.op for n in graph.nodes]
    assert (last.op == "aten.mul.Tensor" and last.inputs[0] is graph.inputs[1] and
            last.inputs[1].producer.op == "aten.sub.Tensor") == as_eager_cpu


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(shape=st.sampled_from([(1, 1), (3, 1), (2, 5), (2, 3, 17), (1, 4, 64), (5, 2, 2, 9)]),
       dim=st.integers(-1, 0),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
       dead=st.lists(st.integers(0, 50), max_size=3),
       specials=st.lists(st.tuples(st.integers(0, 10 ** 6),
                                   st.sampled_from([float("inf"), float("nan"), -0.0])),
                         max_size=2))
def test_safe_softmax_matches_eager_in_one_group(cache, shape, dim, dtype, dead, specials):
    """SDPA's math path (training on the CPU, GPT-2's attention with dropout) calls
    ``_safe_softmax``: softmax with rows of -inf made 0. It decomposes into one group (no
    tensor of zeros made outside it) and matches eager, dead rows and specials included."""
    fn, comp = _compiled(lambda x: torch.ops.aten._safe_softmax(x, dim), cache)
    x = torch.randn(shape, dtype=torch.float64).to(dtype)
    rows = x.movedim(dim, -1).reshape(-1, shape[dim])
    for r in dead:
        rows[r % rows.shape[0]] = float("-inf")
    x = rows.reshape(x.movedim(dim, -1).shape).movedim(-1, dim).contiguous()
    flat = x.view(-1)
    for pos, value in specials:
        flat[pos % flat.numel()] = value
    expected = torch.ops.aten._safe_softmax(x, dim)
    actual = fn(x)
    torch.testing.assert_close(actual, expected, equal_nan=True)
    (compilation,) = comp.compilations
    assert [c.codegen for c in compilation.compiled.choices] == ["cpu"]
    assert "aten._safe_softmax.default" not in [n.op for n in compilation.graph.nodes]
