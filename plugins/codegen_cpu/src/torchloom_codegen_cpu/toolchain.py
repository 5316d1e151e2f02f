"""The system C compiler: finding it, choosing flags, building and caching shared libraries.

``CC`` names the compiler (default ``cc``; gcc and clang both work). Flags: ``-O3
-march=native`` (the ISA it picks is recorded by the CPU's feature list in the cache key, so
a cache directory shared between machines never hands one a library built for another),
``-fopenmp`` (threads and ``#pragma omp simd``), ``-mprefer-vector-width=512`` on AVX-512
CPUs (``_width_flags``), and no fast-math: ``-fno-math-errno`` and
``-fno-trapping-math`` only let libm calls vectorize; NaN, inf and -0.0 behave as IEEE
says (one fold they allow, ``(float)(int)x`` into ``trunc(x)``, is undone where it changes
a zero's sign: ``Emitter.convert``). ``-ffp-contract=off``: ``a * b + c`` rounds the
product and the sum where they are two ops, as eager (each op its own kernel, its result
rounded) and Inductor's C++ (``cpp.enable_floating_point_contract_flag = "off"`` in torch
2.13) compute it. gcc's default fused them, so ``x * y - x * y`` gave the product's
rounding error where eager gives 0, and ``x + x * -4`` of 1e38 gave -3e38 where eager
gives -inf. Within one op eager's kernels do fuse: they call ``vec::fmadd`` (add, sub and
rsub with an alpha, lerp) or gcc contracts their expression as it builds ATen (addcmul's
``self + value * t1 * t2``, tanh_backward's ``1 - y * y``): those templates spell
``tl_fmaf``/``tl_fma`` (the prelude: one fused operation where the CPU has it), as do the
prelude's polynomials, whose results are bit for bit those they were measured with under
gcc's contraction (tl_tanh's clamp aside: see there). A value converted to bf16 or f16
still rounds from the f32 result as eager's does. ``-fwrapv``: integer overflow wraps, as
in eager. ``-fno-tree-pre`` (gcc): a NaN test of a value chosen with a constant kept whole
SIMD loops scalar (:data:`NO_PRE`). ``-Werror=implicit-function-declaration``: a call of
a function the source does not declare (a macro naming a function that does not exist) is
a build error, not a call of an ``int f()`` that returns garbage. Where a library may call
the interpreter's functions (resolved when it loads, as an extension module's: Linux),
``-DTL_PYENTRY``: kernels get CPython entries (entry.py).

A library is cached as ``<dir>/<key>.so`` where ``key`` hashes the source, the compiler's
path and version, the flags and the CPU features; ``<key>.so.sha256`` beside it vouches for
its bytes. A hit is loaded without running the compiler; a library whose digest does not
match, or which (or whose digest) is a symlink leading outside ``<dir>``, is damaged:
reported once (:class:`DamageReport`) and rebuilt in its place. Builds write a temporary
file and ``os.replace`` it into place, so processes compiling at once never see a
half-written library. The generated source is kept as ``<key>.c`` for bug reports.

A fleet shares libraries through an artifact store (``store``: the shared cache's
``artifact-cpu`` namespace, see ``with_artifacts`` in the codegen protocol): a library
missing locally is looked up there under its key before the compiler runs, written
atomically with its digest beside it, checked against that digest, and loaded once to
prove it loads; what the compiler builds is put there. An entry the store rejects (its HMAC
fails: forged or damaged) never reaches the disk; one that does not load is rejected,
deleted and rebuilt. The toolchain probe's record is shared the same way, so a process
whose fleet has built everything it needs runs no compiler at all.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import attrs
from filelock import FileLock
from torchloom.api import Activity, ArtifactStore

from torchloom_codegen_cpu import libmvec
from torchloom_codegen_cpu.entry import ENTRY_HEAD

log = logging.getLogger("torchloom.codegen_cpu")

FLAGS = ("-O3", "-march=native", "-std=gnu11", "-fopenmp", "-fno-math-errno",
         "-fno-trapping-math", "-ffp-contract=off", "-fwrapv",
         "-Werror=implicit-function-declaration", "-fPIC", "-shared")
#: CPU features that decide what -march=native generates
_ISA = ("sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
        "avx512dq", "avx512_bf16", "avx512_fp16", "amx_bf16", "asimd", "sve")


#: what the probe checks, in its record's key (a new check must not read an old record)
_PROBE = "libmvec-variants,pyentry,width,tables,no-pre"


class BuildError(Exception):
    """The compiler failed or timed out; the message names the kept source file."""


#: told of a damaged library: ``damaged(path, why)``
Damaged = Callable[[Path, str], None]


class DamageReport:
    """``damaged(path, why)`` that warns once per library: a library is looked at several
    times before it is rebuilt (before and under the build lock, by ``load``)."""

    def __init__(self):
        self._reported: set[str] = set()

    def __call__(self, path: Path, why: str) -> None:
        if str(path) not in self._reported:
            self._reported.add(str(path))
            log.warning("torchloom: cached library %s is damaged (%s); rebuilding it", path, why)


def directory_problem(directory: Path) -> str | None:
    """Why ``directory`` cannot hold libraries (it cannot be created, listed or written to:
    a file in its place or in place of a parent, no permission, a read-only disk), or None."""
    try:
        if directory.exists() and not directory.is_dir():
            return "a file is in its place"
        directory.mkdir(parents=True, exist_ok=True)
        os.listdir(directory)
        fd, probe_file = tempfile.mkstemp(dir=directory, prefix=".probe-")
        os.close(fd)
        os.unlink(probe_file)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def within(directory: Path, path: Path) -> bool:
    """Whether ``path``, symlinks followed, lies inside ``directory`` (itself resolved)."""
    try:
        return path.resolve().is_relative_to(directory.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        return False


@attrs.frozen
class Toolchain:
    """A compiler and how it is invoked."""

    cc: str  # resolved path
    version: str
    flags: tuple[str, ...]
    libs: tuple[str, ...]
    vector_math: bool  # libmvec's SIMD variants are declared and linked
    cpu: str  # the ISA features -march=native sees

    def identity(self) -> str:
        return "\0".join([self.cc, self.version, *self.flags, *self.libs, self.cpu])


def compiler_name() -> str:
    return os.environ.get("CC", "").strip() or "cc"


def find_compiler() -> str | None:
    """The resolved path of ``$CC`` (default ``cc``), or None."""
    name = compiler_name().split()[0]
    return shutil.which(name)


def cpu_features() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.uname().machine
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            have = set(line.split(":", 1)[1].split())
            return os.uname().machine + ":" + ",".join(f for f in _ISA if f in have)
    return os.uname().machine


def probe(cc: str, directory: Path, timeout: float,
          store: ArtifactStore | None = None) -> Toolchain:
    """The compiler's version, whether libmvec links and whether a library may call the
    interpreter (two tiny builds; kernels then get Python entries, entry.py), remembered in
    ``<dir>/toolchain-<key>.json`` keyed by the compiler file (path, size, mtime) and the
    CPU, so a warm process runs no compiler at all; with a ``store``, the record is read
    from it when missing here, and shared when probed here."""
    try:
        st = os.stat(cc)
        stamp = (f"{os.path.realpath(cc)}:{st.st_size}:{st.st_mtime_ns}:{cpu_features()}:"
                 f"{' '.join(FLAGS)}:{_PROBE}")
    except OSError:
        stamp = None
    record = None
    if stamp is not None:
        record = directory / f"toolchain-{hashlib.sha256(stamp.encode()).hexdigest()[:16]}.json"
        try:  # a record leading outside the directory is probed again and replaced
            if within(directory, record):
                return _recorded_toolchain(cc, record.read_bytes())
        except (OSError, ValueError, KeyError, TypeError):
            pass
        shared = store.get(record.stem) if store is not None else None
        if shared is not None:
            try:
                tc = _recorded_toolchain(cc, shared)
                directory.mkdir(parents=True, exist_ok=True)
                _atomic_write(record, shared)
                return tc
            except (ValueError, KeyError, TypeError) as exc:
                store.reject(record.stem, f"not a toolchain record: {exc}")
    tc = _probe(cc, directory, timeout)
    if record is not None:
        data = json.dumps(attrs.asdict(tc)).encode()
        _atomic_write(record, data)
        if store is not None:
            store.put(record.stem, data)
    return tc


def _recorded_toolchain(cc: str, data: bytes) -> Toolchain:
    """The toolchain a probe record (JSON) describes, for the compiler ``cc``."""
    record = json.loads(data)
    fields = {"version": str, "flags": list, "libs": list, "vector_math": bool, "cpu": str}
    for name, kind in fields.items():
        if not isinstance(record[name], kind):
            raise TypeError(f"{name} is not a {kind.__name__}")
    if not all(isinstance(f, str) for f in [*record["flags"], *record["libs"]]):
        raise TypeError("a flag is not a string")
    return Toolchain(cc, record["version"], tuple(record["flags"]), tuple(record["libs"]),
                     record["vector_math"], record["cpu"])


def _probe(cc: str, directory: Path, timeout: float) -> Toolchain:
    """Run the probe's compilers at once, each on its own thread (six short compiler runs
    that need nothing of each other: one after another they took 0.2 s of a cold first
    call on the 2-vCPU Xeon of RESULTS.md)."""
    features = cpu_features()
    libs = ("-lmvec", "-lm")
    # the prelude's libmvec block, loaded: every variant it names must resolve (glibc
    # before 2.35 lacks tan's, erf's, ...)
    test = ("#define TL_LIBMVEC 1\n#include <math.h>\n" + libmvec.declarations() +
            "void f(float* x, int n) {\n#pragma omp simd\n"
            "  for (int i = 0; i < n; i++) x[i] = expf(x[i]) + sin(x[i]);\n}\n")
    entry = ENTRY_HEAD + "PyObject* f(PyObject* o) { return PyLong_AsVoidPtr(o) ? " \
        "PyCFunction_New(NULL, o) : PyErr_Format(PyExc_TypeError, \"%d\", 1); }\n"
    with ThreadPoolExecutor(max_workers=6, thread_name_prefix="torchloom-probe") as pool:
        version = pool.submit(_version, cc, timeout)
        mvec = pool.submit(_compiles, cc, directory, timeout, test, libs, load=True)
        # built and loaded here: the interpreter's symbols must resolve in this process
        pyentry = pool.submit(_compiles, cc, directory, timeout, entry, (), ("-DTL_PYENTRY",),
                              load=True)
        width = pool.submit(_width_flags, cc, directory, timeout, features)
        tables = pool.submit(_table_flags, cc, directory, timeout, features)
        pre = pool.submit(_pre_flags, cc, directory, timeout)
        version, ok = version.result(), mvec.result()
        flags = FLAGS
        if ok:
            # gcc vectorizes calls to the prelude's `declare simd` libm declarations; clang
            # maps libm calls to libmvec itself (exp, log, sin, cos, pow as of clang 14)
            flags = (*FLAGS, "-DTL_LIBMVEC",
                     *(("-fveclib=libmvec",) if "clang" in version else ()))
        if pyentry.result():
            flags = (*flags, "-DTL_PYENTRY")  # kernels get Python entries (entry.py)
        flags = (*flags, *width.result(), *tables.result())
        if "clang" not in version:
            flags = (*flags, *pre.result())
    return Toolchain(cc, version, flags, libs if ok else ("-lm",), ok, features)


def _version(cc: str, timeout: float) -> str:
    """The first line ``cc --version`` prints ('?' for none)."""
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True,
                             timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"{cc} --version failed: {exc}") from None
    text = out.stdout or out.stderr
    return text.splitlines()[0] if text else "?"


def _width_flags(cc: str, directory: Path, timeout: float, features: str) -> tuple[str, ...]:
    """``-mprefer-vector-width=512`` where the CPU has AVX-512 and ``cc`` takes the flag:
    gcc's tuning for recent Intel cores (``-march=native`` takes the KVM guest of
    RESULTS.md's session 15, Sapphire Rapids' features under Rocket Lake's model number,
    for a Rocket Lake) prefers 256-bit vectors, which made a softmax row's kernel 1.02 ms where
    512-bit vectors take 0.79 ms (RESULTS.md, session 15); the kernels' reductions assume
    16 f32 lanes per row (``reduction.ROW_LANES``)."""
    if "avx512f" not in features.split(":")[-1].split(","):
        return ()
    flag = ("-mprefer-vector-width=512",)
    return flag if _compiles(cc, directory, timeout, "int f(int x) { return x; }\n", (),
                             flag) else ()


#: gcc's partial redundancy elimination off. It moves a NaN test (or a comparison) of a
#: value chosen with a constant (ReLU's ``x < 0 ? 0 : x``, a ``masked_fill`` of -inf) into
#: the choice, ``x < 0 ? 0 : x != x``: a choice between masks, which gcc 12's vectorizer
#: cannot build, so the whole SIMD loop ran scalar. 2 threads, the AMD EPYC Zen 4 of
#: RESULTS.md (session 67): ``amax(relu(x), -1)`` over 4096 x 1024 12.7 -> 0.22 ms, a
#: softmax over a ``masked_fill`` of -inf 8.2 -> 1.9 ms, ``maximum(relu(a), b)`` 25 -> 1.05
#: ms, ResNet's stem with its max pool decomposed 12.8 -> 2.0 ms. The kernels write values
#: once each (value numbering by source text, emitter.py): of the model zoo's 341 kernels
#: none vectorizes fewer loops without it, 236 compile to the same instructions, the
#: others within 2 % of their count. gcc only (clang has no such pass to turn off)
NO_PRE = ("-fno-tree-pre",)


def _pre_flags(cc: str, directory: Path, timeout: float) -> tuple[str, ...]:
    """:data:`NO_PRE` where ``cc`` takes it."""
    return NO_PRE if _compiles(cc, directory, timeout, "int f(int x) { return x; }\n", (),
                               NO_PRE) else ()


#: a table read in a SIMD loop, as the kernels' result tables are read (tables.py)
_GATHER_TEST = ("#include <stdint.h>\nfloat t[65536];\n"
                "void f(const uint16_t* restrict a, float* restrict o, int n) {\n"
                "#pragma omp simd\n  for (int i = 0; i < n; i++) o[i] = t[a[i]];\n}\n")


def _table_flags(cc: str, directory: Path, timeout: float, features: str) -> tuple[str, ...]:
    """``-DTL_TABLES=1`` (and the flag it needs) where ``cc`` compiles a table read in a
    SIMD loop to AVX-512 gathers: gcc 12 tunes for no particular CPU under
    ``-march=native`` on CPUs it does not know, and that tuning never gathers, so gcc's
    ``-mtune-ctrl=use_gather`` is tried first (one compiler run where it works; clang
    rejects it, and is tried without). Elsewhere (AVX2 machines, whose gathers are slow
    on some CPUs; no gathers at all) the kernels compute instead of reading tables."""
    if "avx512f" not in features.split(":")[-1].split(","):
        return ()
    for extra in (("-mtune-ctrl=use_gather",), ()):
        if "gather" in _assembly(cc, directory, timeout, _GATHER_TEST, extra):
            return (*extra, "-DTL_TABLES=1")
    return ()


def _compiles(cc: str, directory: Path, timeout: float, source: str,
              libs: tuple[str, ...], flags: tuple[str, ...] = (), load: bool = False) -> bool:
    """Whether ``cc`` builds ``source`` into a shared library with the kernels' flags
    (and, with ``load``, whether this process loads it)."""
    return _probe_build(cc, directory, timeout, source, libs, flags, load=load) is not None


def _assembly(cc: str, directory: Path, timeout: float, source: str,
              flags: tuple[str, ...]) -> str:
    """The assembly ``cc`` makes of ``source`` with the kernels' flags ('' on failure)."""
    return _probe_build(cc, directory, timeout, source, (), flags, assembly=True) or ""


def _probe_build(cc: str, directory: Path, timeout: float, source: str,
                 libs: tuple[str, ...], flags: tuple[str, ...], *, load: bool = False,
                 assembly: bool = False) -> str | None:
    """Build ``source`` in a temporary directory with the kernels' flags: a shared library
    (loaded in this process with ``load``) or, with ``assembly``, its assembly. The
    assembly text ('' for a library), or None when the compiler fails or times out or the
    library does not load."""
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        src, out = Path(tmp) / "probe.c", Path(tmp) / ("probe.s" if assembly else "probe.so")
        src.write_text(source)
        base = [f for f in FLAGS if f != "-shared"] + ["-S"] if assembly else list(FLAGS)
        try:
            if subprocess.run([cc, *base, *flags, "-o", str(out), str(src), *libs],
                              capture_output=True, timeout=timeout).returncode != 0:
                return None
            if load:
                ctypes.CDLL(str(out))
            return out.read_text() if assembly else ""
        except (OSError, subprocess.TimeoutExpired):
            return None


def library_path(directory: Path, source: str, tc: Toolchain) -> Path:
    key = hashlib.sha256((source + "\0" + tc.identity()).encode()).hexdigest()[:32]
    return directory / f"{key}.so"


def cached_library(path: Path, damaged: Damaged | None = None) -> bool:
    """True when ``path`` exists, it and the digest beside it lie inside its directory
    (symlinks followed), and its bytes match that digest. A library there that fails a
    check is told to ``damaged`` (default: a warning each time) and the caller rebuilds it;
    a missing one (or its digest missing: a build cut short) is simply not cached."""
    sidecar = path.with_name(path.name + ".sha256")
    if not os.path.lexists(path):
        return False
    damaged = damaged or DamageReport()
    if not (within(path.parent, path) and within(path.parent, sidecar)):
        damaged(path, "it leads outside the cache directory")
        return False
    try:
        recorded = sidecar.read_text().strip()
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return False
    if recorded != actual:
        damaged(path, "it does not match its checksum")
        return False
    return True


def build(source: str, tc: Toolchain, directory: Path, timeout: float,
          store: ArtifactStore | None = None, damaged: Damaged | None = None) -> Path:
    """The library for ``source``: from the cache, from ``store`` (the fleet's), or built
    (atomically), cached, and shared through ``store``. A damaged library found in the
    cache is told to ``damaged`` (default: one warning per call) and rebuilt."""
    path = library_path(directory, source, tc)
    damaged = damaged or DamageReport()
    if cached_library(path, damaged):
        return path
    directory.mkdir(parents=True, exist_ok=True)
    # processes building the same library at once (DDP ranks): one builds, the others wait
    # and load it
    with FileLock(str(path.with_name(path.name + ".lock")), timeout=timeout + 60):
        if cached_library(path, damaged):
            return path
        if store is not None and fetch_library(store, path, damaged):
            _atomic_write(path.with_suffix(".c"), source.encode())  # for bug reports
            return path
        _build_locked(source, tc, path, timeout)
        if store is not None:
            store.put(path.stem, path.read_bytes())
        return path


def fetch_library(store: ArtifactStore, path: Path, damaged: Damaged | None = None) -> bool:
    """Whether ``store`` had the library ``path`` names (by its key), now at ``path`` with
    its digest, checked and loadable. An entry that does not load is rejected and removed:
    the caller builds the library."""
    data = store.get(path.stem)
    if data is None:
        return False
    _atomic_write(path, data)
    _atomic_write(path.with_name(path.name + ".sha256"), hashlib.sha256(data).hexdigest().encode())
    try:
        if not cached_library(path, damaged):
            raise OSError("its bytes changed on the disk as they were written")
        ctypes.CDLL(str(path))
    except OSError as exc:
        store.reject(path.stem, f"the library does not load: {exc}")
        for stale in (path, path.with_name(path.name + ".sha256")):
            stale.unlink(missing_ok=True)
        return False
    return True


def _build_locked(source: str, tc: Toolchain, path: Path, timeout: float) -> Path:
    directory = path.parent
    src = path.with_suffix(".c")
    _atomic_write(src, source.encode())
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.stem}.", suffix=".so")
    os.close(fd)
    try:
        try:
            with Activity(f"cpu codegen: {os.path.basename(tc.cc)} building {path.stem}"):
                done = subprocess.run([tc.cc, *tc.flags, "-o", tmp, str(src), *tc.libs],
                                      capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BuildError(f"{tc.cc} did not finish within {timeout:g} s (set "
                             f"TORCHLOOM_CC_TIMEOUT); source kept at {src}") from None
        if done.returncode != 0:
            tail = "\n".join(done.stderr.strip().splitlines()[-12:])
            log.error("torchloom: %s failed on %s:\n%s", tc.cc, src, done.stderr)
            raise BuildError(f"internal error: {tc.cc} failed (exit {done.returncode}) on the "
                             f"generated source kept at {src}: {tail}")
        data = Path(tmp).read_bytes()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _atomic_write(path.with_name(path.name + ".sha256"),
                  hashlib.sha256(data).hexdigest().encode())
    return path


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
