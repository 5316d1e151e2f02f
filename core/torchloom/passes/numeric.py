"""``verify = "numeric"``: run each pass's input and output graphs on the same seeded
inputs and compare what they compute.

The inputs are drawn from the graph's input types (:func:`input_sets`): random values with
edge values planted (zeros, negative zero, negatives; a second set adds NaN and
infinities where the dtype has them), integers in a range any dim of the graph can index,
random booleans, and every symbolic size given one small concrete value
(:data:`SYMBOL_SIZE`; an ``int`` input a node uses as a size takes that size's value). The
graphs run through their own eager evaluation (the plan builder
of :mod:`torchloom.codegen.plan`, op by op with torch), and :func:`compare` checks every
output, and every input the graph writes, with dtype-aware tolerances: NaN positions and
infinities must match exactly, integers and booleans too. The pass manager keeps one
:class:`NumericCheck` per run: the outputs of the graph as the last pass left it are the
reference of the next pass, so each changing pass costs one evaluation per input set.

The inputs that showed a difference travel with the :class:`~torchloom.errors.NumericError`
and are written into the reproducer as data (:func:`write_inputs`: a JSON index and raw
little-endian bytes, never pickle), read back by :func:`read_inputs`.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from torchloom.codegen.base import laid_out_as
from torchloom.errors import NumericError, TorchloomError
from torchloom.ir.graph import Graph
from torchloom.ir.symbols import evaluate, symbols_of
from torchloom.ir.types import DTYPE_NAMES, DTYPES, InputRef, ScalarType, TensorType

SEED = 0x7105
#: the value every symbolic size (and every int scalar input) takes
SYMBOL_SIZE = 5
#: largest integer drawn for an integer tensor (exclusive), when no dim is smaller
INT_RANGE = 16
INPUTS_FORMAT = "torchloom-inputs-1"

#: dtype name -> (rtol, atol): a few units in the last place of each format, so a
#: reordered sum passes and a changed function does not
TOLERANCES = {"f64": (1e-10, 1e-10), "f32": (1e-5, 1e-5), "f16": (2e-3, 1e-3),
              "bf16": (1.6e-2, 1e-2), "c64": (1e-5, 1e-5), "c128": (1e-10, 1e-10)}
#: float8 and other narrow formats
NARROW_TOLERANCE = (0.25, 0.125)


def _real_tensors(fn):
    """Run ``fn`` on real tensors: passes run inside aot_autograd's fake-tensor mode, and
    numbers need the real thing."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from torch.utils._python_dispatch import _disable_current_modes
        with _disable_current_modes(), torch.no_grad():
            return fn(*args, **kwargs)
    return wrapper


class NumericSkip(Exception):
    """The graph cannot be checked by numbers (why is the message); not the pass's fault."""


def tolerance(dtype: str) -> tuple[float, float]:
    return TOLERANCES.get(dtype, NARROW_TOLERANCE)


# ---- inputs ----------------------------------------------------------------------------

def input_sets(graph: Graph, seed: int = SEED) -> list[tuple[str, list[Any]]]:
    """Seeded inputs for ``graph``: ``[(label, inputs), ...]``, one or two sets. Raises
    :class:`NumericSkip` for an input that cannot be made (a device not on this machine,
    a size expression that does not evaluate, an opaque scalar)."""
    bindings = {s: SYMBOL_SIZE for v in graph.inputs if isinstance(v.type, TensorType)
                for d in v.type.shape for s in symbols_of(d)}
    shapes = {v: _concrete(v.type.shape, bindings, v.name) for v in graph.inputs
              if isinstance(v.type, TensorType)}
    dims = [d for shape in shapes.values() for d in shape if d > 0]
    high = max(1, min([INT_RANGE, *dims]))
    gen = torch.Generator().manual_seed(seed)
    sizes = _int_inputs(graph, bindings)
    plain = [sizes[v] if v in sizes else _make(v.type, shapes.get(v), gen, high, v.name)
             for v in graph.inputs]
    sets = [("finite values with zeros and negatives", plain)]
    if any(isinstance(t, torch.Tensor) and _has_nan(t.dtype) and t.numel() > 1 for t in plain):
        sets.append(("with NaN and infinities", [_with_nonfinite(t) for t in plain]))
    return sets


def _int_inputs(graph: Graph, bindings: dict[str, int]) -> dict[Any, int]:
    """Values for ``int`` inputs that are sizes: one that a node's list attribute names
    (``aten.view(%x, %n) {size = [$1, 32]}``) takes the matching dim of the node's result
    (``s0*s1`` -> 25), so a backward graph's size arguments agree with its tensors."""
    ints = {v for v in graph.inputs if isinstance(v.type, ScalarType) and v.type.kind == "int"}
    found: dict[Any, int] = {}
    if not ints:
        return found
    for node in graph.nodes:
        if not node.outputs or not isinstance(node.outputs[0].type, TensorType):
            continue
        shape = node.outputs[0].type.shape
        for value in node.attrs.values():
            if not isinstance(value, (list, tuple)) or len(value) != len(shape):
                continue
            for item, dim in zip(value, shape):
                if isinstance(item, InputRef) and item < len(node.inputs):
                    v = node.inputs[item]
                    n = dim if isinstance(dim, int) else evaluate(dim, bindings)
                    if v in ints and v not in found and n is not None:
                        found[v] = n
    return found


def _concrete(shape, bindings: dict[str, int], name: str) -> tuple[int, ...]:
    out = []
    for d in shape:
        n = d if isinstance(d, int) else evaluate(d, bindings)
        if n is None or n < 0:
            raise NumericSkip(f"input %{name} has size {d!r}, which has no concrete value")
        out.append(n)
    return tuple(out)


def _device_ok(device: str) -> bool:
    kind = device.split(":")[0]
    if kind == "cpu":
        return True
    if kind == "cuda":
        return torch.cuda.is_available()
    return False


def _make(t, shape, gen: torch.Generator, high: int, name: str):
    if isinstance(t, ScalarType):
        if t.kind == "int":
            return SYMBOL_SIZE
        if t.kind == "float":
            return 0.5
        if t.kind == "bool":
            return True
        if t.kind == "none":
            return None
        raise NumericSkip(f"input %{name} is a {t.kind} scalar, which has no seeded value")
    if not _device_ok(t.device):
        raise NumericSkip(f"input %{name} lives on {t.device!r}, not on this machine")
    dtype = t.torch_dtype
    if dtype.is_complex:
        value = torch.randn(shape, generator=gen, dtype=dtype)
    elif dtype.is_floating_point:
        value = (torch.randn(shape, generator=gen) * 2).to(dtype)
        flat = value.view(-1)
        for i, edge in enumerate((0.0, -0.0, -1.0)):  # zeros and a negative, always
            if flat.numel() > 2 * i + 1:
                flat[2 * i + 1] = edge
    elif dtype == torch.bool:
        value = torch.randint(0, 2, shape, generator=gen).bool()
    else:
        value = torch.randint(0, high, shape, generator=gen).to(dtype)
    strides = t.strides
    if strides is not None and all(isinstance(s, int) for s in strides):
        # (overlapping strides: which drawn element a shared place keeps is unspecified;
        # the input is what the view reads, the same for both graphs)
        value = laid_out_as(value, tuple(strides))
    return value.to(t.device)


def _has_nan(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def _with_nonfinite(value):
    if not isinstance(value, torch.Tensor) or not _has_nan(value.dtype) or value.numel() < 2 \
            or torch._debug_has_internal_overlap(value) != 0:  # (kept as laid out)
        return value
    out = value.clone()
    flat = out.view(-1) if out.is_contiguous() else None
    if flat is None:
        return out
    edges = (math.nan, math.inf, -math.inf) if _has_inf(out.dtype) else (math.nan,)
    for i, edge in enumerate(edges):  # spread out, so a row reduction keeps finite rows
        flat[(i * 7 + 2) % flat.numel()] = edge
    return out


def _has_inf(dtype: torch.dtype) -> bool:
    return not str(dtype).startswith("torch.float8") and not str(dtype).startswith(
        "torch.float4")


# ---- evaluation and comparison --------------------------------------------------------

def evaluate_graph(graph: Graph, registry, inputs: Sequence[Any], fn=None) -> list[Any]:
    """What ``graph`` computes on ``inputs`` (copied first): its outputs, then every
    tensor input as the graph left it (a graph may write into its inputs)."""
    from torchloom.codegen.plan import build_function
    if fn is None:
        fn = build_function(graph, registry).fn
    args = [v.clone() if isinstance(v, torch.Tensor) else v for v in inputs]
    with torch.no_grad():
        outs = fn(*args)
    return list(outs) + [a for a in args if isinstance(a, torch.Tensor)]


def compare(before: Sequence[Any], after: Sequence[Any], names: Sequence[str]) -> str | None:
    """The first difference between two results of :func:`evaluate_graph` (``names`` says
    what each position is), or None when they agree within the dtype's tolerance."""
    if len(before) != len(after):
        return f"the graph returns {len(after)} values, it returned {len(before)}"
    for i, (a, b) in enumerate(zip(before, after)):
        what = names[i] if i < len(names) else f"result {i}"
        problem = compare_values(a, b)
        if problem is not None:
            return f"{what}: {problem}"
    return None


def compare_values(ref, got) -> str | None:
    if not isinstance(ref, torch.Tensor) or not isinstance(got, torch.Tensor):
        if isinstance(ref, torch.Tensor) != isinstance(got, torch.Tensor):
            return f"was {_kind(ref)}, is {_kind(got)}"
        if isinstance(ref, float) and isinstance(got, float) and math.isnan(ref) \
                and math.isnan(got):
            return None
        return None if ref == got else f"was {ref!r}, is {got!r}"
    if ref.shape != got.shape or ref.dtype != got.dtype:
        return (f"was {DTYPE_NAMES.get(ref.dtype, ref.dtype)}{list(ref.shape)}, is "
                f"{DTYPE_NAMES.get(got.dtype, got.dtype)}{list(got.shape)}")
    ref, got = ref.detach().cpu(), got.detach().cpu()
    if _same_bits(ref, got):  # what most passes leave: no arithmetic needed
        return None
    if not (ref.dtype.is_floating_point or ref.dtype.is_complex):
        bad = ref != got
        return _describe(bad, ref, got, "differs") if bool(bad.any()) else None
    if ref.dtype.is_complex:
        ref, got = torch.view_as_real(ref), torch.view_as_real(got)
    r, g = ref.double(), got.double()
    rn, gn = torch.isnan(r), torch.isnan(g)
    if bool((rn != gn).any()):
        return _describe(rn != gn, ref, got, "is NaN in one graph only")
    inf = torch.isinf(r) | torch.isinf(g)
    if bool((r[inf] != g[inf]).any()):
        bad = torch.zeros_like(inf)
        bad[inf] = r[inf] != g[inf]
        return _describe(bad, ref, got, "differs in an infinity")
    finite = ~(rn | inf)
    rtol, atol = tolerance(DTYPE_NAMES.get(ref.dtype, ""))
    scale = float(r[finite].abs().max()) if bool(finite.any()) else 0.0
    allowed = atol + rtol * (r.abs() + scale)  # scale: a reordered sum cancels to it
    bad = finite & ((r - g).abs() > allowed)
    if bool(bad.any()):
        return _describe(bad, ref, got, f"differs beyond rtol {rtol:g}, atol {atol:g}")
    return None


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal (NaN payloads included), in one comparison."""
    bits = _BITS.get(a.element_size())
    if bits is None or a.dtype == torch.bool:
        return bool(torch.equal(a, b))
    return bool(torch.equal(a.reshape(-1).view(bits), b.reshape(-1).view(bits)))


def _kind(v) -> str:
    return f"a {DTYPE_NAMES.get(v.dtype, v.dtype)} tensor" if isinstance(v, torch.Tensor) \
        else repr(v)


def _describe(bad: torch.Tensor, ref: torch.Tensor, got: torch.Tensor, how: str) -> str:
    where = [int(i) for i in bad.nonzero()[0]] if bad.dim() else []
    at = tuple(where)
    return (f"{int(bad.sum())} of {bad.numel()} elements {how}; at {list(where)}: "
            f"{ref[at].item()!r} before the pass, {got[at].item()!r} after")


def result_names(graph: Graph) -> list[str]:
    return ([f"output {i} (%{v.name})" for i, v in enumerate(graph.outputs)]
            + [f"input %{v.name} after the graph ran" for v in graph.inputs
               if isinstance(v.type, TensorType)])


def random_op(graph: Graph, registry) -> str | None:
    """The first op of ``graph`` (regions and shared subgraphs included) that draws
    random numbers: such graphs cannot be compared by value."""
    for g in [graph, *graph.subgraphs.values()]:
        for node in g.walk():
            op = registry.lookup(node.op)
            if op is not None and op.category == "random":
                return node.op
    return None


class NumericCheck:
    """The pass manager's numeric reference: the inputs, and what the graph as the last
    pass left it computes on them. ``skipped`` says why the graph is not checked (no
    pass is blamed for that)."""

    def __init__(self, graph: Graph, registry, inputs: Sequence[Any] | None = None):
        self.registry = registry
        self.skipped: str | None = None
        self.sets: list[tuple[str, list[Any]]] = []
        self.reference: list[list[Any]] = []
        self.names: list[str] = []
        self._start(graph, inputs)

    @_real_tensors
    def _start(self, graph: Graph, inputs: Sequence[Any] | None) -> None:
        self.signature = _signature(graph)
        try:
            op = random_op(graph, self.registry)
            if op is not None:
                raise NumericSkip(f"it draws random numbers ({op})")
            self.sets = [("the reproducer's inputs", list(inputs))] if inputs is not None \
                else input_sets(graph)
            self.reference = self._run_all(graph, before=True)
            self.names = result_names(graph)
        except NumericSkip as why:
            self.skipped = f"numeric verification skipped for @{graph.name}: {why}"

    def _run_all(self, graph: Graph, *, before: bool) -> list[list[Any]]:
        from torchloom.codegen.plan import build_function
        fn = build_function(graph, self.registry).fn
        results = []
        for label, inputs in list(self.sets):
            try:
                results.append(evaluate_graph(graph, self.registry, inputs, fn))
            except Exception as exc:
                if not before:
                    raise NumericError(f"the graph after the pass raises on inputs the graph "
                                       f"before it ran ({label}): {type(exc).__name__}: "
                                       f"{exc}", inputs) from exc
                if results:  # the NaN set may raise where the finite one ran
                    self.sets = self.sets[:len(results)]
                    break
                raise NumericSkip(f"the graph raises on seeded inputs ({label}): "
                                  f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
        return results

    @_real_tensors
    def check(self, graph: Graph) -> str | None:
        """Raise :class:`NumericError` when ``graph`` (after a pass) computes something
        else than the reference; else make it the reference. Returns a note when the
        graph cannot be checked any more."""
        if self.skipped is not None:
            return None
        if _signature(graph) != self.signature:  # new inputs: compare from here on
            self._start(graph, None)
            return self.skipped or (f"numeric verification of @{graph.name} starts again: "
                                    f"a pass changed its inputs")
        op = random_op(graph, self.registry)
        if op is not None:
            self.skipped = f"numeric verification stopped for @{graph.name}: a pass added " \
                           f"an op that draws random numbers ({op})"
            return self.skipped
        results = self._run_all(graph, before=False)
        names = self.names  # as the graph before the pass called them
        for (label, inputs), ref, got in zip(self.sets, self.reference, results):
            problem = compare(ref, got, names)
            if problem is not None:
                raise NumericError(f"the graph computes different values after the pass "
                                   f"(inputs: {label}, seed {SEED:#x}): {problem}", inputs)
        self.reference, self.names = results, result_names(graph)
        return None


def _signature(graph: Graph) -> tuple:
    return tuple(v.type for v in graph.inputs)


# ---- inputs as data --------------------------------------------------------------------

@_real_tensors
def write_inputs(directory: Path, inputs: Sequence[Any]) -> None:
    """``inputs.json`` (the index: kind, dtype, shape, strides, byte range) and
    ``inputs.bin`` (the tensors' bytes, contiguous, in order)."""
    index, blobs, offset = [], [], 0
    for v in inputs:
        if isinstance(v, torch.Tensor):
            data = v.detach().cpu().contiguous()
            raw = data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b""
            index.append({"kind": "tensor", "dtype": DTYPE_NAMES[data.dtype],
                          "shape": list(data.shape), "strides": list(v.stride()),
                          "device": str(v.device), "offset": offset, "nbytes": len(raw)})
            blobs.append(raw)
            offset += len(raw)
        elif v is None or isinstance(v, (bool, int, float)):
            index.append({"kind": "scalar", "value": v if not isinstance(v, float)
                          or math.isfinite(v) else repr(v)})
        else:
            raise TypeError(f"cannot save an input of type {type(v).__name__}")
    (directory / "inputs.bin").write_bytes(b"".join(blobs))
    (directory / "inputs.json").write_text(json.dumps(
        {"format": INPUTS_FORMAT, "inputs": index}, indent=1))


@_real_tensors
def read_inputs(directory: Path) -> list[Any] | None:
    """The inputs :func:`write_inputs` saved in ``directory``, or None when there are
    none. Anything malformed is a :class:`TorchloomError` naming the file."""
    path = directory / "inputs.json"
    if not path.exists():
        return None
    try:
        meta = json.loads(path.read_text())
        blob = (directory / "inputs.bin").read_bytes()
        if meta.get("format") != INPUTS_FORMAT:
            raise ValueError(f"format is {meta.get('format')!r}, not {INPUTS_FORMAT!r}")
        return [_read_one(entry, blob) for entry in meta["inputs"]]
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise TorchloomError(f"{path}: not a reproducer's saved inputs: {exc}") from None


def _read_one(entry: dict, blob: bytes):
    if entry["kind"] == "scalar":
        v = entry["value"]
        return float(v) if isinstance(v, str) and v in ("nan", "inf", "-inf") else v
    if entry["kind"] != "tensor" or entry["dtype"] not in DTYPES:
        raise ValueError(f"unknown input entry {entry!r}")
    dtype, shape = DTYPES[entry["dtype"]], [int(d) for d in entry["shape"]]
    start, n = int(entry["offset"]), int(entry["nbytes"])
    if start < 0 or start + n > len(blob) or n != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"tensor entry {entry!r} does not fit inputs.bin")
    raw = torch.frombuffer(bytearray(blob[start:start + n]), dtype=torch.uint8) if n \
        else torch.empty(0, dtype=torch.uint8)
    value = raw.view(dtype).reshape(shape)
    strides = [int(s) for s in entry.get("strides", [])]
    if strides and len(strides) == len(shape) and tuple(strides) != value.stride():
        value = torch.empty_strided(shape, strides, dtype=dtype).copy_(value)
    device = entry.get("device", "cpu")
    return value.to(device) if _device_ok(device) else value
