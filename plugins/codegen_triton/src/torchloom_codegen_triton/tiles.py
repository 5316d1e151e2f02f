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

Which ``(d0, d1)`` is the core's plan (``torchloom.codegen.tiles.Tiles``: the group's
outputs probed at symbolic coordinates ``p0, p1, ...``, every input's coordinates saying
which dim, if any, it reads with a unit stride).
"""

from __future__ import annotations

from typing import Any

from torchloom.api import Tiles, expr, indexing, stmt

from torchloom_codegen_triton import lanes
from torchloom_codegen_triton.plan import next_pow2
from torchloom_codegen_triton.protocol import Writer
from torchloom_codegen_triton.tensors import tensor_type


#: the shortest dims worth a tile
MIN_TILE_DIM = 16


def plan_tiles(w: Writer) -> tuple[int, int] | None:
    """``(d0, d1)``: the core's tile plan of ``w``'s group (``codegen.tiles.Tiles``);
    with symbolic sizes only for the tiled variant, which calls with short dims pass over."""
    if w.symbolic and w.form != "tiled":
        return None
    plan = Tiles.of(w.region, w.registry, tensor_type, None if w.symbolic else MIN_TILE_DIM)
    return None if plan is None else (plan.d0, plan.d1)


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
