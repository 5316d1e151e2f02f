"""Guards on input metadata: shape, dtype, device and strides of every tensor input.

Inputs with static types are compared with their types directly
(:func:`guard_expressions`). Inputs with symbolic sizes get one generated function
(:func:`symbolic_guard`): dtype, device and rank; every int dim; each symbol bound from
its first dim that is that bare symbol (``symbols.bind_symbols``, as kernels taking sizes
as arguments bind them), and every other dim that names it (``s0`` again,
``2*s0``, ``s0*s1``) evaluated and compared, so inputs whose sizes break a relation the
graph was compiled with (two dims equal, one twice another) fall back rather than compute
something wrong; strides the same way (``is_contiguous`` when they are the contiguous
ones). Torch's own guards (Dynamo's) already pin what the user's inputs may be; these
check what this graph assumed, for any caller.

Static inputs are first checked in one C call (:class:`FastGuard`, over torch's
``TensorGuards``, the check Dynamo's guards are made of): ~50 ns a tensor against ~180 ns
for the Python expressions, which then run only when it fails (a graph of 550 inputs, an
optimizer step's, saves ~70 us a call).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchloom.ir.text import format_type
from torchloom.ir.symbols import (bind_symbols, guard_namespace, python_source,
                                  symbolic_contiguous, symbols_of)
from torchloom.ir.types import DTYPES, TensorType, type_of
from torchloom.ir.graph import Value


def guard_expressions(inputs: Sequence[Value], env: dict[str, Any]):
    """Yield ``(input index, python expression true when the guard FAILS)``."""
    for i, v in enumerate(inputs):
        t = v.type
        if not isinstance(t, TensorType) or not t.is_static:
            continue
        env[f"g_dtype{i}"] = DTYPES[t.dtype]
        env[f"g_dev{i}"] = torch.device(t.device)
        if t.device == "cpu":
            device = f"not a{i}.is_cpu"
        elif env[f"g_dev{i}"].index is None:  # "cuda" means any cuda device: type only
            device = f"a{i}.device.type != {env[f'g_dev{i}'].type!r}"
        else:
            device = f"a{i}.device != g_dev{i}"
        checks = [f"a{i}.shape != {tuple(t.shape)!r}", f"a{i}.dtype is not g_dtype{i}", device]
        if t.strides is None:
            checks.append(f"not a{i}.is_contiguous()")
        else:
            checks.append(_stride_check(f"a{i}", t))
        yield i, " or ".join(checks)


def _tensor_guards():
    """torch's C tensor check (``torch._C._dynamo.guards.TensorGuards``), or None in a torch
    without it."""
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:
        return None
    return TensorGuards


class FastGuard:
    """A C check that the static inputs are laid out as on the last call that passed the
    exact guards: ``check(*tensors)`` is True only when every tensor has that call's dtype,
    device, dispatch keys and ``requires_grad`` and the shapes and strides of its type
    (strides of dims of size <= 1 unchecked, as :func:`guard_expressions`'s). It is
    stricter than the expressions, never looser: a False sends the call to them, and one
    that passes them is learnt (``learn``, at most :attr:`LEARNS` times, so inputs that
    alternate cost the expressions only)."""

    LEARNS = 4

    def __init__(self, types: Sequence[TensorType]):
        self._sizes = [list(t.shape) for t in types]
        self._strides = [[s if n > 1 else None for n, s in zip(t.shape, t.actual_strides())]
                         for t in types]
        self._learnt = 0
        self.check = _never

    @classmethod
    def of(cls, types: Sequence[TensorType]) -> "FastGuard | None":
        """None where torch has no C check."""
        return None if _tensor_guards() is None else cls(types)

    def learn(self, *tensors) -> None:
        """Check later calls against these tensors (which passed the exact guards), if
        they are plain tensors with storage: a call the C check passes hands its inputs to
        kernels whole (``Launcher.trusting``), whose data pointers are read in C."""
        if self._learnt >= self.LEARNS or not all(map(_plain, tensors)):
            return
        self._learnt += 1
        guards = _tensor_guards()(*tensors, dynamic_dims_sizes=self._sizes,
                                  dynamic_dims_strides=self._strides)
        self.check = guards.check


def _never(*tensors) -> bool:
    return False


def faking() -> bool:
    """Whether a fake tensor mode is active: the tensors a call is given then have no
    memory a kernel could read (a plan runs its original graph under the mode instead)."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None


def _plain(t) -> bool:
    """A dense tensor (or parameter) with storage: not a subclass (fake, functional), not
    a functorch wrapper (``vmap``'s batched tensors are of type ``torch.Tensor``)."""
    return type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided and \
        not torch._C._functorch.is_functorch_wrapped_tensor(t) and \
        not torch._is_functional_tensor(t)


def symbolic_guard(inputs: Sequence[Value], env: dict[str, Any]) -> str | None:
    """A call expression (its function put in ``env``) that gives the index of the first
    tensor input with symbolic sizes whose metadata breaks its type, or None when all
    agree; None instead of an expression when no input has symbolic sizes. Parameters
    are named ``a{i}`` after the input's position, as :func:`guard_expressions`'s."""
    symbolic, bound = _symbolic(inputs)
    if not symbolic:
        return None
    ns: dict[str, Any] = dict(guard_namespace())
    lines = [f"def check({', '.join(f'a{i}' for i, _ in symbolic)}):"]
    for i, t in symbolic:  # dtype, device and rank first: the dims below index the shape
        ns[f"g_dtype{i}"] = DTYPES[t.dtype]
        device = (f"not a{i}.is_cpu" if t.device == "cpu" else
                  f"a{i}.device.type != {torch.device(t.device).type!r}")
        lines.append(f"    if a{i}.dtype is not g_dtype{i} or {device} or a{i}.dim() != "
                     f"{t.rank}: return {i}")
    lines += [f"    sym_{d} = {read}" for d, read in bound.items()]
    for i, t in symbolic:
        checks, _ = _layout_checks(i, t, bound)
        if checks:
            lines.append(f"    if {' or '.join(checks)}: return {i}")
    lines.append("    return None")
    exec(compile("\n".join(lines) + "\n", "<torchloom symbolic guard>", "exec"), ns)
    env["_symbolic_guard"] = ns["check"]
    return f"_symbolic_guard({', '.join(f'a{i}' for i, _ in symbolic)})"


def layout_checked(inputs: Sequence[Value]) -> list[Value]:
    """The inputs with symbolic sizes whose every size and stride :func:`symbolic_guard`
    checks (over the same ``inputs``): their layout is their type's once it passed."""
    symbolic, bound = _symbolic(inputs)
    return [inputs[i] for i, t in symbolic if _layout_checks(i, t, bound)[1]]


def _symbolic(inputs: Sequence[Value]) -> tuple[list[tuple[int, TensorType]], dict[str, str]]:
    """The tensor inputs with symbolic sizes, by position, and where each symbol is read
    (``a{i}.shape[k]``: the first dim of theirs that is that bare symbol)."""
    symbolic = [(i, v.type) for i, v in enumerate(inputs)
                if isinstance(v.type, TensorType) and not v.type.is_static]
    types = dict(symbolic)
    shapes = [types[i].shape if i in types else None for i in range(len(inputs))]
    return symbolic, {d: f"a{i}.shape[{k}]" for d, (i, k) in bind_symbols(shapes).items()}


def _layout_checks(i: int, t: TensorType, bound: dict[str, str]) -> tuple[list[str], bool]:
    """The conditions under which input ``a{i}`` breaks the sizes and strides of ``t``, and
    whether they check all of them (each dim and stride an int or of bound symbols)."""
    checks = [f"a{i}.shape[{k}] != {_source(d)}" for k, d in enumerate(t.shape)
              if _checkable(d, bound) and bound.get(d) != f"a{i}.shape[{k}]"]
    whole = all(_checkable(d, bound) for d in t.shape)
    if t.strides is None or symbolic_contiguous(t.shape, t.strides):
        checks.append(f"not a{i}.is_contiguous()")
    else:
        checks += [f"(a{i}.shape[{k}] > 1 and a{i}.stride({k}) != {_source(s)})"
                   for k, s in enumerate(t.strides) if _checkable(s, bound)]
        whole = whole and all(_checkable(s, bound) for s in t.strides)
    return checks, whole


def _source(d) -> str:
    return python_source(d, lambda s: f"sym_{s}")


def _checkable(d, bound: dict[str, str]) -> bool:
    """An int dim, or an expression whose every symbol is bound (a symbol that only
    appears inside expressions would need solving for: torch's guards check those)."""
    return d is not None and all(s in bound for s in symbols_of(d))


def _stride_check(arg: str, t: TensorType) -> str:
    """Strides of dims of size <= 1 never matter (torch gives them arbitrary values)."""
    relevant = [k for k, d in enumerate(t.shape) if d > 1]
    if len(relevant) == len(t.shape):
        return f"{arg}.stride() != {tuple(t.strides)!r}"
    if not relevant:
        return "False"
    first, *rest = relevant
    parts = [f"(_s := {arg}.stride())[{first}] != {t.strides[first]}"]
    parts += [f"_s[{k}] != {t.strides[k]}" for k in rest]
    return "(" + " or ".join(parts) + ")"


def describe_mismatch(expected: Value, actual: Any) -> str:
    """One line saying how an input differs from what the graph was compiled for."""
    if not isinstance(actual, torch.Tensor):
        return f"input %{expected.name} is a {type(actual).__name__}, expected a tensor"
    got = type_of(actual)
    want = expected.type
    return (f"input %{expected.name}: compiled for {format_type(want)}, "
            f"called with {format_type(got)}")
