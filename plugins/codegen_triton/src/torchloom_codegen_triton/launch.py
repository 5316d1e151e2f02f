"""The launcher of a kernel with symbolic sizes (variants.py): sizes evaluated per call.

Each call evaluates the sizes from the inputs (sizes.py: one generated function), allocates
the outputs at those sizes, and launches nothing when the iteration space is empty (a
0-size batch). Otherwise it picks the variant (persistent or looped by the row length,
64-bit indices where elements or offsets reach 2**31) and the launch configuration of the
call's *size bucket* ``<variant>:<rows or elements, next power of two>:<row length, next
power of two>``. On a GPU with autotuning on, the first call of each bucket benchmarks the
bucket's candidates and keeps the winner in ``<kernel>.<bucket>.tune.json`` beside the
source (a file lock makes concurrent processes tune once); other sizes of the bucket reuse
it. The fleet's shared cache exchanges every bucket's result at once
(``share_tuning``/``apply_tuning`` with ``{"buckets": {bucket: config}}``). A call's plan is
kept per size values, and on a GPU the compiled kernel's own launcher is reused per
specialisation of the size arguments, so a repeated size costs little Python.
"""

from __future__ import annotations

import json
import os
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch
from filelock import FileLock
from torchloom.api import Progress, laid_out_as

from torchloom_codegen_triton.plan import (next_pow2, pointwise_configs, reduction_configs,
                                           wider_configs)
from torchloom_codegen_triton.rows_and_columns import PROGRAMS
from torchloom_codegen_triton.split import split_shape
from torchloom_codegen_triton.tiles import MIN_TILE_DIM, tile_configs, tile_grid
from torchloom_codegen_triton.sizes import size_function

_WIDE = 2 ** 31


class SymbolicLauncher:
    """``kernel(*inputs) -> outputs`` for a kernel with symbolic sizes."""

    #: its outputs are allocated with their types' strides (the codegen protocol)
    exact_layouts = True

    def __init__(self, module, meta: dict[str, Any], dtypes: dict[str, torch.dtype],
                 tune_stem: Path | None, verbose: bool, interpret: bool,
                 wide_search: bool = False):
        """``tune_stem``: where tuning records go (``<stem>.<bucket>.tune.json``, the
        bucket's colons as dashes); None
        when this launcher does not tune. ``wide_search``: max-autotune's candidates."""
        self.meta = meta
        self.variants = meta["variants"]
        self.fns = {v["kernel"]: getattr(module, v["kernel"]) for v in self.variants}
        #: row + column form (rows_and_columns.py): the finishing kernel and its spec
        self.finish = getattr(module, meta["finish"]["kernel"]) if "finish" in meta else None
        #: the split variants' finishing kernel (split.py), if the group has them
        self.split_finish = next((getattr(module, v["finish"]["kernel"]) for v in self.variants
                                  if v.get("split")), None)
        self.sizes = size_function(meta)
        self.pointwise = meta["kind"] == "pointwise"
        self.out_dtypes = [dtypes[o["dtype"]] for o in meta["outputs"]]
        self.tensors = [i for i, d in enumerate(meta["inputs"]) if "scalar" not in d]
        #: size carriers (fusion.size-carriers): read for their shape, never copied
        self.unread = frozenset(i for i in self.tensors if meta["inputs"][i].get("unread"))
        self.device = meta["device"]
        self.tune_stem, self.verbose, self.interpret = tune_stem, verbose, interpret
        self.wide_search = wide_search
        #: bucket -> the chosen launch configuration (tuned or the default)
        self.configs: dict[str, dict[str, int]] = {}
        #: bucket -> its candidate configurations
        self._candidates: dict[str, list[dict[str, int]]] = {}
        #: buckets tuned or given by ``apply_tuning`` (what ``on_tuned`` shares)
        self.tuned: dict[str, dict[str, int]] = {}
        #: called with ``{"buckets": ...}`` whenever a bucket is tuned (the kernel cache)
        self.on_tuned = None
        #: (variant, bucket) of the latest launches, in order (what tests count)
        self.launches: deque[tuple[str, str]] = deque(maxlen=256)
        #: (size values, wide) -> the call's plan (see _plan)
        self._plans: dict[tuple, tuple] = {}
        #: compiled kernels by (function, config, int arguments' specialisation)
        self._fast: dict[tuple, Any] = {}

    # ---- one call --------------------------------------------------------------------
    def __call__(self, *args):
        values, shapes, strides, in_strides, numel, rows, rnumel = self.sizes(*args)
        args = self._fix_strides(args, in_strides)
        device = args[self.tensors[0]].device if self.tensors else self.device
        outs = [torch.empty(shape, dtype=dtype, device=device) if st is None else
                torch.empty_strided(shape, st, dtype=dtype, device=device)
                for shape, st, dtype in zip(shapes, strides, self.out_dtypes)]
        programs = numel if self.pointwise else rows
        if self.finish is not None:  # column results exist even over no rows
            programs = max(rows, 1) if rnumel > 0 else 0
        if programs <= 0:  # an empty iteration space: nothing to launch
            return tuple(outs)
        # the outputs are contiguous and no larger than the iteration space
        wide = numel >= _WIDE or any(_extent(args[i]) >= _WIDE for i in self.tensors)
        key = (values, wide)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= 4096:  # sizes seen: kept for the common few
                self._plans.clear()
            plan = self._plans[key] = self._plan(wide, shapes[0], numel, rows, rnumel,
                                                 programs)
        variant, bucket, split, tiles = plan
        fn = self.fns[variant["kernel"]]
        if tiles is not None:
            def run(c):
                self._launch(fn, c, (*args, *outs, *values), programs, tiles)
        elif self.finish is not None:
            def run(c):
                self._row_and_column(fn, c, args, outs, values, rows, rnumel)
        elif split is not None:
            def run(c):
                self._split(fn, c, args, outs, values, rows, split, variant)
        else:
            def run(c):
                self._launch(fn, c, (*args, *outs, *values), programs)
        config = self.configs.get(bucket)
        if config is None:
            config = self._choose(bucket, run)
        self.launches.append((variant["kernel"], bucket))
        run(config)
        return tuple(outs)

    def _plan(self, wide: bool, shape, numel: int, rows: int, rnumel: int, programs: int):
        """(variant, bucket, split shape or None, tile counts or None) of a call."""
        rbucket = next_pow2(max(rnumel, 1))
        variant, split = self._variant(wide, rows, rnumel, rbucket)
        bucket = f"{variant['kernel']}:{next_pow2(programs)}:{rbucket}"
        tiles = self._tiles(wide, shape, numel) if self.pointwise else None
        if tiles is not None:  # a transposed input: 2-D tiles (tiles.py)
            variant, tiles = tiles
            bucket = f"{variant['kernel']}:{next_pow2(tiles['x'])}:{next_pow2(tiles['y'])}"
        return variant, bucket, split, tiles

    def _tiles(self, wide: bool, shape, numel: int):
        """(the tiled variant, its tile counts) when the call's tile dims are long enough
        (as tiles.plan_tiles asks of static sizes), else None."""
        tiled = next((v for v in self.variants if v.get("tiles") and v["wide"] == wide), None)
        if tiled is None:
            return None
        x, y = (shape[d] for d in tiled["tiles"])
        if min(x, y) < MIN_TILE_DIM:
            return None
        return tiled, {"x": x, "y": y, "other": numel // (x * y)}

    def _variant(self, wide: bool, rows: int, rnumel: int, rbucket: int):
        """(variant, None) or, for a long reduction with few row blocks, (its split
        variant, (chunk, splits))."""
        mine = [v for v in self.variants if v["wide"] == wide]
        plain = next(v for v in mine if not v.get("split") and (
            v["max_rnumel"] is None or rbucket <= v["max_rnumel"]))
        split = next((v for v in mine if v.get("split")), None)
        if split is None or plain["form"] != "looped reduction":
            return plain, None
        candidates = self.candidates(f"{split['kernel']}:{next_pow2(rows)}:{rbucket}")
        shape = split_shape(rows, rnumel, candidates[0]["XBLOCK"],
                            max(c["RBLOCK"] for c in candidates))
        return (plain, None) if shape is None else (split, shape)

    def _split(self, fn, config, args, outs, values, rows: int, shape, variant) -> None:
        """The split form: program (row block, chunk) leaves each reduction's partial per
        row in scratch; ``_finish`` combines them and computes the outputs."""
        chunk, splits = shape
        blocks = {k: v for k, v in config.items() if k != "num_warps"}
        scratch = [torch.empty(splits * rows, dtype=torch.float32, device=outs[0].device)
                   for _ in variant["scratch"]]
        spec = variant["finish"]
        call = (*args, *outs, *values, chunk, splits, *scratch)
        with np.errstate(all="ignore"):  # the interpreter computes masked lanes too
            fn[(-(-rows // blocks["XBLOCK"]), splits)](*call, **blocks,
                                                      num_warps=config.get("num_warps", 4))
            self.split_finish[(-(-rows // spec["config"]["FBLOCK"]),)](*call, **spec["config"])

    def _row_and_column(self, fn, config, args, outs, values, rows: int, rnumel: int):
        """The row + column form: ``kprog`` programs walk the row blocks, each leaving its
        column partials in scratch; ``_finish`` combines them."""
        blocks = {k: v for k, v in config.items() if k != "num_warps"}
        kprog = min(PROGRAMS, max(-(-rows // blocks["XBLOCK"]), 1))
        device = outs[0].device
        scratch = [torch.empty(kprog * rnumel, dtype=torch.float32, device=device)
                   for _ in self.meta["scratch"]]
        spec = self.meta["finish"]
        with np.errstate(all="ignore"):  # the interpreter computes masked lanes too
            fn[(kprog,)](*args, *outs, *values, kprog, *scratch, **blocks,
                         num_warps=config.get("num_warps", 4))
            self.finish[(-(-rnumel // spec["config"]["FBLOCK"]),)](
                *scratch, *(outs[i] for i in spec["outputs"]), *values, kprog, **spec["config"])

    def _fix_strides(self, args: tuple, expected: list) -> tuple:
        """Inputs laid out otherwise than the kernel reads them are copied (rare)."""
        for i, want in zip(self.tensors, expected):
            a = args[i]
            if i in self.unread:
                continue
            if want is None:
                if a.is_contiguous():
                    continue
                fixed = a.contiguous()
            elif all(s == w or d <= 1 for s, w, d in zip(a.stride(), want, a.shape)):
                continue
            else:
                fixed = laid_out_as(a, tuple(want))
            args = (*args[:i], fixed, *args[i + 1:])
        return args

    def _launch(self, fn, config: dict[str, int], call: tuple, programs: int,
                tiles: dict | None = None) -> None:
        blocks = {k: v for k, v in config.items() if k != "num_warps"}
        grid = (-(-programs // blocks["XBLOCK"]),) if tiles is None else (
            tile_grid(tiles, config),)
        if self.interpret:
            with np.errstate(all="ignore"):  # the interpreter computes masked lanes too
                fn[grid](*call, **blocks, num_warps=config.get("num_warps", 4))
            return
        # the compiled kernel's own launcher, per specialisation of the int arguments
        # (Triton compiles ints equal to 1 and multiples of 16 apart): no re-binding
        key = (id(fn), *config.values(), *((a == 1, a % 16 == 0) if type(a) is int else
                                           type(a) for a in call
                                           if not isinstance(a, torch.Tensor)))
        fast = self._fast.get(key)
        aligned = all(a.data_ptr() % 16 == 0 for a in call if isinstance(a, torch.Tensor))
        if fast is not None and aligned:
            try:
                fast[compiled_grid(grid)](*call, *blocks.values())
                return
            except Exception:  # an API this triton version lacks: the JIT path
                del self._fast[key]
        compiled = fn[grid](*call, **blocks, num_warps=config.get("num_warps", 4))
        if aligned:
            self._fast[key] = compiled

    # ---- buckets and tuning ----------------------------------------------------------
    def candidates(self, bucket: str) -> list[dict[str, int]]:
        """The launch configurations a bucket chooses from (its default first)."""
        found = self._candidates.get(bucket)
        if found is not None:
            return found
        kernel, programs, rbucket = bucket.rsplit(":", 2)
        variant = next(v for v in self.variants if v["kernel"] == kernel)
        programs, rbucket = int(programs), int(rbucket)
        if variant.get("tiles"):  # buckets of the two tile dims
            found = tile_configs(programs, rbucket)
        elif self.pointwise:
            found = pointwise_configs(programs)
        else:
            found = reduction_configs(programs, rbucket, variant["form"] == "looped reduction",
                                      self.meta["max_persistent"], self.meta["columns"])
        if self.wide_search and not variant.get("tiles"):  # tiles keep their candidates
            found = wider_configs({"form": variant["form"], "numel": programs,
                                   "rows": programs, "rnumel": rbucket, "configs": found},
                                  self.meta["max_persistent"])
        self._candidates[bucket] = found
        return found

    def _choose(self, bucket: str, run) -> dict[str, int]:
        candidates = self.candidates(bucket)
        config = dict(candidates[0])
        if self.tune_stem is not None and len(candidates) > 1:
            path = self.tune_stem.parent / f"{self.tune_stem.name}.{bucket.replace(':', '-')}" \
                ".tune.json"
            with FileLock(str(path) + ".lock"):  # concurrent tuners: one benchmarks
                if path.exists():
                    config = json.loads(path.read_text())["config"]
                else:
                    config = self._tune(path, bucket, run, candidates)
            self.tuned[bucket] = config
            if self.on_tuned is not None:
                self.on_tuned({"buckets": dict(self.tuned)})
        self.configs[bucket] = config
        return config

    def _tune(self, path: Path, bucket: str, run,
              candidates: list[dict[str, int]]) -> dict[str, int]:
        from triton.testing import do_bench
        timings = []
        with Progress(f"triton: autotuning {bucket}",
                      total=len(candidates),
                      delay=None if self.verbose else float("inf")) as progress:
            for k, config in enumerate(candidates):
                ms = do_bench(lambda c=config: run(c), warmup=5, rep=20)
                timings.append((ms, k))
                progress.update(k + 1, "configs")
        best = dict(candidates[min(timings)[1]])
        record = {"config": best, "timings_ms": {json.dumps(candidates[k]): ms
                                                 for ms, k in timings}}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, path)
        return best

    def share_tuning(self, callback) -> None:
        """Call ``callback`` with the autotune result once tuned (the kernel cache shares
        it with the fleet)."""
        self.on_tuned = callback

    def apply_tuning(self, record: dict) -> None:
        """Use buckets tuned elsewhere (the shared cache): ``{"buckets": {bucket:
        config}}``, each config one of its bucket's candidates."""
        buckets = record.get("buckets") if isinstance(record, dict) else None
        if not isinstance(buckets, dict):
            raise ValueError("a symbolic kernel's tuning record has no buckets")
        for bucket, config in buckets.items():
            kernel = str(bucket).rsplit(":", 2)[0]
            if kernel not in self.fns or config not in self.candidates(bucket):
                raise ValueError(f"tuned config {config!r} is not one of bucket "
                                 f"{bucket!r}'s candidates")
        for bucket, config in buckets.items():
            self.configs[bucket] = self.tuned[bucket] = dict(config)


def _extent(t: torch.Tensor) -> int:
    """A bound on the element offsets ``t`` reaches: its storage's elements."""
    return t.untyped_storage().nbytes() // t.element_size()


def compiled_grid(grid: tuple) -> tuple:
    """``grid`` with three dims: a compiled kernel's own launcher (``CompiledKernel[grid]``,
    Triton 3.6 to 3.9) reads ``grid[0]``, ``grid[1]`` and ``grid[2]``; only the JIT pads a
    shorter grid."""
    return (*grid, 1, 1, 1)[:3]
