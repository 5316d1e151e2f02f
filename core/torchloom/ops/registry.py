"""The op registry: what each op is (category), how to call it, what it returns and
what it aliases or mutates.

Aten ops are described from their torch schema and tags (see :mod:`torchloom.ops.aten`);
plugins register their own ops through the ``torchloom_ops`` hook. An op that no table
knows still gets an ``opaque`` definition, so it imports and runs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import _disable_current_modes

from torchloom.ir.graph import InputRef, Node
from torchloom.ir.types import ScalarType, TensorType, Type, attrs_key, type_of

CATEGORIES = ("pointwise", "reduction", "view", "layout", "opaque", "random", "mutating")

#: infer(node) -> output types, or None when they cannot be inferred (symbolic shapes)
InferFn = Callable[[Node], "list[Type] | None"]


@attrs.frozen
class OpDef:
    """Everything torchloom knows about one op."""

    name: str
    category: str = attrs.field(validator=attrs.validators.in_(CATEGORIES))
    #: the callable that executes the op with torch (None for region ops run by codegens)
    fn: Callable | None = attrs.field(default=None, eq=False)
    schema: Any = attrs.field(default=None, eq=False, repr=False)
    #: output i aliases the schema argument named here (views)
    aliases: Mapping[int, str] = attrs.field(factory=dict)
    #: schema arguments written in place
    mutates: frozenset[str] = frozenset()
    infer: InferFn | None = attrs.field(default=None, eq=False, repr=False)
    #: the callable returns a tuple/list that the node's outputs unpack
    returns_sequence: bool = False
    #: extra facts for passes and codegens (e.g. {"composite": True})
    traits: frozenset[str] = frozenset()
    #: cache of type inference, owned by this definition (not module-global)
    _memo: dict = attrs.field(factory=dict, eq=False, repr=False)
    #: torch's Python binding of the same op (``torch.mm`` for ``aten.mm.default``): it
    #: skips the boxed call of ``fn``; used where :meth:`callable_for` proves it equivalent
    public_fn: Callable | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def is_view(self) -> bool:
        return self.category == "view"

    def bind(self, node_inputs: Sequence[Any], attrs_: Mapping[str, Any]):
        """Positional args and kwargs for calling ``fn`` with these input values."""
        return bind_args(self.schema, node_inputs, attrs_)

    def call_template(self, node: Node):
        """``(args, kwargs)`` where ``InputRef(i)`` marks the node's i-th input."""
        refs = [InputRef(i) for i in range(len(node.inputs))]
        return bind_args(self.schema, refs, node.attrs)

    def mutated_inputs(self, node: Node) -> list[int]:
        """Indices into ``node.inputs`` that the op writes."""
        return _input_indices(self, node, self.mutates)

    def aliased_input(self, node: Node, output: int) -> int | None:
        """Index into ``node.inputs`` that output ``output`` is a view of, if any."""
        name = self.aliases.get(output, self.aliases.get(-1))
        if name is None:
            return None
        found = _input_indices(self, node, {name})
        return found[0] if found else None

    def callable_for(self, node: Node) -> Callable | None:
        """The fastest callable that runs exactly this op for ``node``'s call.

        ``public_fn`` parses its arguments and picks an overload by their types; it is used
        only when, called on meta tensors with the node's arguments, it reaches exactly
        this overload (checked once per input types and attributes)."""
        if self.public_fn is None:
            return self.fn
        try:
            key = ("callable", tuple(v.type for v in node.inputs), attrs_key(node.attrs))
            hash(key)
        except TypeError:  # an unhashable attribute
            return self.fn
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = (self.public_fn if _reaches(self, node) else self.fn,)
        return found[0]

    def infer_types(self, node: Node) -> list[Type] | None:
        if self.infer is not None:
            return self.infer(node)
        return meta_infer(self, node)


def bind_args(schema, inputs: Sequence[Any], attrs_: Mapping[str, Any]):
    """Rebuild a call from a node: inputs fill, in order, the schema arguments absent from
    ``attrs``; ``InputRef`` elements inside attribute lists are replaced by inputs.
    Schema-less ops take ``attrs['args']``/``attrs['kwargs']`` templates or plain inputs."""

    def resolve(v):
        if isinstance(v, InputRef):
            return inputs[v]
        if isinstance(v, tuple):
            return [resolve(x) for x in v]
        return v

    if schema is None:
        if "args" in attrs_:
            args = [resolve(a) for a in attrs_["args"]]
            kwargs = {k: resolve(v) for k, v in dict(attrs_.get("kwargs", ())).items()}
            return args, kwargs
        return list(inputs), {}
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    # inputs that attribute lists refer to (``$i``) do not fill plain tensor arguments
    it = iter(_plain_input_slots(len(inputs), attrs_))
    positional = True
    for arg in schema.arguments:
        if arg.name in attrs_:
            value = resolve(attrs_[arg.name])
        else:
            i = next(it, None)
            if i is None:
                positional = False
                continue
            value = inputs[i]
        if positional and not arg.kwarg_only:
            args.append(value)
        else:
            kwargs[arg.name] = value
    return args, kwargs


def _input_refs(value, found: set[int]) -> None:
    if isinstance(value, InputRef):
        found.add(int(value))
    elif isinstance(value, tuple):
        for x in value:
            _input_refs(x, found)


def _plain_input_slots(count: int, attrs_: Mapping[str, Any]) -> list[int]:
    """Input indices not referenced by any ``$i`` in the attributes, in order."""
    referenced: set[int] = set()
    for v in attrs_.values():
        _input_refs(v, referenced)
    if not referenced:
        return list(range(count))
    return [i for i in range(count) if i not in referenced]


def _input_indices(op: OpDef, node: Node, names) -> list[int]:
    if not names or op.schema is None:
        return []
    out: list[int] = []
    slots = iter(_plain_input_slots(len(node.inputs), node.attrs))
    for arg in op.schema.arguments:
        if arg.name in node.attrs:
            if arg.name in names:
                found: set[int] = set()
                _input_refs(node.attrs[arg.name], found)
                out.extend(sorted(found))
            continue
        i = next(slots, None)
        if i is None:
            break
        if arg.name in names:
            out.append(i)
    return out


def _meta(t: Type):
    if isinstance(t, TensorType):
        if not t.is_static:
            raise _Symbolic
        return torch.empty_strided(t.shape, t.actual_strides(), dtype=t.torch_dtype,
                                   device="meta")
    raise _Symbolic


def _fake(t: TensorType):
    """A tensor of type ``t`` (created inside a ``FakeTensorMode``: no memory)."""
    if not t.is_static:
        raise _Symbolic
    return torch.empty_strided(t.shape, t.actual_strides(), dtype=t.torch_dtype,
                               device=t.device)


class _Symbolic(Exception):
    pass


def meta_infer(op: OpDef, node: Node) -> list[Type] | None:
    """Infer output types by running ``op.fn`` on fake tensors of the node's own devices
    (memoised per op).

    Fake tensors, not plain ``meta`` ones: some CPU kernels return other dtypes or shapes
    than the meta kernels say (bf16 ``native_layer_norm`` gives bf16 mean/rstd on CPU,
    f32 on meta; eval-mode batch norm on CPU saves empty statistics), and torch's fake
    implementations follow the device, as the FX graphs that torch.compile hands us do."""
    if op.fn is None:
        return None
    try:  # 1, 1.0 and True differ in the key: they infer different dtypes
        key = (tuple(v.type for v in node.inputs), attrs_key(node.attrs))
        return op._memo[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable attribute: inferred every time
        key = None
    try:
        # no fallback kernels: an op without a meta or fake kernel is not run for real
        with FakeTensorMode(allow_fallback_kernels=False), torch.no_grad():
            fakes = [_fake(v.type) if isinstance(v.type, TensorType) else
                     _scalar_example(v.type) for v in node.inputs]
            args, kwargs = op.bind(fakes, node.attrs)
            result = op.fn(*args, **kwargs)
    except _Symbolic:
        return None
    except Exception:  # an op that has no fake kernel: its types cannot be checked
        return None
    if result is None:  # an op that returns nothing (_assert_scalar of a symbolic bound)
        results = []
    else:
        results = list(result) if op.returns_sequence else [result]
    device = device_of(node)
    types = [_retarget(type_of(r), device) for r in results]
    if key is not None:
        op._memo[key] = types
    return types


def eager_rejects(op: OpDef, node: Node) -> str | None:
    """Eager's error for ``node``'s call where its CPU kernels do not take these dtypes
    (``"abs_cpu" not implemented for 'Bool'``: fake tensors accept such calls, so a graph
    reaches a compiler that would compute something where eager raises). Found by running
    ``op.fn`` on small CPU tensors of the node's dtypes and ranks (memoised per op); None
    when that runs, fails otherwise (a size it cannot take says nothing of dtypes), or the
    node is on another device. For pure ops only: callers ask it of pointwise ops,
    reductions and composites of them, never of collectives or I/O."""
    if op.fn is None or device_of(node) != "cpu":
        return None
    try:
        key = ("rejects", tuple((len(v.type.shape), v.type.dtype) if isinstance(
            v.type, TensorType) else v.type for v in node.inputs), attrs_key(node.attrs))
        return op._memo[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable attribute
        return None
    tensor_types = [v.type for v in node.inputs if isinstance(v.type, TensorType)]
    failed = _small_call(op, node, None)
    found = None
    if isinstance(failed, (NotImplementedError, RuntimeError)):
        message = str(failed).strip().split("\n")[0]
        # a dtype the kernel lacks: its own words, or the same call in f32 runs
        if "not implemented for" in message or (
                any(t.dtype != "f32" for t in tensor_types)
                and _small_call(op, node, torch.float32) is None):
            found = message
    op._memo[key] = found
    return found


def _small_call(op: OpDef, node: Node, dtype) -> Exception | None:
    """What calling ``op.fn`` on small CPU tensors (every dim 2: ``var`` of one element
    prints a C++ warning) of the node's ranks (and dtypes, or ``dtype``) raises, or None."""
    try:
        # real tensors, real kernels: not the fake or tracing modes torch.compile may
        # have active around a backend; no Python warnings either
        with _disable_current_modes(), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tensors = [torch.ones((2,) * len(v.type.shape), dtype=dtype or v.type.torch_dtype)
                       if isinstance(v.type, TensorType) else _scalar_example(v.type)
                       for v in node.inputs]
            args, kwargs = op.bind(tensors, node.attrs)
            op.fn(*args, **kwargs)
    except Exception as exc:
        return exc
    return None


def _reaches(op: OpDef, node: Node) -> bool:
    """Whether ``op.public_fn`` with this node's arguments dispatches to ``op`` itself first."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[tuple[str, tuple, dict]] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append((str(func), args, kwargs or {}))
            return func(*args, **(kwargs or {}))

    try:
        metas = [_meta(v.type) if isinstance(v.type, TensorType) else _scalar_example(v.type)
                 for v in node.inputs]
        args, kwargs = op.bind(metas, _meta_attrs(node.attrs))
        with torch.no_grad(), Record():
            op.public_fn(*args, **kwargs)
    except Exception:  # symbolic types, no meta kernel, a binding that rejects the call
        return False
    if not seen or seen[0][0] not in (op.name, op.name + ".default"):
        return False
    # the binding's own defaults may differ from the schema's: torch._C._nn.mse_loss(a, b)
    # reduces nothing where aten.mse_loss.default(a, b) takes the mean
    return _scalars(op.schema, seen[0][1], seen[0][2]) == _scalars(op.schema, args, kwargs)


def _scalars(schema, args, kwargs) -> list:
    """The call's non-tensor argument values, schema defaults filled in, in schema order."""
    out = []
    for i, arg in enumerate(schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            value = args[i]
        elif arg.name in kwargs:
            value = kwargs[arg.name]
        else:
            value = arg.default_value if arg.has_default_value() else None
        out.append(None if isinstance(value, torch.Tensor) else repr(value))
    return out


def _scalar_example(t: Type):
    # an int value (a SymInt: a size of a dynamic graph) may be any size: a shape
    # inferred from an example of it would be wrong, so types depending on it are
    # not inferred (the FX graph's own types are kept)
    if isinstance(t, ScalarType) and t.kind in ("float", "bool"):
        return {"float": 1.0, "bool": True}[t.kind]
    raise _Symbolic


def _meta_attrs(attrs_: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (torch.device("meta") if isinstance(v, torch.device) else v)
            for k, v in attrs_.items()}


def device_of(node: Node) -> str:
    """The device ``node`` runs on: its ``device`` attribute, else its first tensor
    input's, else ``cpu``."""
    dev = node.attrs.get("device")
    if isinstance(dev, torch.device):
        return str(dev)
    for v in node.inputs:
        if isinstance(v.type, TensorType):
            return v.type.device
    return "cpu"


def _retarget(t: Type, device: str) -> Type:
    if isinstance(t, TensorType):
        return attrs.evolve(t, device=device)
    return t


class OpRegistry:
    """Maps op names to :class:`OpDef`. Lookups of unknown names create opaque defs.

    Names resolve only through what was registered (plugins' ``torchloom_ops``, the
    frontend for the Python callables of the FX graph it imports) and the ``resolver``
    (torch's op tables): a name read from IR text never makes the registry import or call
    anything it names."""

    def __init__(self, resolver: Callable[[str], OpDef | None] | None = None):
        self._defs: dict[str, OpDef] = {}
        #: opaque stand-ins handed out for names nothing defines (not registrations)
        self._unknown: dict[str, OpDef] = {}
        self._resolver = resolver

    def register(self, opdef: OpDef, *, replace: bool = False) -> None:
        if opdef.name in self._defs and not replace:
            raise ValueError(f"op {opdef.name!r} is already registered")
        self._unknown.pop(opdef.name, None)
        self._defs[opdef.name] = opdef

    def __contains__(self, name: str) -> bool:
        return name in self._defs

    def lookup(self, name: str) -> OpDef | None:
        """The definition of ``name`` if it is registered or torch defines it, else None."""
        found = self._defs.get(name)
        if found is None and name not in self._unknown and self._resolver is not None:
            found = self._resolver(name)
            if found is not None:
                self._defs[name] = found
        return found

    def get(self, name: str) -> OpDef:
        """The definition of ``name``; unknown ops become opaque (without a callable)."""
        found = self.lookup(name)
        if found is None:
            found = self._unknown.get(name)
            if found is None:
                found = self._unknown[name] = OpDef(name, "opaque")
        return found

    def category(self, name: str) -> str:
        return self.get(name).category

    def names(self) -> list[str]:
        return sorted({*self._defs, *self._unknown})
