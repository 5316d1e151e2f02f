"""What a zoo row's step calls, counted per side (issue 41): every matmul and SDPA call with
its operands' shapes, strides and dtypes, the copies between kernels, and the minor page
faults per step (fresh pages: ~1-1.6 us each on the 2-vCPU KVM machine), by aten op.

A ``TorchDispatchMode`` around the step sees the aten calls of eager, of Inductor's
generated wrapper (its ``extern_kernels.mm`` are ``aten.mm.out``) and of torchloom's plan
(its C kernels are not aten calls: their faults count in the step's total only). The mode
says ``ignore_compile_internals``, so Dynamo runs the compiled frames under it instead of
falling back to eager.

    .venv/bin/python benchmarks/zoo_calls.py --model llama --mode train --steps 4

Counts, not times: the numbers hold on a loaded machine (faults follow the allocator's
state, so they vary between processes by a few thousand; compare medians of runs).
"""

from __future__ import annotations

import argparse
import collections
import resource
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import model_zoo as zoo

MATMULS = ("mm", "addmm", "bmm", "baddbmm")
COPIES = ("copy_", "clone", "contiguous", "_to_copy")


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _layout(a) -> str:
    if not isinstance(a, torch.Tensor):
        return repr(a)
    dtype = str(a.dtype).removeprefix("torch.")
    offset = f"+{a.storage_offset()}" if a.storage_offset() else ""
    return f"{dtype}{list(a.shape)}s{list(a.stride())}{offset}"


class StepCalls(TorchDispatchMode):
    """Per step: aten call counts, matmul/SDPA signatures, copies and faults by op."""

    @classmethod
    def ignore_compile_internals(cls):
        return True

    def __init__(self):
        super().__init__()
        self.calls: collections.Counter[str] = collections.Counter()
        self.gemms: collections.Counter[str] = collections.Counter()
        self.faults: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        before = _faults()
        out = func(*args, **kwargs)
        self.faults[str(func)] += _faults() - before
        self.calls[name] += 1
        if name in MATMULS or "scaled_dot_product" in name:
            operands = " ".join(_layout(a) for a in args if isinstance(a, torch.Tensor))
            into = f" out={_layout(kwargs['out'])}" if "out" in kwargs else ""
            self.gemms[f"{func} {operands}{into}"] += 1
        return out


def count(model: str, mode: str, side: str, steps: int) -> tuple[StepCalls, float]:
    torch.set_num_threads(2)
    built = zoo.make_side(model, mode, side, Path(tempfile.mkdtemp(prefix="zoo-calls-")))
    built.step()
    built.step()
    calls, start = StepCalls(), _faults()
    with calls:
        for _ in range(steps):
            built.step()
    return calls, (_faults() - start) / steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama", choices=sorted(zoo.ZOO))
    parser.add_argument("--mode", default="train", choices=("train", "infer"))
    parser.add_argument("--sides", nargs="+", default=list(zoo.SIDES), choices=zoo.SIDES)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--ops", action="store_true", help="also every aten op's calls per step")
    args = parser.parse_args(argv)
    for side in args.sides:
        calls, faults = count(args.model, args.mode, side, args.steps)
        n = args.steps
        print(f"## {side}: {sum(calls.calls.values()) // n} aten calls, "
              f"{sum(calls.gemms.values()) // n} matmul/SDPA calls, "
              f"{faults:.0f} minor faults per step")
        for signature, k in sorted(calls.gemms.items()):
            print(f"{k // n:4d}  {signature}")
        if args.ops:
            print("aten calls per step: " + ", ".join(
                f"{op} {k / n:g}" for op, k in calls.calls.most_common()))
        copies = {c: calls.calls[c] // n for c in COPIES if calls.calls[c]}
        print(f"copies between kernels per step: {copies or 0}")
        top = [(op, f / n) for op, f in calls.faults.most_common(6) if f]
        print("faults per step in aten ops: " +
              (", ".join(f"{op} {f:.0f}" for op, f in top) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
