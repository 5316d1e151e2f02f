"""The backward graph compiled right after its forward (``[runtime] backward = "ahead"``).

aot_autograd splits a training graph into a forward and a backward and compiles the
backward lazily, at the first ``backward()`` call (so that ``retain_graph=True`` there can
still turn off its donated buffers). A first training step then runs: the forward's
compile, the forward (waiting for its C compiler), the backward's compile, the backward
(waiting for its compiler): each compiler waited for while the interpreter idles. Compiled
ahead, right after the forward in the same backend call, the backward's passes and plan run
while the forward's compiler works, and the backward's compiler while the forward runs.

The result is handed to aot_autograd's lazy call only where it is what that call would
compile: the same graph (the partitioner's module, which aot_autograd deep-copies) and
the same donated inputs (a first ``backward(retain_graph=True)`` donates none). Otherwise
the lazy call compiles as before, and the work done ahead is lost (its compilation is
still listed). The ahead compile is the lazy one moved: the same ``compile_fx`` call, with
aot_autograd's placeholders (the partitioner's fake values) as inputs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

from torchloom.environment import env_choice
from torchloom.passes.pipeline import BACKWARD_POLICIES

log = logging.getLogger("torchloom")


def backward_policy(configured: str | None) -> str:
    """``TORCHLOOM_BACKWARD``, else the pipeline's ``configured`` value, else "ahead"."""
    return env_choice("TORCHLOOM_BACKWARD", configured, "ahead", BACKWARD_POLICIES,
                      "[runtime] backward")


def _signature(gm) -> tuple:
    """What tells the backward module apart from another: its nodes, by name and target."""
    return tuple((n.op, n.name, str(n.target)) for n in gm.graph.nodes)


class AheadBackward:
    """One backend call's backward, compiled by ``compile`` after its forward and handed
    to the lazy call by ``take`` (see the module's doc). ``compile_backward(gm, inputs,
    donated)`` compiles a backward module; ``donated_of(inputs)`` says which inputs
    aot_autograd donates, read in the context it compiles in."""

    def __init__(self, compile_backward: Callable[[Any, list, Sequence[int]], Callable],
                 donated_of: Callable[[list], Sequence[int]]):
        self._compile = compile_backward
        self._donated_of = donated_of
        self._module = None  # the partitioner's backward module, until compiled
        #: (signature, donated, callable) of the backward compiled ahead, until taken
        self._compiled: tuple[tuple, tuple[int, ...], Callable] | None = None

    def partitioner(self, partition_fn: Callable) -> Callable:
        """``partition_fn``, keeping the backward module it returns."""
        def partition(joint_module, joint_inputs, **kwargs):
            forward, backward = partition_fn(joint_module, joint_inputs, **kwargs)
            self._module = backward
            return forward, backward
        return partition

    def compile(self) -> None:
        """Compile the kept backward module now (once; nothing if none was kept). Whatever
        fails here is logged and left to the lazy call, which compiles (and reports) it as
        it always did: the forward's compile never fails for its backward."""
        module, self._module = self._module, None
        if module is None:
            return
        from torch.utils._python_dispatch import _disable_current_modes
        try:
            inputs = [n.meta.get("val") for n in module.graph.find_nodes(op="placeholder")]
            donated = tuple(self._donated_of(inputs))
            # the lazy call runs under no mode; the forward's compiler, under the tracer's
            # fake tensor mode, which would also slow every torch call of the passes
            with _disable_current_modes():
                copied = deepcopy(module)  # as aot_autograd hands its lazy call one
                compiled = self._compile(copied, inputs, donated)
        except Exception as exc:  # noqa: BLE001 (the lazy call compiles it again)
            log.info("torchloom: the backward was not compiled ahead (%s: %s); it compiles "
                     "at the first backward()", type(exc).__name__, exc)
            return
        self._compiled = (_signature(module), donated, compiled)

    def take(self, gm, donated: Sequence[int]) -> Callable | None:
        """The backward compiled ahead if ``gm`` and ``donated`` are what it compiled
        (then forgotten here), else None."""
        compiled, self._compiled = self._compiled, None
        if compiled is None or compiled[1] != tuple(donated) or compiled[0] != _signature(gm):
            return None
        return compiled[2]
