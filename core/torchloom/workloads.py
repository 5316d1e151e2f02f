"""Workloads: a Python file whose ``workload()`` (optionally taking ``device``) returns
``(callable, example_inputs)``; loading one, running it eagerly, flattening its outputs,
asking whether it builds a backward graph, comparing results. ``torchloom explain`` and
``torchloom bench`` (:mod:`torchloom.report.explain`, :mod:`torchloom.cli.bench`), the kernel
gate and :mod:`torchloom.tools` load workloads through it."""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys
from pathlib import Path

import torch

from torchloom.errors import WorkloadError


def import_workload(path: str | Path):
    """Import a workload file as a module. As for a script run with ``python file.py``,
    its own folder is searched first while it is imported, so it can import the modules
    beside it (``from lstm_cell import lstm_cell``)."""
    path = Path(path)
    if not path.exists():
        raise WorkloadError(f"{path}: workload file does not exist")
    if path.is_dir():
        raise WorkloadError(f"{path} is a directory; give a Python file defining workload() "
                            f"(such as examples/gelu_bookend.py)")
    spec = importlib.util.spec_from_file_location(f"torchloom_workload_{path.stem}", path)
    if spec is None:
        raise WorkloadError(f"{path}: a workload must be a Python file ending in .py")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    # registered as any imported module is: Dynamo finds a traced function's globals
    # through sys.modules[fn.__module__] (a workload's helper called from a model failed
    # with ModuleNotFoundError)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(spec.name, None)
        raise WorkloadError(f"{path}: importing the workload failed: "
                            f"{type(exc).__name__}: {exc}") from exc
    finally:
        sys.path.remove(folder)
    return module


def load_workload(path: str | Path, device: str = "cpu"):
    """Import a workload file and call its ``workload()``."""
    path = Path(path)
    module = import_workload(path)
    fn = getattr(module, "workload", None)
    if fn is None:
        raise WorkloadError(f"{path} defines no workload() function; it must return "
                            f"(callable, example_inputs)")
    try:
        params = inspect.signature(fn).parameters
        result = fn(device=device) if "device" in params else fn()
    except Exception as exc:
        raise WorkloadError(f"{path}: workload() failed: {type(exc).__name__}: {exc}") from exc
    problem = _not_a_workload(result)
    if problem:
        raise WorkloadError(f"{path}: workload() must return a pair (callable, "
                            f"example_inputs), such as `return model, [torch.randn(8, 16)]`, "
                            f"but {problem}")
    model, inputs = result
    return model, list(inputs)


def _not_a_workload(result) -> str | None:
    """What is wrong with what ``workload()`` returned, or None for a good pair."""
    if not isinstance(result, (tuple, list)):
        return f"it returned {_describe(result)}"
    if len(result) != 2:
        return f"it returned a {type(result).__name__} of {len(result)} items"
    model, inputs = result
    if not callable(model):
        return f"its first item is {_describe(model)}, which is not callable"
    if isinstance(inputs, (str, bytes, dict, torch.Tensor)) or not hasattr(inputs, "__iter__"):
        return (f"its second item is {_describe(inputs)}, not a list or tuple of inputs "
                f"(one tensor: [x])")
    return None


def _describe(value) -> str:
    """``None``, ``a function gelu``, ``a Tensor of shape [4, 8]``, ``an int``..."""
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a Tensor of shape {list(value.shape)}"
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    label = getattr(value, "__name__", None)
    return f"{article} {name}" + (f" {label}" if isinstance(label, str) else "")


def run_eagerly(workload, thunk):
    """Run the workload's callable eagerly; its failure is the workload's (a user error)."""
    try:
        return thunk()
    except Exception as exc:
        raise WorkloadError(f"{workload}: running the workload eagerly failed: "
                            f"{type(exc).__name__}: {exc}") from exc


def flatten(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in flatten(item)]
    if isinstance(x, dict):
        return [t for item in x.values() for t in flatten(item)]
    return []


def needs_backward(model, inputs) -> bool:
    """Whether running ``model`` builds a backward graph: an input or parameter needs a
    gradient, also where ``model`` is a function closing over a model's parameters (it is
    run once, eagerly, and its outputs asked whether they need gradients)."""
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
        return True
    if isinstance(model, torch.nn.Module):
        return any(p.requires_grad for p in model.parameters())
    if not torch.is_grad_enabled():
        return False
    args = [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    return any(t.requires_grad for t in flatten(model(*args)))


def max_abs_error(expected: list[torch.Tensor], actual: list[torch.Tensor]) -> float:
    """The largest absolute difference of any output (NaN matching NaN and equal
    infinities count 0); inf where they cannot be compared."""
    return max((diff for diff, _ in _differences(expected, actual)), default=0.0)


def max_scaled_error(expected: list[torch.Tensor], actual: list[torch.Tensor]) -> float:
    """The largest of each output's absolute difference over ``max(1, its largest finite
    |expected| value)``: float32 rounding, judged against the values it rounds (the
    gradients of a model's summed logits reach 1e4, where eager's own error is 1e-2)."""
    return max((diff / max(1.0, scale) for diff, scale in _differences(expected, actual)),
               default=0.0)


def _differences(expected, actual) -> list[tuple[float, float]]:
    """Per output: (largest absolute difference, largest finite |expected| value);
    [(inf, 0)] where the outputs cannot be compared."""
    if len(expected) != len(actual):
        return [(math.inf, 0.0)]
    found = []
    for e, a in zip(expected, actual):
        if e.shape != a.shape:
            return [(math.inf, 0.0)]
        if e.numel() == 0:
            continue
        e, a = e.double(), a.double()
        diff = (e - a).abs()
        diff = torch.where((torch.isnan(e) & torch.isnan(a)) | (e == a),
                           torch.zeros_like(diff), diff)
        if torch.isnan(diff).any():  # NaN on one side only: not comparable
            return [(math.inf, 0.0)]
        finite = e.abs()[torch.isfinite(e)]
        found.append((float(diff.max()), float(finite.max()) if finite.numel() else 0.0))
    return found
