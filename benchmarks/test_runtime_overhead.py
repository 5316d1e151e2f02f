"""Per-call overhead of the runtime on a graph of 200 small opaque ops.

The baseline is eager PyTorch: straight-line Python calling ``torch.mm``/``torch.addmm``
on tiny tensors (what the user's model does without a compiler). The candidate is the
callable torchloom builds for the same graph with the ``none`` pipeline (guards included,
every op its own kernel). Both do the same tensor work, so the ratio measures the
runtime's per-call Python cost. Gate: torchloom / eager <= 1.10, measured in one run.
"""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torchloom.compiler import Compiler

OPS = 200
MAX_RATIO = 1.10


def eager_source(ops: int) -> str:
    lines = ["def eager(x, w, b):"]
    for i in range(ops):
        lines.append("    x = torch.mm(x, w)" if i % 2 == 0 else "    x = torch.addmm(b, x, w)")
    lines.append("    return x")
    return "\n".join(lines) + "\n"


def make_eager():
    namespace = {"torch": torch}
    exec(compile(eager_source(OPS), "<eager>", "exec"), namespace)
    return namespace["eager"]


def test_runtime_overhead_200_opaque_ops(perf_gate):
    eager = make_eager()
    args = (torch.randn(2, 2), torch.randn(2, 2) * 0.5, torch.randn(2))
    gm = make_fx(eager)(*args)
    compiler = Compiler("none")
    compiled = compiler.compile_fx(gm, list(args))
    (comp,) = compiler.compilations
    assert comp.fallback_reason is None and len(comp.graph) == OPS
    assert {n.op for n in comp.graph.nodes} == {"aten.mm.default", "aten.addmm.default"}
    assert all(compiler.registry.category(n.op) == "opaque" for n in comp.graph.nodes)
    torch.testing.assert_close(compiled(*args)[0], eager(*args))
    result = perf_gate(compiled, eager, args=args, min_speedup=1 / MAX_RATIO, rounds=31,
                       iterations=20, names=("torchloom", "eager"))
    assert result.rounds >= 31 and result.low <= result.speedup <= result.high
