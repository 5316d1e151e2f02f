"""A fusion group -> one C function, made of one loop nest or several.

Reductions of a group that reduce different dims (layer_norm's backward: row sums for the
input gradient, column sums for the weight and bias gradients) cannot share one loop. They
are written as consecutive nests in the same function, one per (input shape, reduced dims)
class, each storing the outputs that depend on its reductions; outputs depending on no
reduction go with the first nest. Pointwise values both nests need are recomputed (cheap
next to a round trip through memory). A reduction whose input depends on another class's
result, or an output depending on two classes, would need a buffer between nests: such
groups are declined.
"""

from __future__ import annotations

from typing import Any

from torchloom.api import Node, ScalarType, Value, print_graph, structural_hash

from torchloom_codegen_cpu.kernel import SCALAR_DTYPES, KernelWriter, output_names
from torchloom_codegen_cpu.ops import CTYPE, ITEMSIZE, REDUCTIONS, STORAGE, VIEWS
from torchloom_codegen_cpu.reduction import reduced_dims
from torchloom_codegen_cpu.tensors import Unsupported, tensor_type


def _classes(reductions: list[Node]) -> list[list[Node]]:
    """Reductions grouped by (input shape, reduced dims), in order of first appearance."""
    classes: dict[tuple, list[Node]] = {}
    for n in reductions:
        shape = tuple(tensor_type(n.inputs[0]).shape)
        classes.setdefault((shape, reduced_dims(n, len(shape))), []).append(n)
    return list(classes.values())


def _depends(v: Value, memo: dict[Value, frozenset[int]], of: dict[Node, int]) -> frozenset[int]:
    """The reduction classes ``v`` depends on (inside the region)."""
    found = memo.get(v)
    if found is not None:
        return found
    node = v.producer
    result: frozenset[int] = frozenset()
    if node is not None:
        if node in of:
            result = frozenset({of[node]})
        for i in node.inputs:
            result |= _depends(i, memo, of)
    memo[v] = result
    return result


def plan_nests(group: Node, registry: Any) -> list[KernelWriter]:
    region = group.region
    reductions = [n for n in region.nodes if n.op in REDUCTIONS]
    named = list(zip(output_names(region), region.outputs))
    classes = _classes(reductions)
    if len(classes) <= 1:
        return [KernelWriter(group, registry)]
    of = {n: k for k, members in enumerate(classes) for n in members}
    memo: dict[Value, frozenset[int]] = {}
    for n in reductions:
        other = _depends(n.inputs[0], memo, of) - {of[n]}
        if other:
            raise Unsupported(f"{n.op} reduces a value computed from reductions over other "
                              f"dims (it would need a buffer between loops)")
    parts: list[list[tuple[str, Value]]] = [[] for _ in classes]
    for name, v in named:
        deps = _depends(v, memo, of)
        if len(deps) > 1:
            raise Unsupported(f"output %{v.name} depends on reductions over different dims")
        parts[min(deps) if deps else 0].append((name, v))
    return [KernelWriter(group, registry, part, members)
            for part, members in zip(parts, classes) if part]


def write_function(group: Node, registry: Any) -> tuple[str, dict[str, Any]]:
    """The C function (without the prelude) and its metadata."""
    region = group.region
    nests = plan_nests(group, registry)
    body = []
    for w in nests:
        body += w.nest()
    digest = structural_hash(region)
    ops = [n.op.split(".")[1] for n in region.nodes if n.op not in VIEWS]
    kernel = "_".join(["fused", *dict.fromkeys(ops)])[:48].rstrip("_") + f"_{digest[:10]}"
    params = []
    for v in region.inputs:
        if isinstance(v.type, ScalarType):
            params.append(f"{CTYPE[SCALAR_DTYPES[v.type.kind]]} in_{v.name}")
        else:
            params.append(f"const {STORAGE[v.type.dtype]}* restrict in_{v.name}")
    params += [f"{STORAGE[tensor_type(v).dtype]}* restrict {name}"
               for name, v in zip(output_names(region), region.outputs)]
    params.append("int nthreads")
    parallel = any(w.parallel for w in nests)
    forms = ", ".join(f"{w.kind}{' (columns)' if w.outer == 'xb' else ''} over {w.rows} rows"
                      for w in nests)
    header = ["/* torchloom cpu kernel for this group:"]
    header += [" *   " + line for line in print_graph(region).splitlines()]
    header += [f" * {forms} */"]
    source = [*header, f"void {kernel}({', '.join(params)}) {{"]
    if not parallel:
        source.append("  (void)nthreads;")
    source += ["  " + line for line in body]
    source.append("}")
    # the plan explain reports: each nest reads its inputs once from memory (a row's later
    # loops hit the cache), every output is written once
    read = sum(_nbytes(v) for w in nests for v in w.loaded)
    written = sum(_nbytes(v) for v in region.outputs)
    metadata = {"kernel": kernel, "kind": nests[0].kind, "nests": len(nests),
                "grid": [sum(w.rows for w in nests)], "bytes_read": read,
                "bytes_written": written,
                "rows": [w.rows for w in nests], "numel": max(w.numel for w in nests),
                "parallel": parallel, "inputs": [_describe(v) for v in region.inputs],
                "outputs": [_describe(v) for v in region.outputs]}
    return "\n".join(source) + "\n", metadata


def _nbytes(v: Value) -> int:
    t = tensor_type(v)
    n = 1
    for d in t.shape:
        n *= d
    return n * ITEMSIZE[t.dtype]


def _describe(v: Value) -> dict[str, Any]:
    if isinstance(v.type, ScalarType):
        return {"scalar": v.type.kind}
    t = tensor_type(v)
    return {"shape": list(t.shape), "strides": list(t.actual_strides()), "dtype": t.dtype}
