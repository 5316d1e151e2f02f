"""A CPython entry point beside each kernel function, so a call skips ctypes.

ctypes converts each argument through its ``argtypes`` (~100 ns each): 1.3 us for a kernel
of 12 arguments, where a ``METH_FASTCALL`` function reading the same Python ints takes
0.18 us (measured on this project's CI machine). Kernels of small tensors are dominated by
such costs, so where the toolchain builds a library calling the interpreter (its probe
then defines ``TL_PYENTRY``; see toolchain.py) the translation unit gets, per kernel ``k``:

- ``tl_py_k(self, args, nargs)``: checks the argument count, converts each argument (a
  tensor to its data pointer, see below; float scalars ``PyFloat_AsDouble``, ints and
  sizes ``PyLong_AsLongLong``, bools ``PyObject_IsTrue``),
  raises the Python error a conversion set, calls ``k`` with the GIL released (as ctypes
  does) and returns None;
- ``tl_entry_k()``: a new builtin function object for it (``PyCFunction_New`` over a static
  method table in the library, which stays loaded: ctypes never unloads one).

:func:`python_entry` loads it (``None`` when the library has none: built without
``TL_PYENTRY``, or by an earlier version), and the launcher falls back to ctypes.

A data pointer argument is an int (``tensor.data_ptr()`` in the launcher) or a tensor the
launcher allocated itself, whose pointer is read in C (a ``data_ptr()`` in Python costs ~45
ns): for a tensor whose type is exactly ``torch.Tensor`` or ``torch.nn.Parameter`` through
torch's own C reader (the one Inductor's generated modules call,
``torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr``), handed to the library
once when it loads (``tl_set_tensors``); any other object gets its ``data_ptr()`` method
called. Only fresh tensors go whole: torch's reader throws a C++ exception, which would
abort the process through these C frames, for a tensor without storage (a ``vmap``'s
batched tensor is of type ``torch.Tensor``), where ``data_ptr()`` raises a Python error.
"""

from __future__ import annotations

import ctypes
import re
from typing import Any

import torch

#: CPython's stable ABI, declared here instead of including ``Python.h`` (whose parsing
#: cost ~0.25 s per library): every name below is in the limited API of Python >= 3.10
#: with this layout, and resolves against the running interpreter when the library loads,
#: as a C extension module's do
ENTRY_HEAD = """\
#ifdef TL_PYENTRY
#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>
typedef struct _object PyObject;
typedef intptr_t tl_py_ssize_t;
typedef PyObject* (*tl_py_fastcall)(PyObject*, PyObject* const*, tl_py_ssize_t);
typedef struct { const char* ml_name; tl_py_fastcall ml_meth; int ml_flags; const char* ml_doc; }
  tl_py_method;
#define TL_METH_FASTCALL 0x0080
extern PyObject* PyExc_TypeError;
extern void* PyLong_AsVoidPtr(PyObject*);
extern double PyFloat_AsDouble(PyObject*);
extern long long PyLong_AsLongLong(PyObject*);
extern int PyObject_IsTrue(PyObject*);
extern PyObject* PyErr_Occurred(void);
extern PyObject* PyErr_Format(PyObject*, const char*, ...);
extern void* PyEval_SaveThread(void);
extern void PyEval_RestoreThread(void*);
extern PyObject* Py_BuildValue(const char*, ...);
extern PyObject* PyCFunction_New(tl_py_method*, PyObject*);
extern PyObject* PyObject_Type(PyObject*);
typedef struct _typeobject tl_py_type;
extern tl_py_type PyLong_Type;
extern PyObject* PyObject_CallMethod(PyObject*, const char*, const char*, ...);
extern void Py_DecRef(PyObject*);
static void* (*tl_tensor_data)(PyObject*);
static PyObject* tl_tensor_types[2];
void tl_set_tensors(void* data, PyObject* tensor, PyObject* parameter) {
  tl_tensor_data = (void* (*)(PyObject*))data;
  tl_tensor_types[0] = tensor;
  tl_tensor_types[1] = parameter;
}
static void* tl_data_ptr(PyObject* o) {
  PyObject* type = PyObject_Type(o);
  int integer = type == (PyObject*)&PyLong_Type;
  int exact = type == tl_tensor_types[0] || type == tl_tensor_types[1];
  Py_DecRef(type);
  if (integer) return PyLong_AsVoidPtr(o);
  if (exact && tl_tensor_data) return tl_tensor_data(o);
  PyObject* p = PyObject_CallMethod(o, "data_ptr", NULL);
  if (!p) return NULL;
  void* v = PyLong_AsVoidPtr(p);
  Py_DecRef(p);
  return v;
}
#endif
"""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: argument kind -> (C declaration converting ``args[i]``, its own error test or "")
_CONVERT = {
    "pointer": ("void* v{i} = tl_data_ptr(args[{i}]);", ""),
    "float": ("double v{i} = PyFloat_AsDouble(args[{i}]);", ""),
    "int": ("int64_t v{i} = (int64_t)PyLong_AsLongLong(args[{i}]);", ""),
    "bool": ("int t{i} = PyObject_IsTrue(args[{i}]);", "t{i} < 0"),
}


def argument_kinds(meta: dict[str, Any]) -> list[str]:
    """The kernel's parameters in order, as :data:`_CONVERT` kinds."""
    kinds = [d["scalar"] if "scalar" in d else "pointer" for d in meta["inputs"]]
    kinds += ["pointer"] * len(meta["outputs"])
    kinds += ["int"] * len(meta.get("sizes", ()))
    return kinds + ["int"]  # the thread count


def entry_source(meta: dict[str, Any]) -> str:
    """The C text of kernel ``meta``'s Python entry (compiled only under ``TL_PYENTRY``)."""
    name = meta["kernel"]
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"not a kernel name: {name!r}")
    kinds = argument_kinds(meta)
    lines = ["#ifdef TL_PYENTRY",
             f"static PyObject* tl_py_{name}(PyObject* self, PyObject* const* args, "
             f"tl_py_ssize_t nargs) {{",
             "  (void)self;",
             f"  if (nargs != {len(kinds)}) {{",
             f"    PyErr_Format(PyExc_TypeError, \"{name} takes {len(kinds)} arguments "
             f"(%zd given)\", (ssize_t)nargs);",
             "    return NULL;",
             "  }"]
    errors = ["PyErr_Occurred()"]
    values = []
    for i, kind in enumerate(kinds):
        declaration, error = _CONVERT[kind]
        lines.append("  " + declaration.format(i=i))
        if error:
            errors.insert(0, error.format(i=i))
        values.append(f"(uint8_t)t{i}" if kind == "bool" else
                      f"(int)v{i}" if i == len(kinds) - 1 else f"v{i}")
    checks = "checks" in meta  # the kernel returns an int the launcher raises on
    lines += [f"  if ({' || '.join(errors)}) return NULL;",
              "  void* state = PyEval_SaveThread();  /* the GIL released, as ctypes does */",
              f"  {'int status = ' if checks else ''}{name}({', '.join(values)});",
              "  PyEval_RestoreThread(state);",
              "  return Py_BuildValue(\"i\", status);" if checks else
              "  return Py_BuildValue(\"\");  /* None */",
              "}",
              f"static tl_py_method tl_def_{name} = {{\"{name}\", tl_py_{name}, "
              f"TL_METH_FASTCALL, NULL}};",
              f"PyObject* tl_entry_{name}(void) {{ return PyCFunction_New(&tl_def_{name}, "
              f"NULL); }}",
              "#endif"]
    return "\n".join(lines) + "\n"


def python_entry(lib: ctypes.CDLL, name: str):
    """The builtin function ``tl_entry_<name>`` of ``lib`` makes (taking ints or tensors
    where the kernel takes data pointers), or None without one."""
    if not hasattr(lib, f"tl_entry_{name}") or not hasattr(lib, "tl_set_tensors"):
        return None  # (a library of an earlier version took the pointers as ints)
    # the same handle, called with the GIL held: these read and build Python objects
    pylib = ctypes.PyDLL(lib._name, handle=lib._handle)
    setter = ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.py_object, ctypes.py_object)(
        ("tl_set_tensors", pylib))
    setter(_tensor_reader(), torch.Tensor, torch.nn.Parameter)
    return ctypes.PYFUNCTYPE(ctypes.py_object)((f"tl_entry_{name}", pylib))()


def _tensor_reader() -> int | None:
    """The address of torch's C function reading a tensor's data pointer, or None."""
    try:
        from torch._C._dynamo.guards import _torchinductor_pyobject_tensor_data_ptr as address
    except ImportError:
        return None
    return int(address)
