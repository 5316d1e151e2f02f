"""Passes by example: ``pattern_pass(name, pattern, replacement, example_inputs)``.

``pattern`` and ``replacement`` are plain Python functions over tensors (and numbers).
Both are traced with ``make_fx`` on fake tensors of the example inputs' types and
imported by :func:`~torchloom.frontend.fx.import_fx`, as the graphs ``torch.compile``
hands over are, so a pattern written in ``torch.*`` matches the aten graphs of the forward
and the backward::

    SiluPass = pattern_pass("mine.silu", lambda x: x * torch.sigmoid(x),
                            lambda x: torch.nn.functional.silu(x), [torch.randn(8)])

traces to the pattern ``%s = aten.sigmoid.default(%x); %m = aten.mul.Tensor(%x, %s)``
and rewrites it (``aten.silu.default(%x)``) wherever it occurs, in either operand order.

A number among the example inputs is part of the pattern (it matches only an equal
number) unless it is named in ``params``: then it matches any number of its kind (int,
or float which also takes int) and the same one wherever it appears, and the replacement
is traced with the number matched. The replacement is traced again for each distinct
(input types, parameters) it is spliced for (memoized), so its types are exact; dtypes
and shapes in the pattern are generic. Several rules make one pass:
``pattern_pass(name, [Rewrite(p1, r1, inputs), Rewrite(p2, r2, inputs)])``.

Tracing happens on first use (``PassClass.rules()``, running it, or its cache identity),
not at import: errors name the pass and the rule (an untraceable function, a pattern
returning other than one tensor, a replacement whose output count or type differs, a
parameter that never reaches an op's attribute unchanged).
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from torchloom.errors import PluginError
from torchloom.frontend.fx import import_fx
from torchloom.ir.canon import canonical_text
from torchloom.ir.text import format_type
from torchloom.ir import symbols
from torchloom.ir.graph import CONSTANT, Graph
from torchloom.ir.types import TensorType, type_of
from torchloom.passes.pattern import Match, ParamSite, PatternPass, Rule

#: numbers a parameter is traced with, so the pattern shows where it lands
_FLOAT_SENTINEL = 7.234567891011e-05
_INT_SENTINEL = 7234567891
_NAME = re.compile(r"[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*\Z")


@attrs.frozen
class Rewrite:
    """One rule of a pattern pass: see :func:`pattern_pass` for the fields."""

    pattern: Callable = attrs.field(eq=False)
    replacement: Callable = attrs.field(eq=False)
    example_inputs: tuple = attrs.field(converter=tuple, eq=False)
    check: Callable[[Match], bool] | None = attrs.field(default=None, eq=False)
    params: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    name: str | None = None


def pattern_pass(name: str, pattern: Callable | Sequence[Rewrite],
                 replacement: Callable | None = None, example_inputs: Sequence | None = None,
                 *, check: Callable[[Match], bool] | None = None, params: Sequence[str] = (),
                 doc: str | None = None) -> type[PatternPass]:
    """A :class:`~torchloom.api.Pass` class rewriting ``pattern`` into ``replacement``.

    ``example_inputs``: one per argument of ``pattern`` (tensors, numbers); they drive the
    trace only. ``check(match)`` (a :class:`Match`: ``values`` by argument name,
    ``params``, ``nodes``, ``root``) may refuse a match. ``params``: arguments that are
    numbers matching any number (see the module docstring). ``pattern`` may instead be a
    list of :class:`Rewrite` rules (then ``replacement`` and ``example_inputs`` are None):
    all are matched in one walk of the graph. Stats: ``rewritten`` (and per rule
    ``rewritten.<rule>`` when there are several), ``refused`` by ``check``, ``declined``
    (the replacement did not fit: a note says why), ``kept`` (matched nodes left because
    something else reads them)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise PluginError(f"pattern_pass: name {name!r} must be a pass name such as "
                          f"'mine.silu' (lowercase, dotted)")
    if isinstance(pattern, (list, tuple)):
        if replacement is not None or example_inputs is not None or check or params:
            raise PluginError(f"pattern pass {name}: give a list of Rewrite rules alone "
                              f"(check and params go in each Rewrite)")
        rules = list(pattern)
        if not rules or not all(isinstance(r, Rewrite) for r in rules):
            raise PluginError(f"pattern pass {name}: a list of rules must hold Rewrite "
                              f"objects, at least one")
    else:
        if replacement is None or example_inputs is None:
            raise PluginError(f"pattern pass {name}: pattern_pass(name, pattern, "
                              f"replacement, example_inputs) needs all four")
        rules = [Rewrite(pattern, replacement, example_inputs, check, tuple(params))]
    names = [r.name or _rule_name(r.pattern, i, len(rules)) for i, r in enumerate(rules)]
    if len(set(names)) != len(names):
        raise PluginError(f"pattern pass {name}: two rules are named alike ({names}); "
                          f"give each Rewrite a name")

    @functools.cache
    def traced() -> tuple[Rule, ...]:
        return tuple(_trace_rule(name, rule_name, rule)
                     for rule_name, rule in zip(names, rules))

    caller = sys._getframe(1).f_globals.get("__name__", __name__)
    title = "".join(part.title() for part in re.split(r"[.\-_]", name)) + "Pattern"
    namespace = {"name": name, "traced": staticmethod(traced), "__module__": caller,
                 "__qualname__": title, "__annotations__": {},
                 "__doc__": doc or f"Pattern pass {name}: {', '.join(names)}."}
    return attrs.frozen(type(title, (PatternPass,), namespace))


def _rule_name(fn: Callable, i: int, count: int) -> str:
    fn_name = getattr(fn, "__name__", "")
    if fn_name and fn_name != "<lambda>":
        return fn_name
    return "pattern" if count == 1 else f"rule{i}"


def _trace_rule(pass_name: str, rule_name: str, rule: Rewrite) -> Rule:
    where = f"pattern pass {pass_name}, rule {rule_name}"
    arg_names = _arg_names(rule.pattern, len(rule.example_inputs), f"{where}: the pattern")
    _arg_names(rule.replacement, len(rule.example_inputs), f"{where}: the replacement")
    kinds = _param_kinds(rule, arg_names, where)
    sentinels = [_sentinel(kinds[n], i) if n in kinds else x
                 for i, (n, x) in enumerate(zip(arg_names, rule.example_inputs))]
    pattern = _trace(rule.pattern, sentinels, f"{where}: the pattern")
    nodes = list(pattern.nodes)
    if (len(pattern.outputs) != 1 or pattern.outputs[0].producer is None
            or pattern.outputs[0].producer.op == CONSTANT
            or not isinstance(pattern.outputs[0].type, TensorType)):
        raise PluginError(f"{where}: the pattern must compute and return one tensor "
                          f"(it returns {len(pattern.outputs)} value(s), traced as "
                          f"{[n.op for n in nodes]})")
    sites = tuple(_sites(nodes, kinds, arg_names))
    missing = sorted(set(kinds) - {s.name for s in sites})
    if missing:
        raise PluginError(f"{where}: parameter(s) {', '.join(missing)} reach no op attribute "
                          f"unchanged (use them as an op's number, not in Python arithmetic)")
    example_types = tuple(type_of(x) if _is_tensor(x) else None for x in rule.example_inputs)
    replacement = _trace(rule.replacement, list(rule.example_inputs),
                         f"{where}: the replacement")
    if len(replacement.outputs) != 1:
        raise PluginError(f"{where}: the replacement returns {len(replacement.outputs)} "
                          f"values, the pattern 1")
    if replacement.outputs[0].type != pattern.outputs[0].type:
        raise PluginError(f"{where}: the replacement returns "
                          f"{_shown(replacement.outputs[0].type)}, the pattern "
                          f"{_shown(pattern.outputs[0].type)} (on the example inputs)")
    for p, r, arg in zip(pattern.inputs, replacement.inputs, arg_names):
        if r.uses and not p.uses:
            raise PluginError(f"{where}: the replacement reads {arg}, which the pattern "
                              f"does not use (it would be unbound)")
    identity = "\n".join([canonical_text(pattern), canonical_text(replacement),
                          repr(sorted(kinds.items())),
                          getattr(rule.check, "__qualname__", repr(rule.check))])

    def instantiate(types: tuple, values: tuple) -> Graph | str:
        # 2 == 2.0 as keys: keep each number's type in the cache key
        return _instantiate(types, tuple((type(v).__name__, v) for v in values))

    @functools.lru_cache(maxsize=256)
    def _instantiate(types: tuple, typed: tuple) -> Graph | str:
        values = tuple(v for _, v in typed)
        bound = dict(zip(kinds, values))
        args = [bound.get(n, x) for n, x in zip(arg_names, rule.example_inputs)]
        if values == () and types == example_types:
            return replacement
        shaped = [t for t in types if isinstance(t, TensorType)]
        try:
            if not all(t.is_static for t in shaped):
                return _trace_symbolic(rule.replacement, types, args,
                                       f"{where}: the replacement")
            examples = [_example_of(t) if isinstance(t, TensorType) else a
                        for t, a in zip(types, args)]
            return _trace(rule.replacement, examples, f"{where}: the replacement")
        except PluginError as exc:
            return str(exc)

    return Rule(rule_name, pattern, arg_names, kinds, sites, instantiate, rule.check,
                identity)


def _arg_names(fn: Callable, count: int, what: str) -> tuple[str, ...]:
    if not callable(fn):
        raise PluginError(f"{what} is {fn!r}, not a function")
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as exc:
        raise PluginError(f"{what} has no signature to read: {exc}") from None
    if len(parameters) != count or any(p.kind not in (p.POSITIONAL_ONLY,
                                                      p.POSITIONAL_OR_KEYWORD)
                                       for p in parameters):
        raise PluginError(f"{what} takes {len(parameters)} argument(s) "
                          f"({', '.join(p.name for p in parameters)}); there are {count} "
                          f"example inputs, one per positional argument")
    return tuple(p.name for p in parameters)


def _param_kinds(rule: Rewrite, arg_names: tuple[str, ...], where: str) -> dict[str, str]:
    kinds: dict[str, str] = {}
    for p in rule.params:
        if p not in arg_names:
            raise PluginError(f"{where}: parameter {p!r} is not an argument of the pattern "
                              f"({', '.join(arg_names)})")
        x = rule.example_inputs[arg_names.index(p)]
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise PluginError(f"{where}: parameter {p!r} must have a number (int or float) "
                              f"as its example input, not {type(x).__name__}")
        kinds[p] = "float" if isinstance(x, float) else "int"
    for n, x in zip(arg_names, rule.example_inputs):
        if not _is_tensor(x) and not isinstance(x, (bool, int, float)):
            raise PluginError(f"{where}: example input {n} is a {type(x).__name__}; give "
                              f"tensors and numbers")
    return kinds


def _sentinel(kind: str, i: int) -> int | float:
    return _FLOAT_SENTINEL * (i + 1) if kind == "float" else _INT_SENTINEL + i


def _sites(nodes, kinds: dict[str, str], arg_names: tuple[str, ...]):
    """Where the parameters' sentinels landed in the traced pattern's attributes."""
    wanted = {(type(x), x): n for n, kind in kinds.items()
              for x in [_sentinel(kind, arg_names.index(n))]}

    def walk(value, path):
        if isinstance(value, tuple):
            for j, x in enumerate(value):
                yield from walk(x, path + (j,))
        elif isinstance(value, (int, float)) and (type(value), value) in wanted:
            yield path, wanted[(type(value), value)]

    for i, node in enumerate(nodes):
        for key, value in node.attrs.items():
            for path, pname in walk(value, ()):
                yield ParamSite(i, key, path, pname, kinds[pname])


def _shown(t) -> str:
    """A traced type as text, without the meta device it was traced on."""
    return format_type(t.with_(device="cpu") if isinstance(t, TensorType) else t)


def _is_tensor(x: Any) -> bool:
    import torch
    return isinstance(x, torch.Tensor)


def _example_of(t: TensorType):
    import torch
    return torch.empty_strided(t.shape, t.actual_strides() or (), dtype=t.torch_dtype,
                               device="meta") if t.strides is not None else \
        torch.empty(t.shape, dtype=t.torch_dtype, device="meta")


def _trace_symbolic(fn: Callable, types: tuple, args: list, what: str) -> Graph | str:
    """``fn`` traced on fake tensors whose sizes are the types' symbols (a ShapeEnv's, each
    with a distinct large hint), its types renamed back to the IR's symbols; a reason
    instead when a dim is an expression or unknown, strides are given, or the trace
    specialized a size (a guard: valid only for some sizes)."""
    import torch
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    shaped = [t for t in types if isinstance(t, TensorType)]
    dims = [d for t in shaped for d in t.shape]
    if any(t.strides is not None for t in shaped) or None in dims or any(
            isinstance(d, str) and not symbols.is_symbol(d) for d in dims):
        return "symbolic sizes other than plain symbols of contiguous tensors"
    shape_env = ShapeEnv(duck_shape=False)
    fake_mode = FakeTensorMode(shape_env=shape_env)
    sizes: dict[str, Any] = {}
    for k, d in enumerate(dict.fromkeys(d for d in dims if isinstance(d, str))):
        hint = 1009 + 16 * k  # larger than the static dims here, distinct
        sizes[d] = shape_env.create_symintnode(
            shape_env.create_symbol(hint, ConstantSource(f"torchloom_pattern_{k}")), hint=hint)
    try:
        with fake_mode:
            fakes = [torch.empty([sizes.get(d, d) for d in t.shape], dtype=t.torch_dtype,
                                 device="meta") if isinstance(t, TensorType) else a
                     for t, a in zip(types, args)]
            gm = _make_fx_real(fn)(*fakes)
        imported = import_fx(gm, fakes, name="pattern")
    except Exception as exc:
        raise PluginError(f"{what} cannot be traced at symbolic sizes: "
                          f"{type(exc).__name__}: {exc}") from exc
    if shape_env.guards or shape_env.replacements:
        return "the replacement specializes a symbolic size"
    names = {str(s.node.expr): d for d, s in sizes.items()}
    graph = imported.graph
    for v in [*graph.inputs, *(o for n in graph.nodes for o in n.outputs)]:
        t = v.type
        if not isinstance(t, TensorType) or t.is_static:
            continue
        if any(s not in names for d in (*t.shape, *(t.strides or ()))
               for s in symbols.symbols_of(d)):
            return "the replacement has a size that is no input's symbol"
        strides = None if t.strides is None else tuple(symbols.rename_dim(d, names)
                                                       for d in t.strides)
        graph.set_type(v, TensorType(tuple(symbols.rename_dim(d, names) for d in t.shape),
                                     t.dtype, t.device, strides))
    return graph


def _make_fx_real(fn: Callable):
    from torch.fx.experimental.proxy_tensor import make_fx
    return make_fx(fn, tracing_mode="real")


def _trace(fn: Callable, examples: list, what: str) -> Graph:
    """``fn`` traced on fake tensors of the examples' types (on the meta device: the
    graph is data, the types are retargeted where it is spliced)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    try:
        # a fresh fake mode: static shapes even while torch traces the program
        with FakeTensorMode():
            fakes = [_example_of(type_of(x)) if isinstance(x, torch.Tensor) else x
                     for x in examples]
            gm = make_fx(fn, tracing_mode="real")(*fakes)
        imported = import_fx(gm, fakes, name="pattern")
    except Exception as exc:
        raise PluginError(f"{what} cannot be traced: {type(exc).__name__}: {exc}") from exc
    if imported.constants or imported.callables:
        raise PluginError(f"{what} builds tensor constants or calls Python functions "
                          f"(traced {sorted(imported.callables)}); write it in torch ops "
                          f"over its arguments")
    return imported.graph
