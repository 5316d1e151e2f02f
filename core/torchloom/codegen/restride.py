"""Views between kernels as one strided view of the tensor they view.

A plan calls each view op of its graph through torch (``view``, ``transpose``, ``split``,
``permute``, ``t``, ``expand``, ... between the kernels of a transformer layer: ~30 a
layer, 2.5-5 us each through the dispatcher). Where the viewed tensor's layout is known
when the plan is built, every view of it, and every view of such a view, is its *base*
with the sizes and strides of the view's type and a storage offset counted from the
base's: one call (Inductor's ``reinterpret_tensor``), and the views in between are not
made at all. :func:`fold_views` rewrites the plan's own lowered copy of the graph so;
each view becomes a ``torchloom.restride`` node (:data:`RESTRIDE`) reading the base, whose
``offset`` attribute is the offset in elements as ``((coefficient, dim), ...)`` (dims of
the graph's types, symbolic ones included), and :func:`source` is its statement. A view
laid out as its base (same sizes, strides and first element: ``t().t()``, a weight
gradient transposed twice, a view back to the base's sizes) is no call at all: its
readers read the base (returned whole too, when no other output is the base and the base
is no graph input).

A base's layout is known (``exact``) when it is:

- a graph input whose layout the plan's guards check (static inputs, and symbolic ones
  the symbolic guard checks whole), not read by an op reshaping it in place;
- an output of a shared subgraph's call that its own plan knows the layout of
  (:class:`~torchloom.codegen.plan.SubgraphCall`'s ``exact_outputs``: a repeated layer's);
- an output of a kernel with ``exact_layouts`` (the codegen protocol,
  :mod:`torchloom.codegen.base`: it returns its outputs laid out as their types);
- an output of a matrix product (``mm``, ``bmm``, ``addmm``, ``baddbmm``: a new dense
  row-major tensor, eager and meta alike);
- a view folded here.

The sizes and strides of a view of such a base are the view's type (view ops compute them
from their input's with the same code on meta and real tensors; strides of dims of size 1
may differ, and never address an element). A view with a dim of size 0 is left to its op
(its type keeps no strides). Symbolic sizes are read from the plan's inputs
(``symbols.bind_symbols``: the first input dim that is that bare size); a view whose type
names a symbol no input dim holds is left as it is.

At run time (:func:`restride`) the view is torch's ``_reinterpret_tensor`` (Inductor's,
~0.9 us: no dispatch) for plain tensors with gradients off, else ``Tensor.as_strided``
(an autograd view with the base's version counter: what a plan run with gradients on,
or given a tensor subclass, gets).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch

from torchloom.codegen.base import same_strides
from torchloom.ir.graph import CALL_SUBGRAPH, FUSION_GROUP, Graph, Node, Value
from torchloom.ir.symbols import Dim, bind_symbols, python_source, symbols_of
from torchloom.ir.types import TensorType

RESTRIDE = "torchloom.restride"

#: views whose outputs start where their input starts
SAME_START = frozenset((
    "aten.view.default", "aten._unsafe_view.default", "aten.transpose.int",
    "aten.permute.default", "aten.t.default", "aten.expand.default", "aten.alias.default",
    "aten.unsqueeze.default", "aten.squeeze.default", "aten.squeeze.dim",
    "aten.squeeze.dims"))
#: views whose outputs start further along a dim of their input (see ``_starts``)
MOVED_START = frozenset(("aten.split.Tensor", "aten.split_with_sizes.default",
                         "aten.unbind.int", "aten.select.int", "aten.slice.Tensor",
                         "aten.narrow.default"))
#: ops whose result is a new dense row-major tensor on every call
DENSE_RESULTS = frozenset(("aten.mm.default", "aten.bmm.default", "aten.addmm.default",
                           "aten.baddbmm.default"))

Offset = tuple[tuple[int, Dim], ...]

#: in-place aten ops that change a tensor's shape or strides: a graph input one of them
#: reads is not laid out as its guard checked for the rest of the plan, and no value of a
#: graph holding one is folded here (a view may be restrided in place after it was made)
RESHAPING = frozenset(("resize_", "resize_as_", "set_", "as_strided_", "t_", "transpose_",
                       "squeeze_", "unsqueeze_", "swapdims_", "swapaxes_", "detach_"))


def reshapes(node: Node) -> bool:
    """Whether ``node`` is an op of :data:`RESHAPING`."""
    return node.op.split(".")[:2][-1] in RESHAPING


def fold_views(graph: Graph, registry: Any, kernels: Mapping[Node, Callable],
               exact_inputs: Collection[Value]) -> frozenset[Value]:
    """Replace the views of bases of known layout (module docstring) by ``torchloom.restride``
    nodes reading the base; views nothing else reads go. ``graph`` is the plan's own flat
    copy (``lowering.lower``). Returns the values of known layout (laid out as their
    types) after the fold."""
    if any(reshapes(node) for node in graph.nodes):
        return frozenset()
    bound = set(_bindings(graph))
    exact = set(exact_inputs)
    made: list[Node] = []
    for node in list(graph.nodes):
        if node in kernels:
            if node.op == FUSION_GROUP and getattr(kernels[node], "exact_layouts", False):
                exact.update(node.outputs)
            elif node.op == CALL_SUBGRAPH:  # (the outputs its own plan knows the layout of)
                exact.update(node.outputs[i] for i in getattr(kernels[node], "exact_outputs", ()))
            continue
        if node.op in DENSE_RESULTS:
            exact.update(node.outputs)
            continue
        if node.op not in SAME_START and node.op not in MOVED_START:
            continue
        if not node.inputs or node.inputs[0] not in exact:
            continue
        starts = _starts(node, registry)
        if starts is None or not _expressible(node, starts, bound):
            continue
        source = node.inputs[0]
        base, before = source, ()
        if source.producer is not None and source.producer.op == RESTRIDE:
            base, before = source.producer.inputs[0], source.producer.attrs["offset"]
        for out, start in zip(node.outputs, starts):
            if graph.is_dead(out):
                continue
            if _same_layout(base, out, before + start) and (
                    out not in graph.outputs or _fresh(base, graph)):
                graph.replace_all_uses(out, base)  # the base itself: no view to make
                continue
            view = graph.create(RESTRIDE, [base], [out.type], {"offset": before + start},
                                names=[out.name], before=node)
            graph.replace_all_uses(out, view.output)
            exact.add(view.output)
            made.append(view)
        graph.erase(node)
    for view in reversed(made):  # views read only by views folded after them
        if graph.is_dead(view.output):
            graph.erase(view)
            exact.discard(view.output)
    return frozenset(exact)


def _same_layout(base: Value, out: Value, offset: Offset) -> bool:
    """Whether ``out``, viewed from ``base`` at ``offset``, is laid out as ``base`` is: the
    same sizes, the same strides (but of dims of size 1, which address no other element)
    and the same first element."""
    a, b = base.type, out.type
    if not (isinstance(a, TensorType) and isinstance(b, TensorType)) or \
            a.shape != b.shape or a.dtype != b.dtype or any(c for c, _ in offset):
        return False
    return same_strides(a.shape, strides_of(b), strides_of(a))


def _fresh(base: Value, graph: Graph) -> bool:
    """Whether ``base`` may be returned in place of a view of it: made by the graph (not
    an input: torch tracks outputs that are inputs) and no output yet (two outputs one
    tensor: a weight's gradient would be another's)."""
    return base.producer is not None and base not in graph.outputs


def strides_of(t: TensorType) -> tuple[Dim, ...]:
    """``t``'s strides, symbolic ones as expressions (row-major when ``t.strides`` is
    None: the product of the later dims)."""
    if t.strides is not None:
        return tuple(t.strides)
    out: list[Dim] = []
    const, factors = 1, []
    for d in reversed(t.shape):
        out.append("*".join([*[str(const)] * (const != 1), *factors]) if factors else const)
        if isinstance(d, int):
            const *= max(d, 1)
        else:
            factors.append(f"({d})")
    return tuple(reversed(out))


def _starts(node: Node, registry: Any) -> list[Offset] | None:
    """Per output, how far its first element lies from the input's, as a sum of
    ``(count, stride)`` terms; None where an argument is not a plain int."""
    if node.op in SAME_START:
        return [()] * len(node.outputs)
    t = node.inputs[0].type
    if not isinstance(t, TensorType):
        return None
    args = _arguments(node, registry)
    dim = args.get("dim", 0)
    if type(dim) is not int or not -t.rank <= dim < t.rank:
        return None
    dim %= t.rank
    stride, size = strides_of(t)[dim], t.shape[dim]
    if node.op == "aten.unbind.int":
        counts = list(range(len(node.outputs)))
    elif node.op == "aten.split.Tensor":
        step = args.get("split_size")
        counts = [j * step for j in range(len(node.outputs))] if type(step) is int else None
    elif node.op == "aten.split_with_sizes.default":
        sizes = args.get("split_sizes")
        counts = [sum(sizes[:j]) for j in range(len(node.outputs))] \
            if isinstance(sizes, (list, tuple)) and all(type(s) is int for s in sizes) \
            else None
    else:  # select, slice, narrow: one output, from an index along the dim
        first = args.get("index", args.get("start"))
        first = 0 if first is None else first
        counts = [_index(first, size, clamp=node.op == "aten.slice.Tensor")]
    if counts is None or None in counts:
        return None
    return [((c, stride),) if c else () for c in counts]


def _index(first: Any, size: Dim, clamp: bool) -> int | None:
    """A start index along a dim of ``size`` as torch takes it: negative ones count from
    the end (a symbolic size: not known here), slices clamp to the dim."""
    if type(first) is not int:
        return None
    if first < 0:
        if type(size) is not int:
            return None
        first += size
    if clamp:  # (past a symbolic end the slice is empty: its start addresses nothing)
        first = max(first, 0) if type(size) is not int else min(max(first, 0), size)
    return first


def _arguments(node: Node, registry: Any) -> dict[str, Any]:
    """The op's arguments by schema name, defaults filled in (tensors as ``InputRef``)."""
    opdef = registry.get(node.op)
    if opdef.schema is None:
        return {}
    args, kwargs = opdef.call_template(node)
    out = {}
    for i, arg in enumerate(opdef.schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            out[arg.name] = args[i]
        elif arg.name in kwargs:
            out[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
    return out


def _expressible(node: Node, starts: list[Offset], bound: set[str]) -> bool:
    """Every output's sizes, strides and start are known in terms of bound symbols, and
    no output is empty (an empty tensor's type keeps no strides: torch's, which a view
    would give it and ops reading it follow, are left to the view op)."""
    for out, start in zip(node.outputs, starts):
        t = out.type
        if not isinstance(t, TensorType) or 0 in t.shape:
            return False
        dims = [*t.shape, *strides_of(t), *(d for _, d in start)]
        if any(d is None for d in dims) or any(s not in bound for d in dims
                                                for s in symbols_of(d)):
            return False
    return True


def symbols(node: Node) -> list[str]:
    """The symbols a restride node's statement reads (``sym_<name>`` locals)."""
    t = node.output.type
    dims = [*t.shape, *strides_of(t), *(d for _, d in node.attrs["offset"])]
    return list(dict.fromkeys(s for d in dims for s in symbols_of(d)))


def source(node: Node, base: str) -> str:
    """The call making a restride node's view of the tensor named ``base``."""
    def text(d: Dim) -> str:
        return python_source(d, lambda s: f"sym_{s}")

    def tup(dims) -> str:
        return f"({', '.join(map(text, dims))}{',' if len(dims) == 1 else ''})"

    t = node.output.type
    offset = node.attrs["offset"]
    static = sum(c * d for c, d in offset if isinstance(d, int))
    terms = [f"{c} * {text(d)}" for c, d in offset if not isinstance(d, int)]
    start = " + ".join(terms + [str(static)] * (static != 0 or not terms))
    return f"_restride({base}, {tup(t.shape)}, {tup(strides_of(t))}, {start})"


def binding_lines(graph: Graph, names: Mapping[Value, str],
                  wanted: Collection[str]) -> list[str]:
    """``sym_<s> = <input>.shape[k]`` for each symbol in ``wanted``, read from the first
    graph input dim that is that bare symbol (the binding :func:`fold_views` assumed)."""
    return [f"    sym_{s} = {names[graph.inputs[i]]}.shape[{k}]"
            for s, (i, k) in _bindings(graph).items() if s in wanted]


def _bindings(graph: Graph) -> dict[str, tuple[int, int]]:
    """Symbol -> (input, dim) it is read from: the first input dim that is that bare symbol."""
    return bind_symbols([v.type.shape if isinstance(v.type, TensorType) else None
                         for v in graph.inputs])


def _reinterpret() -> Callable | None:
    try:
        from torch._C._dynamo.guards import _reinterpret_tensor
    except ImportError:  # another torch: the public view op only
        return None
    return _reinterpret_tensor


def make_restride() -> Callable:
    """``restride(base, sizes, strides, start)``: ``base``'s storage seen with ``sizes`` and
    ``strides`` from ``start`` elements past ``base``'s first (module docstring)."""
    reinterpret = _reinterpret()
    grad = torch.is_grad_enabled
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    plain = (torch.Tensor, torch.nn.Parameter)

    def restride(base, sizes, strides, start):
        if reinterpret is not None and type(base) in plain and not grad() and \
                not wrapped(base):
            return reinterpret(base, sizes, strides, start)
        return base.as_strided(sizes, strides, base.storage_offset() + start)
    return restride


__all__ = ["RESTRIDE", "RESHAPING", "reshapes", "SAME_START", "MOVED_START", "DENSE_RESULTS",
           "fold_views", "strides_of", "symbols", "source", "binding_lines", "make_restride"]
