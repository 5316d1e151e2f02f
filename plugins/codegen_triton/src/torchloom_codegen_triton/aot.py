"""Ahead-of-time compilation of a generated kernel for a CUDA target, without a GPU.

Triton lowers a kernel through TTIR, TTGIR, LLVM IR and PTX to a cubin (its bundled ptxas)
on any machine, so CI without a GPU can still prove that every generated kernel compiles
for, say, an H100 (``arch=90``), with pointers specialised as 16-byte aligned the way the
launcher meets them at run time.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import tempfile
from pathlib import Path

from torchloom.api import KernelSource

from torchloom_codegen_triton.interp import import_source

POINTER_TYPES = {"f64": "*fp64", "f32": "*fp32", "f16": "*fp16", "bf16": "*bf16",
                 "i64": "*i64", "i32": "*i32", "i16": "*i16", "i8": "*i8", "u8": "*u8",
                 "b8": "*i1"}

SCALAR_TYPES = {"float": "fp32", "int": "i64", "bool": "i1", "size32": "i32", "size64": "i64"}


def compile_ahead(kernel: KernelSource, arch: int = 90, config: dict | None = None,
                  finish: bool = False, variant: dict | None = None) -> dict:
    """Compile ``kernel`` (from ``TritonCodegen.generate``) for ``cuda:<arch>``; returns
    Triton's ``asm`` dict (``ttir``, ``ttgir``, ``llir``, ``ptx``, ``cubin``). ``finish``:
    its finishing kernel instead (the row + column and split forms have one); ``variant``:
    one of a symbolic kernel's ``variants`` (its own function and representative config;
    the size arguments 32-bit, or 64-bit for the wide variant)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    meta = dict(kernel.metadata)
    if variant is not None:
        meta.update(finish=variant.get("finish") or meta.get("finish"),
                    scratch=variant.get("scratch") or meta.get("scratch", ()))
        if not finish:
            config = dict(config or variant["configs"][0])
    config = dict(config or (meta["finish"]["config"] if finish else meta["config"]))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.py"
        path.write_text(kernel.source)
        module = import_source(path, f"torchloom_aot_{abs(hash(kernel.source))}", False)
        name = variant["kernel"] if variant else meta["kernel"]
        fn = getattr(module, meta["finish"]["kernel"] if finish else name)
        params = list(inspect.signature(fn.fn).parameters)
        size = "size64" if variant and variant["wide"] and not finish else "size32"
        sizes = [{"scalar": size}] * len(meta.get("symbols", ()))  # symbolic sizes
        sizes += [{"scalar": "size32"}] if meta.get("programs") == "kprog" else []
        sizes += [{"scalar": "size32"}] * 2 if variant and variant.get("split") else []
        dtypes = [d.get("dtype") or d["scalar"] for d in _arguments(meta, finish, sizes)]
        signature = {p: POINTER_TYPES.get(d) or SCALAR_TYPES[d] for p, d in zip(params, dtypes)}
        constexprs = {k: v for k, v in config.items() if k != "num_warps"}
        signature.update({k: "constexpr" for k in constexprs})
        attrs = {(i,): [["tt.divisibility", 16]] for i, d in enumerate(dtypes)
                 if d in POINTER_TYPES}
        source = ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                                  options={"num_warps": config.get("num_warps", 4)})
        return dict(compiled.asm)


def _arguments(meta: dict, finish: bool, sizes: list[dict] = ()) -> list[dict]:
    """The descriptions of a kernel's (or its finishing kernel's) arguments, in order;
    ``sizes``: its size arguments (symbolic sizes), after the tensors, before scratch."""
    scratch = list(meta.get("scratch", ()))
    if not finish or meta["finish"].get("inputs"):
        return [*meta["inputs"], *meta["outputs"], *sizes, *scratch]
    return [*scratch, *(meta["outputs"][i] for i in meta["finish"]["outputs"]), *sizes]


def resource_usage(cubin: bytes, kernel: str) -> dict[str, int]:
    """Registers per thread and spilled bytes per thread (the local memory ptxas gives a
    kernel for what does not fit in registers) of ``kernel`` in ``cubin``, as
    ``cuobjdump -res-usage`` reads them from the binary."""
    from triton import knobs
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        done = subprocess.run([knobs.nvidia.cuobjdump.path, "-res-usage", str(path)],
                              capture_output=True, text=True, check=True)
    text = done.stdout.split(f"Function {kernel}:", 1)[-1]
    regs, local = re.search(r"REG:(\d+)", text), re.search(r"LOCAL:(\d+)", text)
    if regs is None or local is None:
        raise RuntimeError(f"cuobjdump gave no resource usage for {kernel}: {done.stdout!r}")
    return {"registers": int(regs.group(1)), "spills": int(local.group(1))}
