"""A Triton program's and its lanes' coordinates as expression nodes
(``torchloom.api.expr``): the program number, a block's lane numbers, a block of lanes laid
along one axis of a 2-D block. What a kernel writer spelt as f-strings
(``f"({pid} * XBLOCK + tl.arange(0, XBLOCK))[:, None]"``) is a tree here, parenthesised by
precedence, whose names (``XBLOCK``, ``roff``, ``it``) a statement's scan finds as nodes::

    >>> str(column(block_lanes(program(0), "XBLOCK")))
    '(tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK))[:, None]'
    >>> str(plus("p0", row(arange(32))))
    'p0 + tl.arange(0, 32)[None, :]'
"""

from __future__ import annotations

from typing import Union

from torchloom.api import expr, indexing

#: an operand: a node, a name (a block size, an index, a size argument) or an int
Operand = Union[expr.Code, str, int]


def node(v: Operand) -> expr.Code:
    """``v`` as a node (``indexing.node``): an int is a literal, a string a name, never
    opaque text."""
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        return expr.code(v)
    if isinstance(v, str) and not v.isidentifier():
        raise ValueError(f"not a name: {v!r}")
    return indexing.node(str(v))


def program(axis: int, wide: bool = False) -> expr.Code:
    """``tl.program_id(axis)``; ``wide``: converted to 64 bits (offsets past 2**31)."""
    pid = expr.Op("tl.program_id({0})", expr.POSTFIX, (node(axis),))
    return expr.Op("{0}.to(tl.int64)", expr.POSTFIX, (pid,)) if wide else pid


def to_int64(v: Operand) -> expr.Code:
    """``tl.cast(v, tl.int64)``: a size argument in 64 bits."""
    return expr.Op("tl.cast({0}, tl.int64)", expr.POSTFIX, (node(v),))


def arange(block: Operand) -> expr.Code:
    """``tl.arange(0, block)``: the lane numbers of a block."""
    return expr.Op("tl.arange(0, {0})", expr.POSTFIX, (node(block),))


def plus(a: Operand, b: Operand) -> expr.Code:
    return expr.Op("{0} + {1}", expr.SUM, (expr.paren(node(a), expr.SUM),
                                           expr.paren(node(b), expr.PRODUCT)))


def times(a: Operand, b: Operand) -> expr.Code:
    return expr.Op("{0} * {1}", expr.PRODUCT, (expr.paren(node(a), expr.PRODUCT),
                                               expr.paren(node(b), expr.POSTFIX)))


def block_lanes(block: Operand, size: Operand) -> expr.Code:
    """``block * size + tl.arange(0, size)``: the lanes of block number ``block``."""
    return plus(times(block, size), arange(size))


def column(v: Operand) -> expr.Code:
    """``v[:, None]``: a block of lanes laid along a 2-D block's first axis (its rows)."""
    return expr.Op("{0}[:, None]", expr.POSTFIX, (expr.paren(node(v), expr.POSTFIX),))


def row(v: Operand) -> expr.Code:
    """``v[None, :]``: a block of lanes laid along a 2-D block's second axis."""
    return expr.Op("{0}[None, :]", expr.POSTFIX, (expr.paren(node(v), expr.POSTFIX),))
