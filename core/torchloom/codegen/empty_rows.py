"""Reductions without an identity over empty rows: eager raises, a kernel must not return
its accumulator's start instead.

A max, min, argmax or argmin over a dim of size 0 raises in eager (``IndexError: amax():
Expected reduction dim -1 to have non-zero size.``; a ``RuntimeError`` for ``amax`` of
every dim). A static 0 is known when a group is judged: :func:`raises_when_empty` is the
reason a codegen declines it, and the ``eager`` codegen raises. A symbolic dim is 0 or not
at a call: :func:`nonempty_dims` lists what a launcher checks first, and
:func:`raise_if_empty` is that check (``LaunchSpec.bind``), :func:`check_source` its text in
the cpu and triton launchers' generated Python.

The check raises only where the reduction's result reaches an output that has elements at
the call: a softmax decomposed into ``amax``, ``sub``, ``exp``, ``sum``, ``div`` over
empty rows writes an empty output and raises nothing, as ``torch.softmax`` does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torchloom.codegen.indexing import prod
from torchloom.codegen.writer import reduced_dims
from torchloom.ir import Node, TensorType, Value, symbols

#: reduction kinds without an identity
NO_IDENTITY = ("max", "min", "argmax", "argmin")
#: the exceptions a check raises (metadata names them)
EMPTY_ERRORS = {"IndexError": IndexError, "RuntimeError": RuntimeError}

#: one check: (the reduced size, the element counts of the outputs its result reaches, the
#: error's name in EMPTY_ERRORS, its message); it raises when the size is 0 and a count not
Check = tuple[Any, tuple[Any, ...], str, str]


def raises_when_empty(node: Node, kind: str | None) -> str | None:
    """Why eager raises on reduction ``node`` of ``kind`` (over a dim of static size 0),
    or None."""
    t = node.inputs[0].type if node.inputs else None
    if kind not in NO_IDENTITY or not isinstance(t, TensorType):
        return None
    empty = [d for d in reduced_dims(node, len(t.shape)) if t.shape[d] == 0]
    if not empty:
        return None
    return (f"{node.op} reduces dim {empty[0]} of {list(t.shape)}, of size 0: eager raises "
            f"(IndexError: expected reduction dim to have non-zero size)")


def _reached(region, node: Node) -> list[Value]:
    """The region's outputs computed from ``node``'s results (nodes in program order)."""
    reached = set(node.outputs)
    for n in region.nodes:
        if any(v in reached for v in n.inputs):
            reached.update(n.outputs)
    return [v for v in region.outputs if v in reached]


def _counts(outputs: Sequence[Value]) -> tuple[Any, ...] | None:
    """The element counts a check asks about (None: every output empty at every size)."""
    counts = [prod(v.type.shape) for v in outputs if isinstance(v.type, TensorType)]
    if any(isinstance(n, int) and n for n in counts):
        return (1,)  # an output has elements at every size
    symbolic = tuple(dict.fromkeys(n for n in counts if not isinstance(n, int)))
    return symbolic or None


def nonempty_dims(region, kinds: Mapping[str, str]) -> tuple[Check, ...]:
    """The checks a launcher makes for ``region`` (its reductions' kinds by op: ``kinds``):
    one per symbolic dim a max, min, argmax or argmin reduces, with eager's error."""
    checks: list[Check] = []
    for node in region.nodes:
        t = node.inputs[0].type if node.inputs else None
        kind = kinds.get(node.op)
        if kind not in NO_IDENTITY or not isinstance(t, TensorType) or not t.shape:
            continue
        counts = _counts(_reached(region, node))
        if counts is None:
            continue
        name, rank, given = node.op.split(".")[1], len(t.shape), node.attrs.get("dim")
        if given is None or given == []:  # every dim: eager checks the element count
            if not all(isinstance(d, int) for d in t.shape):
                arg = kind.startswith("arg")
                checks.append((prod(t.shape), counts, "IndexError" if arg else "RuntimeError",
                               f"{name}(): Expected reduction dim to be specified for "
                               f"input.numel() == 0." + ("" if arg else " Specify the "
                               "reduction dim with the 'dim' argument.")))
            continue
        for g in [given] if isinstance(given, int) else given:
            d = t.shape[g + rank if g < 0 else g]
            if not isinstance(d, int):
                checks.append((d, counts, "IndexError",
                               f"{name}(): Expected reduction dim {g} to have non-zero size."))
    return tuple(dict.fromkeys(checks))


def empty_error(name: Any) -> type[Exception]:
    """The exception class ``name`` (a check's, read back from metadata: data) names;
    ValueError when it names none of :data:`EMPTY_ERRORS`."""
    error = EMPTY_ERRORS.get(name) if isinstance(name, str) else None
    if error is None:
        raise ValueError(f"an empty-row check names error {name!r}, not one of "
                         f"{sorted(EMPTY_ERRORS)}: the metadata is damaged")
    return error


def check_source(checks: Sequence[Any], source: Callable[[Any], str]
                 ) -> tuple[dict[str, Any], list[str]]:
    """The checks as lines of a generated Python launcher (indented for a function body)
    and the names those lines call: ``source(dim)`` spells a size expression over the
    launcher's local size variables (``symbols.python_source``); the messages and error
    classes are values in the namespace, never text in the code."""
    namespace, lines = {}, []
    for k, (dim, counts, error, message) in enumerate(checks):
        namespace[f"_empty{k}"] = functools.partial(empty_error(error), message)
        seen = " or ".join(source(n) for n in counts)  # an output it reaches has elements
        lines.append(f"    if {source(dim)} == 0 and ({seen}): raise _empty{k}()")
    return namespace, lines


def raise_if_empty(checks: Sequence[Check], env: Mapping[str, int]) -> None:
    """Eager's error for the first of ``checks`` that fails at sizes ``env``."""
    for dim, counts, error, message in checks:
        if symbols.evaluate(dim, env) == 0 and any(symbols.evaluate(n, env) for n in counts):
            raise empty_error(error)(message)
