"""2-D tiles for pointwise kernels whose inputs are laid out across the outputs' walk.

A pointwise kernel walks its outputs in their memory order, so an input contiguous along
another dim (a transposed input: ``x.t() + y``) is read with one scalar, strided load per
element. The tiled form iterates over ``[YBLOCK, XBLOCK]`` tiles of two dims instead: ``xs``
along the outputs' innermost dim ``d0``, ``ys`` along the input's innermost dim ``d1``
(the other dims: one coordinate per program). Both the stores and that input's loads are
then contiguous along one axis of the tile, and Triton's layout conversion (through shared
memory on a GPU) turns the tile between them.

With symbolic sizes (variants.py) the tiled form is a variant of its own, which a call
takes when both tile dims reach ``MIN_TILE_DIM``; tile counts come from the call's sizes.

``plan_tiles`` finds ``(d0, d1)`` by probing: the group's outputs are computed at symbolic
coordinates ``p0, p1, ...`` and every load's coordinates say which dim, if any, it reads
with a unit stride.
"""

from __future__ import annotations

from typing import Any

from torchloom.api import expr, indexing, stmt

from torchloom_codegen_triton import lanes
from torchloom_codegen_triton.plan import next_pow2
from torchloom_codegen_triton.protocol import Writer
from torchloom_codegen_triton.tensors import at_point, memory_order, same_shape, tensor_type


#: the shortest dims worth a tile
MIN_TILE_DIM = 16


def plan_tiles(w: Writer) -> tuple[int, int] | None:
    """``(d0, d1)``: the outputs' innermost dim and the dim a large input is contiguous
    along, when they differ; None when every large input follows the outputs' walk."""
    outputs = [tensor_type(v) for v in w.region.outputs]
    shape = tuple(outputs[0].shape)
    if len(shape) < 2 or any(not same_shape(t.shape, shape) for t in outputs):
        return None
    orders = {memory_order(t) for t in outputs}
    if len(orders) != 1:
        return None
    d0 = orders.pop()[-1]
    probe = type(w)(w.group, w.registry, probe=True)
    dims = {expr.Name(f"p{d}"): d for d in range(len(shape))}
    for v, coords in probe.load_coordinates(tuple(dims)):
        t = tensor_type(v)
        if at_point(_elements(t)) * 4 < at_point(w.numel):  # small (broadcast) inputs
            continue  # stay in cache
        unit = [dims[c] for c in _unit_stride(coords, t) if c in dims]
        if d0 in unit or len(unit) != 1:
            continue
        d1 = unit[0]
        if w.symbolic:  # the tiled variant; calls with short dims take the plain one
            return (d0, d1) if w.form == "tiled" else None
        if min(shape[d0], shape[d1]) >= MIN_TILE_DIM:
            return d0, d1
    return None


def _unit_stride(coords, t) -> list[str]:
    """The coordinates of ``coords`` (into tensor ``t``) its address holds with stride 1."""
    strides = t.actual_strides()
    if strides is None:  # contiguous: the last dim that is not 1
        real = [c for c, d in zip(coords, t.shape) if d != 1]
        return real[-1:]
    return [c for c, s, d in zip(coords, strides, t.shape) if d != 1 and s == 1]


def tile_coords(w: Writer, d0: int, d1: int) -> indexing.Coords:
    """Write the tiled form's program and lane coordinates (see the module docstring) to
    ``w``'s emitter; returns the coordinates of the outputs' elements."""
    em = w.em
    s0, s1 = w.ix.size_code(w.shape[d0]), w.ix.size_code(w.shape[d1])
    tx = expr.wrapped(lanes.blocks(s0, "XBLOCK"))
    ty = expr.wrapped(lanes.blocks(s1, "YBLOCK"))
    for name, value in (("pid", lanes.program(0)), ("tx", expr.modulo("pid", tx)),
                       ("ty", expr.modulo(lanes.floor_over("pid", tx), ty)),
                       ("to", lanes.floor_over("pid", lanes.times(tx, ty))),
                       ("xs", lanes.row(lanes.block_lanes("tx", "XBLOCK"))),
                       ("ys", lanes.column(lanes.block_lanes("ty", "YBLOCK"))),
                       ("xmask", lanes.both(lanes.less("xs", s0), lanes.less("ys", s1))),
                       # a [YBLOCK, XBLOCK] block of lanes
                       ("xindex", lanes.plus(lanes.times("ys", "XBLOCK"), "xs"))):
        em.statement(stmt.Assign(name, value), False)
    em.mark_x("xs", "ys")
    other = [d for d in range(len(w.shape)) if d not in (d0, d1)]
    coords: list[expr.Code] = [indexing.ZERO] * len(w.shape)
    coords[d0], coords[d1] = expr.Name("xs"), expr.Name("ys")
    for k, (d, c) in enumerate(zip(other, w.ix.delinear("to", [w.shape[d] for d in other]))):
        if not indexing.is_zero(c):
            em.statement(stmt.Assign(f"o{k}", c), False)
            c = expr.Name(f"o{k}")
        coords[d] = c
    return tuple(coords)


def tiled_metadata(w: Writer, d0: int, d1: int) -> dict[str, Any]:
    """The tiled form's candidate tiles and (static sizes) tile counts; with symbolic
    sizes, the dims ``d0``/``d1`` whose sizes the launcher reads per call."""
    if w.symbolic:
        return {"form": "tiled pointwise", "tile_dims": [d0, d1],
                "configs": tile_configs(2 ** 16, 2 ** 16)}
    s0, s1 = w.shape[d0], w.shape[d1]
    others = w.numel // (s0 * s1)
    return {"form": "tiled pointwise", "tiles": {"x": s0, "y": s1, "other": others},
            "configs": tile_configs(s0, s1)}


def tile_configs(x: int, y: int) -> list[dict[str, int]]:
    """Candidate ``[YBLOCK, XBLOCK]`` tiles over dims of ``x`` and ``y`` elements."""
    configs = [{"XBLOCK": min(bx, next_pow2(x)), "YBLOCK": min(by, next_pow2(y)),
                "num_warps": nw} for bx, by, nw in ((64, 32, 4), (32, 32, 4), (128, 16, 4),
                                                    (64, 64, 8))]
    return [c for i, c in enumerate(configs) if c not in configs[:i]]


def tile_grid(tiles: dict[str, int], config: dict[str, int]) -> int:
    """Programs of a tiled kernel under ``config``."""
    return tiles["other"] * -(-tiles["y"] // config["YBLOCK"]) * -(-tiles["x"] //
                                                                    config["XBLOCK"])


def _elements(t):
    strides = t.actual_strides() or [1] * len(t.shape)
    return indexing.prod([d for d, s in zip(t.shape, strides) if s != 0])
