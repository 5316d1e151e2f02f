"""Guards on input metadata: shape, dtype, device and strides of every tensor input."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchloom.ir.text import format_type
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
