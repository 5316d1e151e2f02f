"""The hooks a torchloom plugin implements.

A plugin is a module named by an entry point in the ``torchloom`` group, e.g. in its
``pyproject.toml``::

    [project.entry-points.torchloom]
    fusion = "torchloom_fusion.plugin"

The module defines functions decorated with :data:`hookimpl`, named after the specs
below. Core built-ins (dce, cse, canonicalize, the eager codegen) register through these
same hooks. pluggy's call order is not the pipeline order: only the pipeline orders passes.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("torchloom")
hookimpl = pluggy.HookimplMarker("torchloom")


class TorchloomSpec:
    """The hook specifications."""

    @hookspec
    def torchloom_passes(self):
        """Return a list of :class:`torchloom.passes.base.Pass` subclasses.

        Each class is ``@attrs.frozen`` (its fields are its options) and its ``name``
        (dotted, e.g. ``fusion.vertical``) is how pipelines refer to it. Two distributions
        returning the same name is an error naming both, for the pipelines that use the
        name (the others, and ``torchloom plugins``, still work); a class that is not an attrs
        ``Pass`` subclass with a name is reported as a load error and skipped, as is a
        plugin whose hook raises.
        """

    @hookspec
    def torchloom_ops(self, registry):
        """Register op definitions: call ``registry.register(OpDef(...))``. Returns None."""

    @hookspec
    def torchloom_codegens(self):
        """Return a list of codegen objects (see :class:`torchloom.codegen.base.Codegen`).

        A renderer of the core's kernel schedule (:class:`torchloom.api.Renderer`) becomes
        one with ``RendererCodegen(renderer)``: docs/writing-a-codegen.md."""

    @hookspec
    def torchloom_runtime_wrappers(self):
        """Return a list of runtime wrappers.

        A wrapper has ``name`` (the key enabling it in a pipeline's ``[runtime]`` table),
        ``Options`` (an attrs class checked against ``[runtime.<name>]``) and
        ``wrap(fn, options, ctx, compiled) -> callable`` returning the function to run instead
        of ``fn`` (``compiled`` is the :class:`~torchloom.runtime.executor.CompiledGraph`). It must say why (``ctx.note``) when it declines to wrap.
        An optional ``declines(graph, options, ctx) -> str | None`` says before the plan is
        made why it would not wrap ``graph`` (the compiler then notes and logs that, does
        not call ``wrap``, and lets the plan donate inputs, which a wrapper may keep).
        An optional ``modes`` (a tuple of ``torch.compile`` modes, e.g.
        ``("reduce-overhead",)``) turns it on, with default options, under those modes
        (its declines are then logged at INFO, not as warnings).
        """

    @hookspec
    def torchloom_instruments(self):
        """Return a list of instruments: objects with optional methods
        ``before_pass(pass_, graph, ctx)`` and
        ``after_pass(pass_, graph, ctx, result, seconds)``, called around every pass
        (``after_pass`` only when the pass succeeded). They observe; they must not edit the
        graph. An instrument that raises, or that changes the graph (the pass manager
        compares it with its snapshot after every call), stops the compilation with a
        :class:`~torchloom.errors.PluginError` naming it, its plugin and distribution and
        the pass; a changed graph is restored first."""
