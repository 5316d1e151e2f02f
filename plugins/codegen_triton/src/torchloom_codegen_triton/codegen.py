"""The ``triton`` codegen: one Triton kernel per fusion group.

``supports`` declines a group on a device it cannot serve without writing anything, else
tries to write the kernel (kept for ``generate``: each kernel is written once) and returns
the reason when it cannot (an op with no template, a random or opaque op, an unsupported
dtype, a size no input carries, no CUDA for a GPU group...); such groups run on ``eager``.
Groups with symbolic sizes compile once into kernels taking the sizes as arguments
(variants.py, launched by launch.py). CPU groups run through the Triton interpreter
only when asked (``TORCHLOOM_TRITON_CPU=1`` or ``TRITON_INTERPRET=1``, or
``cpu_interpreter=True``): it is far slower than eager, so by default CPU groups go to
``eager`` with that reason. CI covers this codegen on the CPU that way.

``generate`` returns the kernel source (a header comment shows the group's IR) and JSON
metadata (shapes, strides, candidate block configs). ``load`` imports the source from a
file under the cache directory and returns ``kernel(*inputs) -> tuple(outputs)``. On a GPU
the first call autotunes over the candidate configs and stores the winner next to the
source (``<hash>.tune.json``), unless autotuning is off (``TritonCodegen(autotune=False)``
or ``TORCHLOOM_AUTOTUNE=0``).

``for_target("sm_90")`` is a copy that generates for that GPU without one (``explain
--target``): its ``supports`` takes CUDA groups whether or not CUDA is here, and
``compile_for_target`` builds a kernel ahead of time (Triton's LLVM and ptxas on this CPU)
and reads its registers and spills from the binary.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock
import torch
from torchloom.api import (FORMS, Capabilities, Kernel, KernelSource, Node, Progress, Reason,
                           TensorType, Written, default_cache_dir, env_flag, laid_out_as,
                           rejected_by_eager)

from torchloom_codegen_triton.indexing import Unsupported
from torchloom_codegen_triton.interp import import_source
from torchloom_codegen_triton.kernel import KernelWriter
from torchloom_codegen_triton.launch import SymbolicLauncher, compiled_grid
from torchloom_codegen_triton.ops import POINTWISE, REDUCTIONS, STORAGE
from torchloom_codegen_triton.plan import wider_configs
from torchloom_codegen_triton.tiles import tile_grid
from torchloom_codegen_triton.variants import generate_variants

log = logging.getLogger("torchloom.codegen_triton")

_TORCH_DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16,
                 "bf16": torch.bfloat16, "i64": torch.int64, "i32": torch.int32,
                 "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8, "b8": torch.bool}


class TritonCodegen:
    """Compiles fusion groups to Triton kernels (GPU, or the interpreter for CPU groups)."""

    name = "triton"
    #: "2": the metadata of kernels of symbolic sizes names the rows a max may not find
    #: empty (``nonempty``), which "1"'s lack
    version = "2"

    def __init__(self, *, autotune: bool | None = None, cache_dir: str | Path | None = None,
                 max_persistent: int = 4096, verbose: bool = True,
                 cpu_interpreter: bool | None = None, target: str | None = None):
        #: run CPU groups in the Triton interpreter (slow: for tests and demos). None reads
        #: TORCHLOOM_TRITON_CPU or TRITON_INTERPRET at each supports() call.
        self.cpu_interpreter = cpu_interpreter
        self.autotune = env_flag("TORCHLOOM_AUTOTUNE", True) if autotune is None else autotune
        base = cache_dir if cache_dir is not None else default_cache_dir()
        self.cache_dir = Path(base) / "triton"
        #: where sources go when ``cache_dir`` cannot be written (made on first need)
        self.scratch_dir: Path | None = None
        self.max_persistent = max_persistent
        self.verbose = verbose
        #: a CUDA architecture (``"sm_90"``) generated for without a GPU; never loaded
        self.target = target
        #: autotune over every candidate launch (``for_mode("max-autotune")``)
        self.wide = False
        #: the kernel ``supports`` wrote for a group, for its ``generate``
        self._written = Written()

    def for_target(self, target: str) -> TritonCodegen | None:
        """A copy generating for ``target`` (``sm_<arch>``), or None for other targets."""
        if not re.fullmatch(r"sm_\d+", target):
            return None
        return TritonCodegen(autotune=False, cache_dir=self.cache_dir.parent,
                             max_persistent=self.max_persistent, verbose=False,
                             cpu_interpreter=False, target=target)

    def for_mode(self, mode: str) -> TritonCodegen | None:
        """torch.compile's ``max-autotune`` modes: a copy that autotunes (whatever
        TORCHLOOM_AUTOTUNE says) over every candidate launch (:func:`wider_configs`); its
        kernels and tuning results are cached apart from the default search's."""
        if not mode.startswith("max-autotune") or self.target is not None:
            return None
        copy = TritonCodegen(autotune=True, cache_dir=self.cache_dir.parent,
                             max_persistent=self.max_persistent, verbose=self.verbose,
                             cpu_interpreter=self.cpu_interpreter)
        copy.wide = True
        copy.version = f"{self.version}+max-autotune"
        return copy

    def compile_for_target(self, kernel: KernelSource) -> dict[str, int]:
        """Build ``kernel`` for the target ahead of time: its registers and spills."""
        from torchloom_codegen_triton.aot import compile_ahead, resource_usage
        arch = int(self.target[len("sm_"):])
        if "variants" in kernel.metadata:  # symbolic sizes: every variant must build
            built = [{"kernel": v["kernel"], **resource_usage(
                compile_ahead(kernel, arch=arch, variant=v)["cubin"], v["kernel"])}
                for v in kernel.metadata["variants"]]
            for v in kernel.metadata["variants"]:  # finishing kernels must build too
                if "finish" in kernel.metadata or v.get("finish"):
                    compile_ahead(kernel, arch=arch, finish=True, variant=v)
            return {"registers": max(b["registers"] for b in built),
                    "spills": max(b["spills"] for b in built), "variants": built}
        asm = compile_ahead(kernel, arch=arch)
        if "finish" in kernel.metadata:  # the finishing kernel must build too
            compile_ahead(kernel, arch=arch, finish=True)
        return resource_usage(asm["cubin"], kernel.metadata["kernel"])

    # ---- protocol --------------------------------------------------------------------------
    def available(self, group: Node) -> Reason | None:
        """What this machine lacks for the group (triton, CUDA for a GPU group, the
        interpreter's switch for a CPU one): cheap, writes nothing."""
        devices = _devices(group)
        if len(devices) != 1:
            return Reason(self.name, f"values on {len(devices)} devices")
        return _triton_missing(self.name) or self._device_reason(devices.pop())

    def supports(self, group: Node, registry: Any) -> Reason | None:
        """Cheap checks first: a group declined for its device costs no kernel. Otherwise
        the kernel is written, and kept for ``generate``."""
        devices = _devices(group)
        reason = _triton_missing(self.name) or (
            self._device_reason(devices.pop()) if len(devices) == 1 else None) or \
            CAPABILITIES.reason(self.name, group) or \
            rejected_by_eager(self.name, group, registry)  # (eager raises: so must we)
        if reason is not None:
            return reason
        try:
            written = self._write(group, registry)
        except Unsupported as exc:
            return Reason(self.name, str(exc))
        return self._device_reason(written[1]["device"])

    def _device_reason(self, device: str) -> Reason | None:
        """Why a group on ``device`` cannot run here, or None."""
        if self.target is not None:
            return None if device.startswith("cuda") else Reason(
                self.name, f"group on {device}, not on the target {self.target}'s device")
        if device.startswith("cuda") and not torch.cuda.is_available():
            return Reason(self.name, f"group on {device} but CUDA is not available")
        if device == "cpu" and not self._cpu_allowed():
            return Reason(self.name, "CPU group: Triton kernels run on CUDA; set "
                                     "TORCHLOOM_TRITON_CPU=1 (or TRITON_INTERPRET=1) to run them "
                                     "in the Triton interpreter, which is slow and meant for "
                                     "tests")
        if device != "cpu" and not device.startswith("cuda"):
            return Reason(self.name, f"device {device} is not supported (cpu runs in the "
                                     f"Triton interpreter, cuda compiles)")
        return None

    def takes_device(self, device: str) -> bool:
        """Whether groups on ``device`` come here: CUDA's, and the CPU's in the Triton
        interpreter (its switch on). Cheap: triton is not imported."""
        return device.startswith("cuda") or (device == "cpu" and self._cpu_allowed())

    def _cpu_allowed(self) -> bool:
        if self.cpu_interpreter is not None:
            return self.cpu_interpreter
        return env_flag("TORCHLOOM_TRITON_CPU", False) or env_flag("TRITON_INTERPRET", False)

    def _write(self, group: Node, registry: Any) -> tuple[str, dict[str, Any]]:
        """(source, metadata): one kernel, or a kernel per launch variant when the group's
        sizes are symbolic (variants.py); written once per group (``_written``)."""
        def write() -> tuple[str, dict[str, Any]]:
            writer = KernelWriter(group, registry, self.max_persistent)
            if writer.symbolic:
                return generate_variants(group, registry, self.max_persistent, writer)
            return writer.generate()
        return self._written.get(group, registry, write)

    def generate(self, group: Node, registry: Any) -> KernelSource:
        source, metadata = self._write(group, registry)
        metadata = dict(metadata)
        metadata["autotune"] = self.autotune
        if self.wide and "variants" not in metadata:  # symbolic: wider per size bucket
            metadata["configs"] = wider_configs(metadata, self.max_persistent)
        return KernelSource(self.name, source, metadata)

    def load(self, kernel: KernelSource, registry: Any) -> Kernel:
        meta = kernel.metadata
        digest = hashlib.sha256(kernel.source.encode()).hexdigest()[:20]
        try:
            path = _write_source(self.scratch_dir or self.cache_dir, digest, kernel.source)
        except OSError as exc:  # an unusable cache costs the cache, not the kernel
            if self.scratch_dir is not None:
                raise
            self.scratch_dir = Path(tempfile.mkdtemp(prefix="torchloom-triton-"))
            log.warning("torchloom: triton kernel directory %s is unusable (%s); kernel "
                        "sources go to %s for this process", self.cache_dir,
                        exc.strerror or exc, self.scratch_dir)
            path = _write_source(self.scratch_dir, digest, kernel.source)
        interpret = meta["device"] == "cpu" or env_flag("TRITON_INTERPRET", False)
        module = import_source(path, f"torchloom_triton_k{digest}", interpret)
        if "variants" in meta:  # symbolic sizes: a size bucket's config per call
            stem = path.with_suffix(".wide" if self.wide else "")
            return SymbolicLauncher(module, meta, _TORCH_DTYPES, stem if self.autotune and
                                    not interpret else None, self.verbose, interpret,
                                    wide_search=self.wide)
        fn = getattr(module, meta["kernel"])
        tune_path = path.with_suffix(".wide.tune.json" if self.wide else ".tune.json")
        config = dict(meta["config"])
        if tune_path.exists():
            config = json.loads(tune_path.read_text())["config"]
        tune = self.autotune and not interpret and not tune_path.exists() and len(
            meta["configs"]) > 1
        finish = getattr(module, meta["finish"]["kernel"]) if "finish" in meta else None
        return Launcher(fn, meta, config, tune_path if tune else None, self.verbose, interpret,
                        finish)


def _write_source(directory: Path, digest: str, source: str) -> Path:
    """The file ``k<digest>.py`` in ``directory`` holding ``source`` (written if needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"k{digest}.py"
    if not path.exists() or path.read_text() != source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    return path


class Launcher:
    """``kernel(*inputs) -> outputs``: allocates outputs, fixes unexpected input strides,
    launches; the first call autotunes when asked to."""

    #: its outputs are allocated with their types' strides (the codegen protocol)
    exact_layouts = True

    def __init__(self, fn, meta: dict[str, Any], config: dict[str, int], tune_path: Path | None,
                 verbose: bool, interpret: bool = False, finish=None):
        self.fn, self.meta, self.config = fn, meta, config
        #: a second kernel combining the main kernel's partial results (row + column form)
        self.finish = finish
        self.scratch = [s["numel"] for s in meta.get("scratch", ())]
        self.programs = meta.get("programs")
        self.splits = meta.get("splits")
        self.interpret = interpret
        #: the compiled kernel's own launchers, by the specialisation of the scalar
        #: arguments (Triton compiles ints equal to 1 and multiples of 16 apart)
        self._fast: dict[tuple, Any] = {}
        #: per config (by identity): (grid, block values, block dict, num_warps)
        self._plans: dict[int, tuple] = {}
        self.tune_path, self.verbose = tune_path, verbose
        #: called with the autotune result once tuned (the kernel cache shares it)
        self.on_tuned = None
        self.outputs = [(tuple(o["shape"]), tuple(o["strides"]), _TORCH_DTYPES[o["dtype"]])
                        for o in meta["outputs"]]
        self.checks = []
        for i, d in enumerate(meta["inputs"]):
            if "scalar" in d:
                continue
            dims = tuple(k for k, s in enumerate(d["shape"]) if s != 1)
            self.checks.append((i, tuple(d["strides"]), dims,
                                tuple(d["strides"][k] for k in dims)))
        self.grid_size = meta["grid_size"]
        #: the scalar arguments' positions (their specialisation picks a fast launcher)
        self.scalars = tuple(i for i, d in enumerate(meta["inputs"]) if "scalar" in d)
        #: the first tensor argument: where outputs are allocated
        self.first_tensor = self.checks[0][0] if self.checks else None

    def __call__(self, *args):
        for i, strides, dims, expected in self.checks:
            stride = args[i].stride()
            if stride != strides and tuple(stride[k] for k in dims) != expected:
                args = list(args)  # rare: a layout the kernel was not written for
                args[i] = laid_out_as(args[i], tuple(strides))
        device = args[self.first_tensor].device if self.first_tensor is not None else \
            self.meta["device"]
        outs = [torch.empty_strided(shape, strides, dtype=dtype, device=device)
                for shape, strides, dtype in self.outputs]
        if self.grid_size > 0:
            scratch = [torch.empty(n, dtype=torch.float32, device=device) for n in self.scratch]
            if self.tune_path is not None:
                self._autotune(args, [*outs, *scratch])
            self._launch(self.config, args, [*outs, *scratch])
            if self.finish is not None:
                self._finish(args, outs, scratch)
        return tuple(outs)

    def _finish(self, args, outs, scratch) -> None:
        spec = self.meta["finish"]
        if spec.get("inputs"):  # the split form's finisher computes the epilogue too
            tensors = (*args, *outs, *scratch)
        else:
            tensors = (*scratch, *(outs[i] for i in spec["outputs"]))
        if self.interpret:
            with np.errstate(all="ignore"):
                self.finish[(spec["grid"],)](*tensors, **spec["config"])
        else:
            self.finish[(spec["grid"],)](*tensors, **spec["config"])

    def _plan(self, config: dict[str, int]) -> tuple:
        """(grid, block values, block dict, num_warps) of ``config``, computed once."""
        plan = self._plans.get(id(config))
        if plan is None or plan[4] is not config:
            blocks = {k: v for k, v in config.items() if k != "num_warps"}
            grid = ((self.grid_size + blocks["XBLOCK"] - 1) // blocks["XBLOCK"],
                    ) if self.programs is None else (self.programs,)
            if self.splits:  # a split reduction: one program per row block and chunk
                grid = (grid[0], self.splits)
            if "tiles" in self.meta:  # tiled pointwise: one program per tile
                grid = (tile_grid(self.meta["tiles"], config),)
            plan = (grid, tuple(blocks.values()), blocks, config.get("num_warps", 4), config)
            self._plans[id(config)] = plan
        return plan

    def specialisation(self, args) -> tuple:
        """How Triton specialises the scalar arguments: ints equal to 1, multiples of 16."""
        return tuple((a == 1, a % 16 == 0) if isinstance(a, int) and not isinstance(a, bool)
                     else type(a) for a in (args[i] for i in self.scalars))

    def _launch(self, config: dict[str, int], args, outs) -> None:
        grid, values, blocks, warps, _ = self._plan(config)
        tensors = (*args, *outs)
        main = config is self.config
        key = self.specialisation(args) if self.scalars else ()
        fast = self._fast.get(key) if main else None
        if fast is not None and _aligned(tensors):
            try:  # the compiled kernel's own launcher: no re-binding, no cache-key hashing
                fast[compiled_grid(grid)](*tensors, *values)
                return
            except Exception:  # an API this triton version lacks: use the JIT path
                del self._fast[key]
        if self.interpret:
            with np.errstate(all="ignore"):  # the interpreter computes masked lanes too
                self.fn[grid](*tensors, **blocks, num_warps=warps)
            return
        compiled = self.fn[grid](*tensors, **blocks, num_warps=warps)
        if main and _aligned(tensors):
            self._fast[key] = compiled  # specialised for 16-byte aligned pointers (these are)

    def _autotune(self, args, outs) -> None:
        # processes tuning the same kernel at once (DDP ranks): one tunes, the others wait
        # for its record and take it
        with FileLock(str(self.tune_path) + ".lock"):
            if self.tune_path.exists():
                self.apply_tuning(json.loads(self.tune_path.read_text()))
                self._fast.clear()
                return
            self._tune(args, outs)

    def _tune(self, args, outs) -> None:
        from triton.testing import do_bench
        timings = []
        configs = self.meta["configs"]
        with Progress(f"triton: autotuning {self.meta['kernel']}", total=len(configs),
                      delay=None if self.verbose else float("inf")) as progress:
            for k, config in enumerate(configs):
                ms = do_bench(lambda c=config: self._launch(c, args, outs), warmup=5, rep=20)
                timings.append((ms, k))
                progress.update(k + 1, "configs")
        best = configs[min(timings)[1]]
        self.config = dict(best)
        self._fast.clear()
        record = {"config": self.config, "timings_ms": {json.dumps(configs[k]): ms
                                                        for ms, k in timings}}
        tmp = self.tune_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record, indent=1))
        os.replace(tmp, self.tune_path)
        self.tune_path = None
        if self.on_tuned is not None:
            self.on_tuned(record)

    def share_tuning(self, callback) -> None:
        """Call ``callback`` with the autotune result once tuned (the kernel cache shares
        it with the fleet)."""
        self.on_tuned = callback

    def apply_tuning(self, record: dict) -> None:
        """Use an autotune result found elsewhere (the shared cache) instead of tuning,
        before the first call: its config must be one of this kernel's candidates."""
        config = record.get("config") if isinstance(record, dict) else None
        if config not in self.meta["configs"]:
            raise ValueError(f"tuned config {config!r} is not one of the kernel's candidates")
        self.config = dict(config)
        self.tune_path = None


def _aligned(tensors) -> bool:
    return all(t.data_ptr() % 16 == 0 for t in tensors if isinstance(t, torch.Tensor))


#: what the writer renders, declared through the codegen contract: every kernel form of the
#: core's schedule (of several nests, row + column sums of one shape: rows_and_columns.py), on CUDA
#: or in the interpreter, symbolic sizes
CAPABILITIES = Capabilities(forms=frozenset(FORMS), dtypes=frozenset(STORAGE),
                            ops=frozenset(POINTWISE) | frozenset(REDUCTIONS),
                            kinds=frozenset(spec.kind for spec in REDUCTIONS.values()),
                            devices=frozenset({"cpu", "cuda"}), symbolic=True)


def _devices(group: Node) -> set[str]:
    return {v.type.device for v in (*group.region.inputs, *group.region.outputs)
            if isinstance(v.type, TensorType)}


def _triton_missing(name: str) -> Reason | None:
    try:
        import triton  # noqa: F401
    except ImportError:
        return Reason(name, "triton is not installed (pip install triton)")
    return None
