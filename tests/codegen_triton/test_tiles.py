"""tiles.py: a pointwise group with an input laid out across the outputs' walk (a
transposed input) runs in [YBLOCK, XBLOCK] tiles, so that both that input's loads and the
stores are contiguous along one axis; on the Triton interpreter against eager, and built
for sm_90."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchloom.api import parse_graph

from conftest import group_text, on_device
from torchloom_codegen_triton import TritonCodegen

TRANSPOSED_ADD = group_text("%x: f32[40, 70], %y: f32[70, 40]", """
    %t = aten.t.default(%x) : f32[70, 40]
    %a = aten.add.Tensor(%t, %y) : f32[70, 40]
    %r = aten.relu.default(%a) : f32[70, 40]""", "%r: f32[70, 40]")


def fmt(shape) -> str:
    return f"f32[{', '.join(map(str, shape))}]"


def permuted_add(shape, dims) -> str:
    """``permute(x, dims) * 2 + y``: x has ``shape``; y and the output the permuted one."""
    out = [shape[d] for d in dims]
    return group_text(f"%x: {fmt(shape)}, %y: {fmt(out)}", f"""
        %p = aten.permute.default(%x) {{dims = {list(dims)}}} : {fmt(out)}
        %m = aten.mul.Tensor(%p) {{other = 2.0}} : {fmt(out)}
        %a = aten.add.Tensor(%m, %y) : {fmt(out)}""", f"%a: {fmt(out)}")


def test_a_transposed_input_is_read_in_tiles(check, registry):
    g = torch.Generator().manual_seed(2)
    _, compiled = check(TRANSPOSED_ADD, torch.randn(40, 70, generator=g),
                        torch.randn(70, 40, generator=g), exact=True)
    kernel = check.codegen.generate(compiled.choices[0].node, registry)
    meta = kernel.metadata
    assert meta["form"] == "tiled pointwise" and meta["tiles"] == {"x": 40, "y": 70,
                                                                   "other": 1}
    config = meta["config"]
    assert meta["grid"] == [-(-70 // config["YBLOCK"]) * -(-40 // config["XBLOCK"])]
    # x moves by one element along the tile's y axis, y and the output along its x axis
    assert "in_x + (xs * 70 + ys" in kernel.source and "in_y + (ys * 40 + xs" in kernel.source
    assert meta["bytes_read"] == meta["bytes_written"] * 2 == 2 * 70 * 40 * 4


def test_inputs_laid_out_like_the_output_keep_the_1d_walk(registry, tmp_path):
    text = group_text("%x: f32[40, 70], %b: f32[70]", """
        %a = aten.add.Tensor(%x, %b) : f32[40, 70]""", "%a: f32[40, 70]")
    meta = TritonCodegen(cache_dir=tmp_path, autotune=False).generate(
        next(parse_graph(text).nodes), registry).metadata
    assert meta["form"] == "pointwise" and "tiles" not in meta


def test_the_tiled_kernel_builds_for_sm90_without_spills(registry, tmp_path):
    codegen = TritonCodegen(cache_dir=tmp_path, autotune=False).for_target("sm_90")
    kernel = codegen.generate(next(on_device(parse_graph(
        permuted_add((768, 128, 64), (0, 2, 1))), "cuda").nodes), registry)
    assert kernel.metadata["form"] == "tiled pointwise"
    assert kernel.metadata["tiles"] == {"x": 128, "y": 64, "other": 768}
    usage = codegen.compile_for_target(kernel)
    assert usage["spills"] == 0 and usage["registers"] > 0


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.lists(st.integers(1, 37), min_size=2, max_size=3), data=st.data())
def test_random_permuted_inputs_match_eager(check, shape, data):
    dims = data.draw(st.sampled_from(list(itertools.permutations(range(len(shape))))))
    g = torch.Generator().manual_seed(sum(shape))
    out = [shape[d] for d in dims]
    check(permuted_add(shape, dims), torch.randn(*shape, generator=g),
          torch.randn(*out, generator=g), exact=True)


@pytest.mark.parametrize("shape,dims", [((17, 33, 20), (2, 1, 0)), ((3, 40, 19), (0, 2, 1))])
def test_tiles_with_other_dims_match_eager(check, registry, shape, dims):
    g = torch.Generator().manual_seed(4)
    out = [shape[d] for d in dims]
    _, compiled = check(permuted_add(shape, dims), torch.randn(*shape, generator=g),
                        torch.randn(*out, generator=g), exact=True)
    meta = check.codegen.generate(compiled.choices[0].node, registry).metadata
    assert meta["form"] == "tiled pointwise"
