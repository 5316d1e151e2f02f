"""The aten table: categories for torch ops, derived from schemas and tags, with a small
override table where tags say too little.

Name forms: ``aten.add.Tensor`` (an overload), ``aten.gelu`` (means ``.default``),
``prims.convert_element_type.default``, any ``namespace.op.overload`` of ``torch.ops``,
and ``higher_order.<name>`` for torch's higher-order operators (``higher_order.cond``).
A name resolves only to an operator of torch's tables (an ``OpOverload`` or a
``HigherOrderOperator``), never to another attribute reached through ``torch.ops``.

``python.<module>.<attr>`` names plain Python callables (``python.operator.getitem``).
They are never imported by name: the frontend registers the call targets of the FX graph
it imports, plugins register theirs, and :data:`SAFE_PYTHON_OPS` (pure functions that
IR text may name, as reproducers and golden tests do) is registered up front.
"""

from __future__ import annotations

import operator

import torch

from torchloom.ir.torch_ops import find_callable
from torchloom.ops.device_types import with_device_rules
from torchloom.ops.registry import OpDef, OpRegistry

#: categories the tags get wrong or leave out
CATEGORY_OVERRIDES: dict[str, str] = {
    "aten._to_copy.default": "pointwise",       # a cast; fusion checks that the device stays
    "aten._unsafe_view.default": "view",         # a view without alias annotations
    "aten.clone.default": "pointwise",
    "aten.full_like.default": "pointwise",      # a constant of its input's shape
    "aten.copy.default": "layout",
    "aten.lift_fresh_copy.default": "layout",
    "aten.contiguous.default": "layout",
    "aten.native_dropout.default": "random",
    "aten.sum.default": "reduction",
    "aten.var_mean.correction": "reduction",
    "aten.std.correction": "reduction",
    "aten.max.dim": "reduction",
    "aten.min.dim": "reduction",
    "aten.logsumexp.default": "reduction",
    "prims.convert_element_type.default": "pointwise",
}

#: views that return a list of tensors
_SEQUENCE_VIEWS = ("split", "unbind", "chunk", "split_with_sizes", "tensor_split")


#: Python callables every registry knows: pure, and harmless whatever text passes them
SAFE_PYTHON_OPS: dict[str, object] = {
    "python.operator.getitem": operator.getitem,  # FX's tuple plumbing
}


def resolve(name: str) -> OpDef | None:
    """Build the OpDef for the torch operator named ``name`` (None if torch has none)."""
    target = find_callable(name)
    if target is None:
        return None
    if isinstance(target, torch._ops.OpOverload):
        return opdef_for_overload(name, target)
    return OpDef(name, "opaque", fn=target)


def category_of(name: str, op: torch._ops.OpOverload) -> str:
    if name in CATEGORY_OVERRIDES:
        return CATEGORY_OVERRIDES[name]
    schema = op._schema
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return "mutating"
    tags = set(op.tags)
    if torch.Tag.nondeterministic_seeded in tags:
        return "random"
    if any(r.alias_info is not None for r in schema.returns):
        return "view"
    if torch.Tag.pointwise in tags:
        return "pointwise"
    if torch.Tag.reduction in tags:
        return "reduction"
    return "opaque"


def opdef_for_overload(name: str, op: torch._ops.OpOverload) -> OpDef:
    schema = op._schema
    category = category_of(name, op)
    written = frozenset(a.name for a in schema.arguments
                        if a.alias_info is not None and a.alias_info.is_write)
    aliases: dict[int, str] = {}
    for i, ret in enumerate(schema.returns):
        if ret.alias_info is None:
            continue
        for arg in schema.arguments:
            if arg.alias_info is not None and arg.alias_info.before_set == ret.alias_info.before_set:
                # a list return (split, unbind) aliases the argument with every element
                aliases[-1 if _returns_list(schema) else i] = arg.name
                break
    if category == "view" and not aliases:  # _unsafe_view; list views (split) alias the lot
        aliases = {-1 if _returns_list(schema) else 0: schema.arguments[0].name}
    fn = getattr(op, "_op", op)  # the C++ entry point: no Python frame per call
    return with_device_rules(OpDef(
        name, category, fn=fn, schema=schema, aliases=aliases, mutates=written,
        returns_sequence=len(schema.returns) != 1 or _returns_list(schema),
        public_fn=_public_binding(op)))


def _public_binding(op: torch._ops.OpOverload):
    """torch's generated Python binding of an aten op (``torch.mm``, ``Tensor.view``), if any.

    It is faster to call than the boxed ``OpOverload``; ``OpDef.callable_for`` checks per
    node that it resolves to the same overload."""
    if op.namespace != "aten":
        return None
    packet = op._schema.name.split("::")[-1]
    for holder in (torch._C._VariableFunctions, torch._C._nn, torch._C.TensorBase):
        fn = getattr(holder, packet, None)
        if fn is not None:
            return fn
    return None


def _returns_list(schema) -> bool:
    return len(schema.returns) == 1 and isinstance(schema.returns[0].type, torch.ListType)


def default_registry() -> OpRegistry:
    """A registry that resolves torch ops by name and knows :data:`SAFE_PYTHON_OPS`.
    Plugins and the frontend add their ops to it."""
    registry = OpRegistry(resolver=resolve)
    for name, fn in SAFE_PYTHON_OPS.items():
        registry.register(OpDef(name, "opaque", fn=fn))
    return registry
