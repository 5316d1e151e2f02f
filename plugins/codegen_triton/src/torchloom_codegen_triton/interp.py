"""CPU execution through the Triton interpreter.

The interpreter runs a kernel's Python body on numpy arrays; it implements ``tl.*`` but not
``libdevice``. Generated modules refer to ``libdevice.tanh`` etc.; when a module is loaded
for the interpreter its ``libdevice`` global is replaced by :class:`NumpyLibdevice`, which
computes the same functions with numpy, so one source text serves GPU and CPU. Its ``range``
global is :func:`interpreter_range`, which takes bounds that are interpreter scalars.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

_NUMPY = {
    "tanh": np.tanh, "log1p": np.log1p, "expm1": np.expm1, "pow": np.power,
    "rsqrt": lambda x: np.float32(1) / np.sqrt(x) if x.dtype == np.float32 else 1 / np.sqrt(x),
    "trunc": np.trunc, "nearbyint": np.rint, "fmod": np.fmod, "copysign": np.copysign,
}


class NumpyLibdevice:
    """Stand-in for ``triton.language.extra.libdevice`` inside the interpreter."""

    def __getattr__(self, name: str):
        fn = _NUMPY.get(name)
        if fn is None:
            raise AttributeError(f"libdevice.{name} has no interpreter implementation")

        def call(*args):
            import triton.language as tl
            from triton.runtime.interpreter import TensorHandle
            tensors = [a for a in args if isinstance(a, tl.tensor)]
            first = max(tensors, key=lambda t: t.handle.data.size)
            arrays = [a.handle.data if isinstance(a, tl.tensor) else a for a in args]
            with np.errstate(all="ignore"):
                out = np.asarray(fn(*arrays)).astype(first.handle.data.dtype)
            return tl.tensor(TensorHandle(out, first.dtype.scalar), first.type)
        return call


def interpreter_range(*bounds):
    """``range`` for a kernel body in the interpreter, whose scalars (program ids, size
    arguments) are one-element arrays: Triton 3.6 turns them into loop bounds with
    ``int(array)``, which NumPy 2.4 refuses for an array of one dimension; ``item()`` takes
    any one-element array."""
    import triton.language as tl
    return range(*(int(b.handle.data.item()) if isinstance(b, tl.tensor) else b
                   for b in bounds))


def import_source(path: Path, name: str, interpret: bool) -> ModuleType:
    """Import the generated module at ``path``; with ``interpret``, as interpreter kernels."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    with _interpreting(interpret):
        sys.modules[name] = module  # triton resolves a kernel's globals through its module
        try:
            spec.loader.exec_module(module)
        finally:
            sys.modules.pop(name, None)
    if interpret:
        module.libdevice = NumpyLibdevice()
        module.range = interpreter_range
    return module


@contextlib.contextmanager
def _interpreting(on: bool):
    """``@triton.jit`` builds interpreter functions (``on``) or compiled ones (not ``on``)
    while this is active, whatever TRITON_INTERPRET says (a scoped knob)."""
    from triton import knobs
    if knobs.runtime.interpret == on:
        yield
        return
    with knobs.runtime.scope():
        knobs.runtime.interpret = on
        yield
