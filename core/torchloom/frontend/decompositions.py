"""torch's decomposition table, with the arithmetic of eager's CPU kernels where it differs
from torch's decompositions (which follow the CUDA kernels).

- ``native_layer_norm`` without a bias: eager's CPU kernel computes ``(x * rstd - mean *
  rstd) * gamma + beta`` with ``gamma = 1`` and ``beta = 0`` where they are not given, so
  a zero result is ``+0.0``; the decomposition's ``(x - mean) * rstd`` gives ``-0.0`` for
  an element ``-0.0`` on a row whose mean is ``+0.0``. On the CPU it adds ``0.0`` last
  (one vector add per element; CUDA's kernel adds no zero, so elsewhere it does not).

Used by the backend (the composites decomposed before aot_autograd's split) and by
``fusion.decompose`` (through ``torchloom.api``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


def decomposition_table(ops: Iterable[Any], device: str | None = None) -> dict[Any, Callable]:
    """``torch._decomp.get_decompositions(ops)`` with the CPU's overrides above. ``device``:
    where the traced op runs (``"cpu"``, ``"cuda"``, ...); None: read from the traced
    input's device at trace time (give it when tracing on meta tensors)."""
    import torch
    from torch._decomp import get_decompositions
    table = get_decompositions(list(ops))
    layer_norm = torch.ops.aten.native_layer_norm.default
    if layer_norm in table:
        table[layer_norm] = _layer_norm_as_cpu(table[layer_norm], device)
    return table


def _layer_norm_as_cpu(decomposed: Callable, device: str | None) -> Callable:
    def native_layer_norm(input, normalized_shape, weight, bias, eps):
        out, mean, rstd = decomposed(input, normalized_shape, weight, bias, eps)
        if bias is None and (device or input.device.type) == "cpu":
            out = out + 0.0
        return out, mean, rstd
    return native_layer_norm
