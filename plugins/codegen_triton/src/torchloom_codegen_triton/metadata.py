"""A kernel's JSON metadata: its arguments' shapes and strides, candidate launch configs,
and its plan (grid, bytes read and written) for ``explain``. ``w`` is the kernel writer
(kernel.py); a plan over symbolic sizes has no grid or byte counts (they depend on the
sizes)."""

from __future__ import annotations

from typing import Any

from torchloom.api import (DTYPES, ScalarType, Schedule, TensorType, Value, structural_hash,
                           unread_inputs)

from torchloom_codegen_triton.plan import pointwise_configs, representative
from torchloom_codegen_triton.protocol import Writer
from torchloom_codegen_triton.rows_and_columns import FINISH_BLOCK
from torchloom_codegen_triton.tensors import tensor_type
from torchloom_codegen_triton.tiles import tile_grid, tiled_metadata



def kernel_metadata(w: Writer, kernel: str, form: str) -> dict[str, Any]:
    unread = {w.region.inputs[i] for i in unread_inputs(w.region)}

    def desc(v: Value) -> dict[str, Any]:
        if isinstance(v.type, ScalarType):
            return {"scalar": v.type.kind}
        t = tensor_type(v)
        strides = t.actual_strides()  # None: contiguous with symbolic sizes
        d = {"shape": list(t.shape), "strides": None if strides is None else list(strides),
             "dtype": t.dtype}
        if v in unread:
            d["unread"] = True  # a size carrier (fusion.size-carriers): its shape only
        return d
    meta: dict[str, Any] = {
        # "form" is this target's variant of the kernel; "schedule" the core schedule's
        # form, the same for every target
        "kernel": kernel, "kind": w.kind, "form": form, "schedule": Schedule.of(w.group).form,
        "device": w.device,
        "inputs": [desc(v) for v in w.region.inputs],
        "outputs": [desc(v) for v in w.region.outputs],
        "numel": w.numel, "group_hash": structural_hash(w.group.region),
    }
    if w.kind == "pointwise":
        meta["grid_size"] = w.numel
        meta["configs"] = pointwise_configs(representative(w.numel, 2 ** 20))
    else:
        meta.update(rows=w.rows, rnumel=w.rnumel, grid_size=w.rows)
        meta["configs"] = w.configs
    if w.tiles is not None:
        meta.update(tiled_metadata(w, *w.tiles))
    meta["config"] = meta["configs"][0]
    if w.col is not None:
        meta.update(programs=w.col.programs, scratch=w.col.scratch, finish={
            "kernel": "_finish", "outputs": w.finish_outputs,
            "grid": -(-w.rnumel // FINISH_BLOCK), "config": {"FBLOCK": FINISH_BLOCK}})
        meta["form"] = "row and column reduction"
    if w.split is not None:
        meta.update(w.split.metadata())
    if not w.symbolic:  # a symbolic plan's grid and bytes depend on the sizes
        meta.update(traffic(w, meta["config"]))
    return meta


def traffic(w: Writer, config: dict[str, int]) -> dict[str, Any]:
    """The plan's ``grid`` and bytes: an input as large as the kernel's iteration space
    counts once per pass that loads it; a smaller (broadcast) one once, however many
    programs re-read it."""
    read = 0
    for v, passes in w.loads.items():
        size = _distinct_elements(tensor_type(v))
        read += size * _itemsize(v) * (len(passes) if size >= w.numel else 1)
    written = sum(_distinct_elements(tensor_type(v)) * _itemsize(v)
                  for v in dict.fromkeys(w.region.outputs))
    grid_size = w.numel if w.kind == "pointwise" else w.rows
    programs = -(-grid_size // config["XBLOCK"]) if grid_size else 0
    if w.tiles is not None:
        programs = tile_grid(tiled_metadata(w, *w.tiles)["tiles"], config)
    if w.col is not None:  # the partial column sums go through the scratch buffer
        scratch_written, scratch_read = w.col.traffic()
        read, written = read + scratch_read, written + scratch_written
        programs = w.col.programs
    if w.split is not None:
        scratch = w.split.traffic()
        return {"grid": [programs, w.split.splits], "bytes_read": read + scratch,
                "bytes_written": written + scratch}
    return {"grid": [programs], "bytes_read": read, "bytes_written": written}


def _distinct_elements(t: TensorType) -> int:
    n = 1
    for d, s in zip(t.shape, t.actual_strides()):
        n *= d if s != 0 or d == 0 else 1
    return n


def _itemsize(v: Value) -> int:
    return DTYPES[tensor_type(v).dtype].itemsize
