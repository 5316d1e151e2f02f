"""Groups whose native kernel is still building when the plan is made.

A codegen may build in the background (the codegen protocol, :mod:`torchloom.codegen.base`:
a kernel with ``ready()`` and ``resolve()``; the ``cpu`` codegen's graph library compiles on
a thread from ``prepare`` on). The plan is then made while the compiler runs, and each such
group's kernel is a :class:`Tiered`, which runs, per call, by the pipeline's ``[runtime]
first_calls`` (``TORCHLOOM_FIRST_CALLS`` overrides it):

- ``"wait"`` (the default): the first call waits for the build, then every call runs the
  native kernel (what the plan is made meanwhile saves);
- ``"eager"``: until the build has ended, calls run the group op by op with torch (eager's
  values and effects; the outputs copied into buffers laid out as the native kernel lays
  them out, or into the buffers the plan gives, as the kernel would write them), so the
  first call does not wait for the compiler at all; the first call after it runs the native
  kernel. Groups with symbolic output sizes are resolved when the plan is made (their
  layouts are the kernel's to say): they wait there, as before.

A build that fails leaves the group op by op for good, reported as a codegen failure of
the group is (``on_failure``: the compiled graph records it in the group's choice).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchloom.codegen.base import same_strides
from torchloom.environment import env_choice

#: ``[runtime] first_calls``' values
FIRST_CALLS = ("wait", "eager")


def first_calls_policy(configured: str | None) -> str:
    """``TORCHLOOM_FIRST_CALLS``, else the pipeline's ``configured`` value, else "wait"."""
    return env_choice("TORCHLOOM_FIRST_CALLS", configured, "wait", FIRST_CALLS,
                      "[runtime] first_calls")


class Tiered:
    """A group's kernel that a codegen builds in the background (see the module's doc).

    ``native``: the codegen's kernel (``ready()``, ``resolve()``); ``eager()``: the group's
    region run op by op (built on its first use); ``strides``: per output, the strides the
    native kernel lays it out with (static sizes: a group of symbolic output sizes is
    resolved when the plan is made, never tiered); ``on_failure(exc)``: the build failed
    (the group then runs op by op)."""

    #: outputs laid out as their types, on both paths (the native kernel's promise)
    exact_layouts = True

    def __init__(self, native: Any, eager: Callable[[], Callable[..., tuple]],
                 strides: tuple[tuple[int, ...], ...], *, wait: bool,
                 on_failure: Callable[[BaseException], None]):
        self.native = native
        self.inplace = getattr(native, "inplace", frozenset())
        self._make_eager = eager
        self._eager: Callable[..., tuple] | None = None
        self._strides = strides
        self._wait = wait
        self._on_failure = on_failure
        #: what every call runs once decided (the native kernel's call and ``into``, or
        #: the group op by op after a failed build); None: not decided yet
        self._run: Callable[..., tuple] | None = None
        self._into: Callable[..., tuple] | None = None
        self._native = False  # the native kernel runs from now on
        self._trusting: list[Tiered] = []  # (``trusting``'s, which the plan may call)

    def _decide(self) -> bool:
        """Whether the native kernel runs this call: waits for it under "wait"; a failed
        build is reported once and the group stays op by op."""
        if not self._wait and not self.native.ready():
            return False
        try:
            kernel = self.native.resolve()
        except Exception as exc:  # noqa: BLE001 (the group's codegen failed: eager)
            self._on_failure(exc)
            self._run, self._into = self._eager_call, self._eager_into
            return True
        self._run = kernel
        self._into = getattr(kernel, "into", None) or (lambda outs, *args: kernel(*args))
        self._native = True
        return True

    @property
    def native_now(self) -> bool:
        """Whether calls run the native kernel from now on (this kernel or the variants
        ``trusting`` made of it, which the plan calls in its place)."""
        return self._native or any(t.native_now for t in self._trusting)

    def __call__(self, *args):
        if self._run is not None or self._decide():
            return self._run(*args)
        return self._eager_call(*args)

    def into(self, outs: tuple, *args):
        if self._run is not None or self._decide():
            return self._into(outs, *args)
        return self._eager_into(outs, *args)

    def trusting(self, inputs: dict[int, Any], outputs: dict[int, Any],
                 whole: bool = False) -> Tiered:
        """The native kernel's ``trusting`` of these positions, tiered alike (the op by op
        path checks nothing, so trusts anything)."""
        method = getattr(self.native, "trusting", None)
        if method is None:
            return self
        variant = Tiered(method(inputs, outputs, whole=whole), self._region, self._strides,
                         wait=self._wait, on_failure=self._on_failure)
        self._trusting.append(variant)
        return variant

    # ---- op by op ------------------------------------------------------------------------
    def _region(self) -> Callable[..., tuple]:
        if self._eager is None:
            self._eager = self._make_eager()
        return self._eager

    def _eager_call(self, *args):
        return self._eager_into((), *args)

    def _eager_into(self, outs: tuple, *args):
        """The region's results, each copied into ``outs[j]`` where that tensor has the
        output's dtype, shape and strides (as the kernel would write it), else into a new
        tensor laid out as the kernel lays it out: never a view of an input or of a
        constant the region holds, since the plan may write into the buffers of a kernel's
        outputs later."""
        import torch
        results = self._region()(*args)
        # a result viewing a buffer given to be written (an input of an in-place pair) is
        # copied out first: writing that buffer would change it
        written = {t.untyped_storage().data_ptr() for t in outs if t is not None}
        results = [r.clone() if r.untyped_storage().data_ptr() in written else r
                   for r in results]
        done = []
        for j, r in enumerate(results):
            strides = self._strides[j]
            given = outs[j] if j < len(outs) else None
            if given is not None and given.dtype == r.dtype and given.shape == r.shape \
                    and same_strides(given.shape, given.stride(), strides):
                done.append(given.copy_(r))
            else:
                done.append(torch.empty_strided(r.shape, strides, dtype=r.dtype,
                                                device=r.device).copy_(r))
        return tuple(done)


class TieredCall:
    """A codegen's function for a plain op node (``library_call``) whose library builds in
    the background (it has ``ready()``), under ``first_calls = "eager"``: the op itself
    runs until the library is built (the function gives the op's results and effects, the
    codegen protocol's promise), the function from then on."""

    __slots__ = ("_fn", "_op", "_run")

    def __init__(self, fn: Any, op: Callable):
        self._fn, self._op = fn, op
        self._run: Callable | None = None

    def __call__(self, *args, **kwargs):
        if self._run is None:
            if not self._fn.ready():
                return self._op(*args, **kwargs)
            self._run = self._fn
        return self._run(*args, **kwargs)
