"""torch.fx aten graphs (as aot_autograd produces them) -> IR.

Shapes, dtypes, strides and devices come from each FX node's ``meta['val']`` (fake
tensors), or from the example inputs for placeholders. Tensor args become node inputs;
other args become attributes named after the schema's arguments. ``getitem`` on a
multi-output node selects one of its outputs; ``get_attr`` constants become extra graph
inputs listed in :attr:`ImportedGraph.constants`.

Call targets that are plain Python callables (``torch.neg``, ``operator.getitem`` on a
list) become ``python.<module>.<name>`` ops. The callable is the FX graph's own object,
registered as that op in the registry the caller compiles with (``registry=``); nothing
is ever imported by name, so IR text naming ``python.*`` ops runs only what a frontend
or a plugin registered.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Sequence
from typing import Any

import attrs
import torch
import torch.fx

from torchloom.errors import UnsupportedError
from torchloom.ir.graph import CONSTANT, Graph, InputRef, Value
from torchloom.ir.text import format_attr
from torchloom.ir.verify import agreed_types
from torchloom.ops.aten import find_callable
from torchloom.ops.registry import OpDef, OpRegistry
from torchloom.ir.types import ScalarType, TensorType, Type, type_of


@attrs.define
class ImportedGraph:
    graph: Graph
    #: values for the graph inputs after the user's arguments (FX get_attr constants)
    constants: list[Any] = attrs.field(factory=list)
    #: True when some input or value has a symbolic (dynamic) size
    symbolic: bool = False
    #: ``python.*`` op name -> the FX graph's callable (registered in ``registry=``)
    callables: dict[str, Any] = attrs.field(factory=dict)
    #: the types torch's fake tensors gave each op node, as ``verify``'s ``typed`` memo
    #: (:func:`~torchloom.ir.verify.agreed_types`): the passes' first check infers again
    #: only what a pass changed
    typed: dict = attrs.field(factory=dict)


def callable_name(target) -> str:
    """The IR op name of an FX call target."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)  # e.g. aten.add.Tensor
    if isinstance(target, torch._ops.OpOverloadPacket):
        return f"{target}.default"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"  # torch.cond, checkpoint tags, ...
    module = getattr(target, "__module__", None) or "builtins"
    name = getattr(target, "__name__", None)
    if name is None:
        raise UnsupportedError(f"call target {target!r} has no importable name")
    if module == "_operator":
        module = "operator"
    return f"python.{module}.{name}"


def import_fx(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None = None,
              name: str = "main", *, registry: OpRegistry | None = None) -> ImportedGraph:
    """Convert an FX graph of aten ops into an IR graph.

    The graph's plain Python call targets are registered in ``registry`` (the one the
    graph is compiled and run with) as opaque ``python.*`` ops, and listed in
    :attr:`ImportedGraph.callables`. Raises :class:`UnsupportedError` (never anything
    else) for what it cannot import, so that callers can run the graph eagerly instead."""
    try:
        imported = _import_fx(gm, example_inputs, name)
        if registry is not None:
            register_callables(registry, imported.callables)
            retype_for_device(imported.graph, registry)
        return attrs.evolve(imported, typed=agreed_types(imported.graph))
    except UnsupportedError:
        raise
    except Exception as exc:
        raise UnsupportedError(f"cannot import the FX graph: {type(exc).__name__}: "
                               f"{exc}") from exc


def register_callables(registry: OpRegistry, callables: dict[str, Any]) -> None:
    """Register each ``python.*`` op of an imported graph as its own callable; a name the
    registry already gives another callable is unsupported (it would run the wrong one)."""
    for op_name, fn in callables.items():
        known = registry.lookup(op_name)
        if known is None:
            registry.register(OpDef(op_name, "opaque", fn=fn))
        elif known.fn is not fn:
            raise UnsupportedError(f"call target {fn!r} is named {op_name}, which the op "
                                   f"registry already defines as {known.fn!r}")


def retype_for_device(graph: Graph, registry: OpRegistry) -> None:
    """Give the outputs of ops whose FX types are not what their kernels return on the
    graph's device (torch's fake kernels are wrong for them: see
    :mod:`torchloom.ops.device_types`) the types the kernels return, and re-infer every
    op that reads a value retyped so. An op whose types cannot be re-inferred then makes
    the graph unsupported (it runs eagerly) rather than typed wrongly."""
    retyped: set[Value] = set()
    for node in graph.nodes:
        changed_input = any(v in retyped for v in node.inputs)
        opdef = registry.get(node.op)
        if not changed_input and opdef.infer is None:
            continue
        inferred = opdef.infer_types(node)
        if inferred is None or len(inferred) != len(node.outputs):
            if changed_input:
                raise UnsupportedError(
                    f"{node.op} reads a value whose type torch's FX graph gives wrongly "
                    f"for its device, and its own types cannot be inferred again")
            continue
        for v, t in zip(node.outputs, inferred):
            if isinstance(t, TensorType) and isinstance(v.type, TensorType) and (
                    t.dtype, t.shape, t.device) != (v.type.dtype, v.type.shape, v.type.device):
                v.type = t
                retyped.add(v)


def _effect_token(n: torch.fx.Node) -> bool:
    """Whether placeholder ``n`` is only ever the token of ``with_effects`` calls."""
    effects = getattr(torch.ops.higher_order, "with_effects", None)
    return bool(n.users) and effects is not None and all(
        u.op == "call_function" and u.target is effects and u.args[:1] == (n,)
        and n not in u.args[1:] and n not in u.kwargs.values() for u in n.users)


def _import_fx(gm: torch.fx.GraphModule, example_inputs: Sequence[Any] | None,
               name: str) -> ImportedGraph:
    graph = Graph(name)
    env: dict[torch.fx.Node, Any] = {}  # fx node -> Value, or tuple of Values (multi-output)
    constants: list[Any] = []
    infos: dict[Any, _OpInfo] = {}  # call target -> what importing needs of it
    symbolic = False
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(placeholders):
        val = n.meta.get("val", n.meta.get("example_value"))
        if val is None and example_inputs is not None and i < len(example_inputs):
            val = example_inputs[i]
        if isinstance(val, torch.Tensor) and (val.is_neg() or val.is_conj()):
            # a lazy negation or conjugation (``z.conj().imag``): kernels would read the
            # memory without applying it
            raise UnsupportedError(f"input {n.name} is a view with its "
                                   f"{'negative' if val.is_neg() else 'conjugate'} bit set")
        # an effect token (aot_autograd's, threaded through ``with_effects``): traced as an
        # empty tensor, called with None (runtime_wrappers: ``[None] * num_tokens``)
        t = ScalarType("any") if _effect_token(n) else type_of(val)
        symbolic |= _is_symbolic(t, val)
        env[n] = graph.add_input(t, n.name)
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "get_attr":  # placeholders come first in FX, so this input follows them
            value = _fetch_attr(gm, n.target)
            env[n] = graph.add_input(type_of(value), n.name)
            constants.append(value)
            continue
        if n.op == "output":
            continue
        if n.op != "call_function":
            raise UnsupportedError(f"FX node {n.name} is a {n.op}; only aten call_function "
                                   f"graphs are imported")
        if n.target is operator.getitem and isinstance(env.get(n.args[0]), tuple):
            env[n] = env[n.args[0]][n.args[1]]
            continue
        val = n.meta.get("val")
        if val is None and n.target is torch.ops.higher_order.run_with_rng_state:
            val = _replayed_value(n)
        symbolic |= _is_symbolic(None, val)
        try:
            env[n] = _import_call(graph, n, env, val, infos)
        except UnsupportedError:
            raise
        except Exception as exc:  # never a crash of the user's program: the caller falls back
            raise UnsupportedError(f"cannot import FX node {n.name} ({n.target}): "
                                   f"{type(exc).__name__}: {exc}") from exc
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    graph.set_outputs([_output_value(graph, a, env) for a in _flatten_outputs(out_node.args[0])])
    callables = {info.name: target for target, info in infos.items() if info.args is None
                 and info.name.startswith("python.")}
    return ImportedGraph(graph, constants, symbolic, callables)


def _fetch_attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _flatten_outputs(arg) -> list:
    if isinstance(arg, (list, tuple)):
        return list(arg)
    return [arg]


def _output_value(graph: Graph, a, env) -> Value:
    if isinstance(a, torch.fx.Node):
        v = env[a]
        if isinstance(v, tuple):
            raise UnsupportedError(f"graph output {a.name} is a tuple of values")
        return v
    node = graph.create(CONSTANT, [], [type_of(a)], {"value": a}, names=["const"])
    return node.output


def _is_symbolic(t: Type | None, val) -> bool:
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(val, torch.Tensor) and t is None:  # cheaper than building the type
        return not (all(type(d) is int for d in val.shape)
                    and all(type(s) is int for s in val.stride()))
    if isinstance(val, (list, tuple)):
        return any(_is_symbolic(None, x) for x in val)
    return isinstance(t, TensorType) and not t.is_static


@attrs.frozen
class _Arg:
    name: str
    has_default: bool
    default: Any


@attrs.frozen
class _OpInfo:
    """What importing needs of one call target, computed once per target and import."""

    name: str
    args: tuple[_Arg, ...] | None  # None: no schema (a plain Python callable)
    returns: int = 1

    @classmethod
    def of(cls, target) -> "_OpInfo":
        name = callable_name(target)
        if not _named_by(target, name):  # two callables could share the name: run eagerly
            raise UnsupportedError(f"call target {target!r} cannot be found by its name {name}")
        schema = getattr(target, "_schema", None)
        if schema is None:
            return cls(name, None)
        args = tuple(_Arg(a.name, a.has_default_value(),
                          _plain(a.default_value) if a.has_default_value() else None)
                     for a in schema.arguments)
        return cls(name, args, len(schema.returns))


def _named_by(target, name: str) -> bool:
    """Whether ``name`` identifies ``target``: a torch operator of that name, or a Python
    callable that is that attribute of its (already imported) module. Imports nothing."""
    if not name.startswith("python."):
        return find_callable(name) is not None  # an overload packet names its .default
    module_name, _, attr = name[len("python."):].rpartition(".")
    module = sys.modules.get(module_name)
    return module is not None and getattr(module, attr, None) is target


def _replayed_value(n: torch.fx.Node):
    """The value of ``run_with_rng_state(state, op, *args)``, which the partitioner adds
    without one (a checkpointed random op's recomputation): ``op``'s on the arguments'
    values, in their fake mode; None where an argument has none."""
    from torch._guards import detect_fake_mode
    if len(n.args) < 2:
        return None
    _, op, *args = n.args
    vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in args]
    kwargs = {k: v.meta.get("val") if isinstance(v, torch.fx.Node) else v
              for k, v in n.kwargs.items()}
    tensors = [v for v in (*vals, *kwargs.values()) if isinstance(v, torch.Tensor)]
    mode = detect_fake_mode(tensors) if tensors else None
    if mode is None or any(v is None for v in (*vals, *kwargs.values())) or \
            not isinstance(op, torch._ops.OpOverload):
        return None
    try:
        with mode:
            return op(*vals, **kwargs)
    except Exception:  # (the node is then imported untyped, as before)
        return None


def _import_call(graph: Graph, n: torch.fx.Node, env, val, infos: dict):
    info = infos.get(n.target)
    if info is None:
        info = infos[n.target] = _OpInfo.of(n.target)
    op_name = info.name
    inputs: list[Value] = []

    def convert(a):
        if isinstance(a, torch.fx.Node):
            v = env[a]
            if isinstance(v, tuple):
                raise UnsupportedError(f"{n.name} uses the whole tuple {a.name}")
            inputs.append(v)
            return InputRef(len(inputs) - 1)
        if isinstance(a, (list, tuple)):
            return tuple(convert(x) for x in a)
        return a

    attrs_: dict[str, Any] = {}
    if info.args is None:
        args = tuple(convert(a) for a in n.args)
        kwargs = tuple((k, convert(v)) for k, v in n.kwargs.items())
        if kwargs or any(not isinstance(a, InputRef) for a in args) or \
                [int(a) for a in args] != list(range(len(args))):
            attrs_["args"] = args
            if kwargs:
                attrs_["kwargs"] = kwargs
    else:
        attrs_ = _schema_attrs(info.args, n, convert)
    if isinstance(val, (list, tuple)) and info.args is None:
        # without a schema the runtime cannot know that a 1-element result is a sequence:
        # keep the sequence as one value, and FX's getitem nodes as python.operator.getitem
        out_types, hints, val = [ScalarType("any")], [n.name], None
    elif isinstance(val, (list, tuple)):
        out_types = [type_of(x) for x in val]
        hints = [f"{n.name}_{i}" for i in range(len(val))]
    elif val is None and info.args is not None and info.returns == 0:
        out_types, hints = [], []
    else:
        out_types = [type_of(val) if val is not None else ScalarType("any")]
        hints = [n.name]
    for key, value in attrs_.items():
        if value is None or type(value) in _PLAIN_ATTR_TYPES:
            continue
        try:
            format_attr(value)
        except TypeError:
            raise UnsupportedError(f"{n.name} ({op_name}): argument {key} = {value!r} has no "
                                   f"IR text form") from None
    node = graph.create(op_name, inputs, out_types, attrs_, names=hints)
    if isinstance(val, (list, tuple)):
        return tuple(node.outputs)
    return node.outputs[0] if node.outputs else None


def _schema_attrs(args: tuple[_Arg, ...], n: torch.fx.Node, convert) -> dict[str, Any]:
    """Attributes for schema arguments given as constants or lists; plain tensor
    arguments become inputs. Absent arguments before the last input get their defaults
    written out, so that inputs fill absent arguments unambiguously."""
    if len(n.args) > len(args):
        raise UnsupportedError(f"{n.name}: {len(n.args)} arguments, the schema has {len(args)}")
    given: dict[str, Any] = {args[i].name: a for i, a in enumerate(n.args)}
    if n.kwargs:
        unknown = set(n.kwargs) - {a.name for a in args}
        if unknown:
            raise UnsupportedError(f"{n.name}: unknown argument(s) {', '.join(sorted(unknown))}")
        given.update(n.kwargs)
    attrs_: dict[str, Any] = {}
    last_input = -1
    for pos, arg in enumerate(args):
        if arg.name not in given:
            continue
        a = given[arg.name]
        if isinstance(a, torch.fx.Node):
            convert(a)
            last_input = pos
        else:
            attrs_[arg.name] = convert(a)
    for arg in args[:last_input]:
        if arg.name not in given:
            if not arg.has_default:
                raise UnsupportedError(f"{n.name}: argument {arg.name} missing")
            attrs_[arg.name] = arg.default
    return attrs_


_PLAIN_ATTR_TYPES = (int, float, bool, str, InputRef)


def _plain(v):
    if isinstance(v, list):
        return tuple(v)
    return v
