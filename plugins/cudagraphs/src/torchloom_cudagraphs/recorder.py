"""Record a compiled callable into CUDA graphs and replay it, one recording per input layout.

Per input layout (shape, strides, dtype and device of every argument):

1. the first ``warmup`` calls run the callable normally; the arguments' addresses are
   noted (the arguments are held meanwhile, so an equal address means the same memory);
2. the next call records: arguments whose address never changed (parameters, buffers,
   state the caller updates in place) are read by the recording where they live; every
   other argument gets a static buffer that each call copies into. The callable runs
   once more on the capture stream (so lazy initialisation such as cuBLAS workspaces
   happens outside the capture), then is captured into a ``torch.cuda.CUDAGraph``;
3. later calls copy the changing arguments in and replay. Outputs are copied out by
   default, so a result the caller still holds is never overwritten by a later replay
   (the seed hands out its static outputs; see pytorch #170604). With
   ``reuse_outputs`` the recording's own buffers are returned: no copy, but every
   replay overwrites what the previous call returned. Outputs the IR says are
   arguments, or views of arguments, are handed back as the caller's argument or the
   same view of it, never as a view of a static buffer.

A "static" argument that later arrives at another address is demoted to a copied one and
the layout is recorded again. After ``max_records`` recordings no new layout is recorded:
new layouts run the callable normally, with the reason logged once. Every reason for not
replaying is logged once per runner and kept in :attr:`CudaGraphRunner.reasons`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger("torchloom.cudagraphs")

Signature = tuple


def layout_key(args: tuple) -> Signature:
    """Shape, strides, dtype and device index of every argument (AttributeError when one
    is not a tensor). CPU tensors have device index -1, so their layouts never match a
    recording's."""
    return tuple([(a.shape, a.stride(), a.dtype, a.get_device()) for a in args])


def all_cuda(args: tuple) -> bool:
    return all(isinstance(a, torch.Tensor) and a.is_cuda for a in args)


def signature(args: tuple) -> Signature | None:
    """The layout key of ``args``, or None when one is not a CUDA tensor."""
    return layout_key(args) if all_cuda(args) else None


def has_internal_overlap(t: torch.Tensor) -> bool:
    """True when two elements share memory (an expanded tensor): it cannot be copied into."""
    return any(stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride()))


_CLONE, _KEEP, _ARG, _VIEW, _DERIVED = "clone", "keep", "arg", "view", "derived"


class Unrecordable(Exception):
    """The recording does not behave as the IR says; recording stops with this reason."""


class _Recording:
    """One layout: its warm-up observations, then its CUDA graph and static buffers."""

    __slots__ = ("warm_calls", "held", "stable", "graph", "inputs", "copied", "static",
                 "static_ptrs", "outputs", "demoted", "plan", "mode")

    def __init__(self, n_args: int):
        self.warm_calls = 0
        self.held: tuple = ()           # the previous warm-up's arguments, kept alive
        self.stable = [True] * n_args    # same address in every call so far
        self.demoted: set[int] = set()  # found to move after being recorded as static
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: list[torch.Tensor] = []    # what the recording reads, per argument
        self.copied: list[int] = []             # arguments copied into static buffers
        self.static: list[int] = []             # arguments read in place
        self.static_ptrs: list[int] = []
        self.outputs: tuple = ()
        #: per output: (how it is handed out, argument index, (size, stride, offset))
        self.plan: list[tuple[str, int, tuple]] = []
        #: "clone" or "keep" when every output is handled alike, else None (use ``plan``)
        self.mode: str | None = None

    def observe(self, args: tuple) -> None:
        for i, (old, new) in enumerate(zip(self.held, args)):
            if old.data_ptr() != new.data_ptr():
                self.stable[i] = False
        self.held = args
        self.warm_calls += 1

    def restart(self) -> None:
        """Warm up again (a layout that cannot be recorded stays on the plain path)."""
        self.warm_calls = 0

    def release(self) -> None:
        """Let the last warm-up's arguments go (before a capture)."""
        self.held = ()

    def demote(self, args: tuple) -> None:
        """Static arguments that moved since the recording are copied from now on: the
        recording is dropped and the layout warms up again from ``args``."""
        self.demoted.update(i for i, p in zip(self.static, self.static_ptrs)
                            if args[i].data_ptr() != p)
        self.graph, self.inputs, self.outputs, self.static, self.static_ptrs = \
            None, [], (), [], []
        self.held, self.warm_calls = (), 0
        self.stable = [i not in self.demoted for i in range(len(args))]
        self.observe(args)

    def keep(self, graph: torch.cuda.CUDAGraph, inputs: list, static: list[int],
             copied: list[int], static_ptrs: list[int], outputs: tuple,
             plan: list[tuple[str, int, tuple]]) -> None:
        """A capture that succeeded: what it reads and writes, and how outputs go out."""
        self.inputs, self.static, self.copied, self.static_ptrs = \
            inputs, static, copied, static_ptrs
        self.outputs, self.plan = outputs, plan
        kinds = {kind for kind, _, _ in plan}
        self.mode = kinds.pop() if len(kinds) == 1 and kinds <= {_CLONE, _KEEP} else None
        self.graph = graph


class CudaGraphRunner:
    """Callable replacing a compiled graph's function; see the module docstring."""

    def __init__(self, fn: Callable[..., tuple], *, reuse_outputs: bool = False,
                 max_records: int = 8, warmup: int = 1, name: str = "graph",
                 aliases: dict[int, int] | None = None,
                 note: Callable[[str], None] | None = None):
        self.fn = fn
        #: output index -> index of the argument it is (a view of), from the IR
        self.aliases = dict(aliases or {})
        self.reuse_outputs = reuse_outputs
        self.max_records = max_records
        self.warmup = warmup
        self.name = name
        self._note = note
        self._recordings: dict[Signature, _Recording] = {}
        self._stream: torch.cuda.Stream | None = None
        #: why recording stopped for good (max_records reached, a capture failed)
        self.stopped: str | None = None
        #: every reason logged so far, in order, each once
        self.reasons: list[str] = []
        self.records = 0
        self.replays = 0
        self.plain_calls = 0

    def __call__(self, *args):
        try:
            rec = self._recordings.get(layout_key(args))
        except AttributeError:  # not a tensor
            rec = None
        if rec is not None and rec.graph is not None:
            for i, ptr in zip(rec.static, rec.static_ptrs):
                if args[i].data_ptr() != ptr:
                    break
            else:
                return self._replay(rec, args)
        return self._slow_call(args)

    def _replay(self, rec: _Recording, args: tuple) -> tuple:
        inputs = rec.inputs
        for i in rec.copied:
            inputs[i].copy_(args[i])
        rec.graph.replay()
        self.replays += 1
        if rec.mode == _CLONE:
            return tuple([o.clone() for o in rec.outputs])
        if rec.mode == _KEEP:
            return rec.outputs
        return _results(rec, args)

    # ---- everything but a replay --------------------------------------------------------
    def _slow_call(self, args: tuple):
        key = signature(args)
        if key is None:
            return self._plain(args, f"@{self.name} was called with an argument that is not "
                                     f"a CUDA tensor")
        if torch.cuda.is_current_stream_capturing():  # inside the caller's own capture
            return self._plain(args, None)
        rec = self._recordings.get(key)
        if rec is None:
            if self.stopped is not None:
                return self._plain(args, self.stopped)
            rec = self._recordings[key] = _Recording(len(args))
        if rec.graph is None and rec.warm_calls < self.warmup:
            rec.observe(args)
            return self._plain(args, None)
        if self.stopped is None and self.records >= self.max_records:
            self.stopped = (f"@{self.name}: recorded {self.records} time(s), the limit "
                            f"(max_records = {self.max_records}); new input layouts and "
                            f"moved static inputs now run without CUDA graphs")
        if self.stopped is not None:  # a recording that exists keeps replaying
            return self._plain(args, self.stopped)
        if rec.graph is not None:  # a static argument moved: demote it, warm up, record again
            rec.demote(args)
            return self._plain(args, None)
        rec.observe(args)
        overlapping = [i for i, a in enumerate(args)
                       if not rec.stable[i] and has_internal_overlap(a)]
        if overlapping:
            rec.restart()  # not recordable; stay on the plain path for this layout
            return self._plain(args, f"@{self.name}: argument {overlapping[0]} is an expanded "
                                     f"tensor (shared elements), which cannot be copied into a "
                                     f"static buffer")
        caller_stream = torch.cuda.current_stream()
        try:
            self._record(rec, args)
        except Exception as exc:  # a capture the static checks did not foresee
            # torch.cuda.graph leaves its capture stream current when capture_end raises
            torch.cuda.set_stream(caller_stream)  # (the recording keeps no graph)
            self.stopped = (f"@{self.name}: recording failed ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''}); running "
                            f"without CUDA graphs")
            return self._plain(args, self.stopped)
        return self._replay(rec, args)

    def _record(self, rec: _Recording, args: tuple) -> None:
        static = [i for i in range(len(args)) if rec.stable[i]]
        copied = [i for i in range(len(args)) if not rec.stable[i]]
        inputs = list(args)
        for i in copied:
            a = args[i]
            inputs[i] = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
            inputs[i].copy_(a)
        static_ptrs = [args[i].data_ptr() for i in static]
        rec.release()
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.no_grad():
            with torch.cuda.stream(stream):  # initialise lazily-created state off-capture
                self.fn(*inputs)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                outputs = tuple(self.fn(*inputs))
        plan = self._output_plan(outputs, inputs, len(args))
        rec.keep(graph, inputs, static, copied, static_ptrs, outputs, plan)
        self.records += 1
        log.debug("torchloom: cudagraphs recorded @%s (%d copied, %d static inputs)",
                  self.name, len(copied), len(static))

    def _output_plan(self, outputs: tuple, inputs: list,
                     n_args: int) -> list[tuple[str, int, tuple]]:
        """How each recorded output is handed out: a copy (default), the recording's own
        tensor (``reuse_outputs``, non-tensors, views of bound constants), the caller's
        argument itself, the same view of the caller's argument, or the same view of
        another output's copy (outputs sharing memory keep sharing it)."""
        plan = []
        for k, out in enumerate(outputs):
            j = self.aliases.get(k)
            if j is None or j >= n_args:
                copy = isinstance(out, torch.Tensor) and not self.reuse_outputs and j is None
                plan.append((_CLONE if copy else _KEEP, -1, ()))
                continue
            src = inputs[j]
            if out is src:
                plan.append((_ARG, j, ()))
                continue
            if (not isinstance(out, torch.Tensor) or out.dtype != src.dtype
                    or out.untyped_storage().data_ptr() != src.untyped_storage().data_ptr()):
                raise Unrecordable(f"output {k} should be a view of argument {j} but does not "
                                   f"share its memory with the same dtype")
            plan.append((_VIEW, j, _view_of(out, src)))
        _derive_shared_outputs(outputs, plan)
        return plan

    def _plain(self, args: tuple, reason: str | None):
        if reason is not None and reason not in self.reasons:
            self.reasons.append(reason)
            log.warning("torchloom: cudagraphs: %s", reason)
            if self._note is not None:
                self._note(f"cudagraphs: {reason}")
        self.plain_calls += 1
        return self.fn(*args)

    @property
    def recorded(self) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """Per live recording: (arguments copied into static buffers, arguments read in
        place)."""
        return [(tuple(r.copied), tuple(r.static)) for r in self._recordings.values()
                if r.graph is not None]

    def __repr__(self) -> str:
        return (f"CudaGraphRunner(@{self.name}, records={self.records}, "
                f"replays={self.replays}, plain_calls={self.plain_calls})")


def _view_of(view: torch.Tensor, base: torch.Tensor) -> tuple:
    """(size, stride, storage offset relative to ``base``) rebuilding ``view`` from base."""
    return (tuple(view.shape), view.stride(), view.storage_offset() - base.storage_offset())


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """First and last storage element ``t`` reads (strides are non-negative here)."""
    last = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.storage_offset(), last


def _derive_shared_outputs(outputs: tuple, plan: list) -> None:
    """Among copied outputs sharing storage, copy only the one holding all the others
    (contiguous, same dtype) and hand the rest out as views of its copy."""
    by_storage: dict[int, list[int]] = {}
    for k, (kind, _, _) in enumerate(plan):
        if kind == _CLONE and outputs[k].numel() > 0:
            by_storage.setdefault(outputs[k].untyped_storage().data_ptr(), []).append(k)
    for ks in by_storage.values():
        if len(ks) < 2:
            continue

        def holds_all(r: int) -> bool:
            root = outputs[r]
            lo, hi = root.storage_offset(), root.storage_offset() + root.numel() - 1
            return root.is_contiguous() and all(
                outputs[k].dtype == root.dtype and lo <= _extent(outputs[k])[0]
                and _extent(outputs[k])[1] <= hi for k in ks)

        root = next((r for r in ks if holds_all(r)), None)
        if root is None:
            raise Unrecordable(f"outputs {ks} share memory that no one of them holds whole")
        for k in ks:
            if k != root:
                plan[k] = (_DERIVED, root, _view_of(outputs[k], outputs[root]))


def _results(rec: _Recording, args: tuple) -> tuple:
    out = []
    for o, (kind, j, view) in zip(rec.outputs, rec.plan):
        if kind == _CLONE:
            out.append(o.clone())
        elif kind == _KEEP:
            out.append(o)
        elif kind == _ARG:
            out.append(args[j])
        elif kind == _VIEW:
            a = args[j]
            out.append(a.as_strided(view[0], view[1], a.storage_offset() + view[2]))
        else:
            out.append(None)  # rebuilt below from its root's copy
    for k, (kind, j, view) in enumerate(rec.plan):
        if kind == _DERIVED:
            root = out[j]
            out[k] = root.as_strided(view[0], view[1], root.storage_offset() + view[2])
    return tuple(out)


__all__ = ["CudaGraphRunner", "Unrecordable", "signature", "has_internal_overlap"]
