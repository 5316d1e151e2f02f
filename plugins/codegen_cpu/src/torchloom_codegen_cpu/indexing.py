"""Index math: coordinates are C expressions (int64_t), one per dim.

Views never move data here: a view's element at output coordinates is its input's element
at coordinates these functions compute (tinygrad's ShapeTracker idea, done eagerly on
source text). Size-1 dims always have coordinate ``"0"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Coords = tuple[str, ...]


class Unsupported(Exception):
    """The group cannot be compiled by this codegen; the message is the reason."""


def _par(e: str) -> str:
    return e if e.isidentifier() or e.isdigit() else f"({e})"


#: (coords, shape) with size-1 dims dropped -> the index they were delinearised from
Known = dict[tuple[tuple[str, ...], tuple[int, ...]], str]


def linear(coords: Sequence[str], shape: Sequence[int], known: Known | None = None) -> str:
    """Row-major linear index of ``coords`` within ``shape`` (size-1 dims skipped)."""
    if known:
        key = (tuple(c for c, d in zip(coords, shape) if d != 1),
               tuple(d for d in shape if d != 1))
        if key[0] and key in known:  # no real dims: element 0 (never a loop's index)
            return known[key]
    terms, stride = [], 1
    for c, d in reversed(list(zip(coords, shape))):
        if d != 1 and c != "0":
            terms.append(c if stride == 1 else f"{_par(c)} * {stride}")
        stride *= d
    return " + ".join(reversed(terms)) if terms else "0"


def delinear(index: str, shape: Sequence[int]) -> Coords:
    """Coordinates of the row-major ``index`` within ``shape``."""
    out, stride = [], 1
    real = [i for i, d in enumerate(shape) if d != 1]
    strides = {}
    for i in reversed(range(len(shape))):
        strides[i] = stride
        stride *= shape[i]
    for i, d in enumerate(shape):
        if d == 1:
            out.append("0")
            continue
        e = _par(index)
        if strides[i] != 1:
            e = f"{e} / {strides[i]}"
        if i != real[0]:
            e = f"{_par(e) if strides[i] != 1 else e} % {d}"
        out.append(e)
    return tuple(out)


def address(coords: Sequence[str], strides: Sequence[int], shape: Sequence[int],
            known: Known | None = None) -> str:
    """Element offset of ``coords`` in a tensor with ``strides``."""
    real = sorted(((c, s, d) for c, s, d in zip(coords, strides, shape) if d != 1),
                  key=lambda t: -abs(t[1]))  # memory order (stable: logical among equals)
    expected = 1
    for _, s, d in reversed(real):
        if s != expected:
            break
        expected *= d
    else:  # row-major: the linear index (often the very index the coords came from)
        return linear([c for c, _, _ in real], [d for _, _, d in real], known)
    terms = [c if s == 1 else f"{_par(c)} * {s}" for c, s, d in zip(coords, strides, shape)
             if d != 1 and s != 0 and c != "0"]
    return " + ".join(terms) if terms else "0"


def broadcast(coords: Sequence[str], out_shape: Sequence[int], in_shape: Sequence[int]) -> Coords:
    """Coordinates in an input that broadcasts (right-aligned) to ``out_shape``."""
    offset = len(out_shape) - len(in_shape)
    if offset < 0:
        raise Unsupported(f"input of rank {len(in_shape)} broadcast to rank {len(out_shape)}")
    return tuple("0" if d == 1 else coords[offset + i] for i, d in enumerate(in_shape))


def reshape(coords: Sequence[str], out_shape: Sequence[int], in_shape: Sequence[int],
            known: Known | None = None) -> Coords:
    """Coordinates in the input of a view/reshape/squeeze/unsqueeze (logical order)."""
    if 0 in out_shape or 0 in in_shape:
        return tuple("0" for _ in in_shape)
    result = ["0"] * len(in_shape)
    outs = [i for i, d in enumerate(out_shape) if d != 1]
    ins = [j for j, d in enumerate(in_shape) if d != 1]
    i = j = 0
    while i < len(outs):
        group_o, group_i = [outs[i]], [ins[j]]
        po, pi = out_shape[outs[i]], in_shape[ins[j]]
        i, j = i + 1, j + 1
        while po != pi:
            if po < pi:
                group_o.append(outs[i])
                po *= out_shape[outs[i]]
                i += 1
            else:
                group_i.append(ins[j])
                pi *= in_shape[ins[j]]
                j += 1
        if len(group_o) == 1 and len(group_i) == 1:
            result[group_i[0]] = coords[group_o[0]]
            continue
        lin = linear([coords[k] for k in group_o], [out_shape[k] for k in group_o], known)
        pieces = delinear(lin, [in_shape[k] for k in group_i])
        if known is not None:
            sizes = tuple(in_shape[k] for k in group_i)
            known[(tuple(c for c, d in zip(pieces, sizes) if d != 1),
                   tuple(d for d in sizes if d != 1))] = lin
        for k, c in zip(group_i, pieces):
            result[k] = c
    return tuple(result)


def _norm(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def view_coords(rule: str, coords: Coords, attrs: Mapping[str, Any], out_shape: Sequence[int],
                in_shape: Sequence[int], known: Known | None = None,
                output: int = 0) -> Coords:
    """Input coordinates of a view op's element at ``coords`` (see ops.VIEWS)."""
    rank = len(in_shape)
    if rule == "reshape":
        return reshape(coords, out_shape, in_shape, known)
    if rule == "expand":
        return broadcast(coords, out_shape, in_shape)
    if rule == "permute":
        result = [""] * rank
        for i, d in enumerate(attrs["dims"]):
            result[_norm(d, rank)] = coords[i]
        return tuple(result)
    if rule == "transpose":
        if rank < 2:
            return tuple(coords)
        a, b = _norm(attrs.get("dim0", 0), rank), _norm(attrs.get("dim1", 1), rank)
        result = list(coords)
        result[a], result[b] = coords[b], coords[a]
        return tuple(result)
    if rule == "slice":
        dim = _norm(attrs.get("dim", 0), rank)
        size = in_shape[dim]
        start = attrs.get("start") or 0
        start = min(max(start + size if start < 0 else start, 0), size)
        step = attrs.get("step", 1) or 1
        c = coords[dim] if step == 1 else f"{_par(coords[dim])} * {step}"
        if start:
            c = str(start) if c == "0" else f"{c} + {start}"
        return tuple(coords[:dim]) + (c,) + tuple(coords[dim + 1:])
    if rule in ("split", "split_with_sizes"):  # output ``output`` is one piece along dim
        dim = _norm(attrs.get("dim", 0), rank)
        if rule == "split":
            start = output * attrs["split_size"]
        else:
            start = sum(attrs["split_sizes"][:output])
        c = coords[dim] if not start else (str(start) if coords[dim] == "0"
                                           else f"{coords[dim]} + {start}")
        return tuple(coords[:dim]) + (c,) + tuple(coords[dim + 1:])
    if rule == "unbind":
        dim = _norm(attrs.get("dim", 0), rank)
        return tuple(coords[:dim]) + (str(output),) + tuple(coords[dim:])
    if rule == "select":
        dim = _norm(attrs["dim"], rank)
        index = attrs["index"]
        index = index + in_shape[dim] if index < 0 else index
        return tuple(coords[:dim]) + (str(index),) + tuple(coords[dim:])
    raise Unsupported(f"no index rule {rule!r}")
