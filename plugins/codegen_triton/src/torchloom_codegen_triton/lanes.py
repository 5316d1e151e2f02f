"""A Triton program's and its lanes' coordinates as expression nodes
(``torchloom.api.expr``): the program number, a block's lane numbers, a block of lanes laid
along one axis of a 2-D block. What a kernel writer spelt as f-strings
(``f"({pid} * XBLOCK + tl.arange(0, XBLOCK))[:, None]"``) is a tree here, parenthesised by
precedence, whose names (``XBLOCK``, ``roff``, ``it``) a statement's scan finds as nodes::

    >>> str(column(block_lanes(program(0), "XBLOCK")))
    '(tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK))[:, None]'
    >>> str(plus("p0", row(arange(32))))
    'p0 + tl.arange(0, 32)[None, :]'
    >>> str(full(["XBLOCK", "RBLOCK"], constant('float("-inf")'), "tl.float32"))
    'tl.full([XBLOCK, RBLOCK], float("-inf"), tl.float32)'
    >>> str(where("rmask", "x", constant("0.0")))
    'tl.where(rmask, x, 0.0)'
"""

from __future__ import annotations

from collections.abc import Sequence
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
    """``a + b`` (:func:`torchloom.api.expr.plus` over the operands' nodes)."""
    return expr.plus(node(a), node(b))


def minus(a: Operand, b: Operand) -> expr.Code:
    return expr.minus(node(a), node(b))


def over(a: Operand, b: Operand) -> expr.Code:
    """``a / b``."""
    return expr.over(node(a), node(b))


def equal(a: Operand, b: Operand) -> expr.Code:
    """``a == b`` (arithmetic binds tighter: its operands need no parentheses)."""
    return expr.compare("==", node(a), node(b))


def call(function: str, *args: Operand) -> expr.Code:
    """``function(args...)``: a call of a Triton function (``tl.exp``) or of a helper the
    generated module defines (``_maximum``); ``function`` is the writer's own name."""
    if not all(part.isidentifier() for part in function.split(".")):
        raise ValueError(f"not a function name: {function!r}")
    fields = ", ".join(f"{{{k}}}" for k in range(len(args)))
    return expr.Op(f"{function}({fields})", expr.POSTFIX, tuple(map(node, args)))


def times(a: Operand, b: Operand) -> expr.Code:
    return expr.times(node(a), node(b))


def floor_over(a: Operand, b: Operand) -> expr.Code:
    """``a // b``: integer division (a block count)."""
    return expr.infix("//", expr.PRODUCT, node(a), node(b))


def blocks(n: Operand, block: Operand) -> expr.Code:
    """``(n + block - 1) // block``: blocks of ``block`` lanes covering ``n``."""
    return floor_over(minus(plus(n, block), 1), block)


def block_lanes(block: Operand, size: Operand) -> expr.Code:
    """``block * size + tl.arange(0, size)``: the lanes of block number ``block``."""
    return plus(times(block, size), arange(size))


def column(v: Operand) -> expr.Code:
    """``v[:, None]``: a block of lanes laid along a 2-D block's first axis (its rows)."""
    return expr.Op("{0}[:, None]", expr.POSTFIX, (expr.paren(node(v), expr.POSTFIX),))


def row(v: Operand) -> expr.Code:
    """``v[None, :]``: a block of lanes laid along a 2-D block's second axis."""
    return expr.Op("{0}[None, :]", expr.POSTFIX, (expr.paren(node(v), expr.POSTFIX),))


def constant(text: str) -> expr.Code:
    """A constant as the kernel spells it (``0.0``, ``float("-inf")``, an integer type's
    least value ``-9223372036854775807 - 1``): a literal, for a call's argument."""
    return expr.Literal(text)


def full(shape: Sequence[Operand], value: Operand, dtype: str) -> expr.Code:
    """``tl.full([a, b], value, dtype)``: a block of one value (an accumulator's start);
    ``dtype`` a Triton dtype (``tl.float32``)."""
    dims = ", ".join(f"{{{k}}}" for k in range(len(shape)))
    n = len(shape)
    return expr.Op(f"tl.full([{dims}], {{{n}}}, {{{n + 1}}})", expr.POSTFIX,
                   (*map(node, shape), node(value), expr.Literal(dtype)))


def where(condition: Operand, a: Operand, b: Operand) -> expr.Code:
    """``tl.where(condition, a, b)``: ``a`` in the lanes where ``condition`` holds, else ``b``."""
    return expr.Op("tl.where({0}, {1}, {2})", expr.POSTFIX, tuple(map(node, (condition, a, b))))


def less(a: Operand, b: Operand) -> expr.Code:
    """``a < b`` (arithmetic binds tighter: its operands need no parentheses)."""
    return expr.compare("<", node(a), node(b))


def cast(v: Operand, dtype: str) -> expr.Code:
    """``tl.cast(v, dtype)``: ``v`` converted to the Triton dtype ``dtype``."""
    return expr.Op(f"tl.cast({{0}}, {dtype})", expr.POSTFIX, (node(v),))


def masked_load(address: Operand, mask: Operand, other: Operand) -> expr.Code:
    """``tl.load(address, mask, other=other)``: ``other`` in the lanes ``mask`` leaves out."""
    return expr.Op("tl.load({0}, {1}, other={2})", expr.POSTFIX,
                   tuple(map(node, (address, mask, other))))


def reduce_tuple(values: Sequence[Operand], axis: int, combine: str) -> expr.Code:
    """``tl.reduce((a, b, ...), axis, combine, keep_dims=True)``: blocks reduced together
    by the generated module's helper ``combine`` (its values unpack: ``stmt.Unpack``)."""
    if not combine.isidentifier():
        raise ValueError(f"not a function name: {combine!r}")
    fields = ", ".join(f"{{{k}}}" for k in range(len(values)))
    return expr.Op(f"tl.reduce(({fields}), {axis}, {combine}, keep_dims=True)", expr.POSTFIX,
                   tuple(map(node, values)))


def both(a: Operand, b: Operand) -> expr.Code:
    """``a & b``: two masks' lanes in common."""
    return expr.Op("{0} & {1}", expr.LOWEST, (expr.paren(node(a), expr.POSTFIX),
                                              expr.paren(node(b), expr.POSTFIX)))
