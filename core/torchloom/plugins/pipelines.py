"""One way from a pipeline to what runs it: read the pipeline (a built-in name, a file,
a dict of a file's tables, or a :class:`RawPipeline` already parsed), load the plugins
its ``[plugins] disable`` leaves (unless a plugin set is given), and build the pipeline
against them. The compiler, ``torchloom check``, ``torchloom opt`` and ``torchloom
reproduce`` all go this way."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from torchloom.passes.pipeline import Pipeline, RawPipeline, build_pipeline, read_pipeline
from torchloom.plugins.loader import PluginSet, load_plugins

PipelineSpec = str | Path | Mapping[str, Any] | RawPipeline


@attrs.frozen
class LoadedPipeline:
    """A pipeline built against the plugins it runs with."""

    raw: RawPipeline
    plugins: PluginSet
    pipeline: Pipeline


def read_spec(spec: PipelineSpec) -> RawPipeline:
    return spec if isinstance(spec, RawPipeline) else read_pipeline(spec)


def plugins_for(raw: RawPipeline, plugins: PluginSet | None = None) -> PluginSet:
    """``plugins`` when given, else the installed plugins less those ``raw`` disables
    (they are never imported)."""
    return plugins if plugins is not None else load_plugins(disable=raw.disable)


def load_pipeline(spec: PipelineSpec, plugins: PluginSet | None = None) -> LoadedPipeline:
    """Read ``spec``, load its plugins (or use ``plugins``) and build it; a mistake in the
    pipeline is a :class:`~torchloom.errors.PipelineError` naming file and line."""
    raw = read_spec(spec)
    plugins = plugins_for(raw, plugins)
    return LoadedPipeline(raw, plugins, build_pipeline(raw, plugins))
