"""``torchloom reproduce DIR``: replay a reproducer the pass manager wrote next to a pass
failure (:mod:`torchloom.passes.manager`). It loads plugins, so it sits above the passes
and the plugin loader, with the compiler.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from torchloom.errors import PipelineError, TorchloomError
from torchloom.ir.graph import Graph
from torchloom.ir.text import parse_graph
from torchloom.passes.base import PassContext
from torchloom.passes.manager import PassManager
from torchloom.passes.numeric import read_inputs
from torchloom.passes.pipeline import VERIFY_POLICIES, PassStep, Pipeline, parse_raw
from torchloom.passes.textfile import read_json_file, read_text_file
from torchloom.plugins.pipelines import load_pipeline, plugins_for


def reproduce(directory: str | Path, plugins=None) -> str:
    """Replay a reproducer. Raises the pass's error again (as :class:`PassError`);
    returns a message when the pass now succeeds.

    Plugins are loaded with the reproducer pipeline's ``[plugins] disable``, so the same
    set of plugins is in play as when it was written.
    """
    r = load_reproducer(directory, plugins)
    ctx = PassContext(registry=r.plugins.registry, device=r.device)
    PassManager(r.pipeline, r.plugins, numeric_inputs=r.inputs).run(r.graph, ctx)
    return f"{r.what} ran without error on {r.directory / 'before.ir'}"


@attrs.frozen
class Reproducer:
    """A reproducer directory, read and checked: what :func:`reproduce` runs."""

    directory: Path
    meta: dict[str, Any]
    graph: Graph  # the IR before the pass (or the pipeline)
    #: the failing pass alone (its options, the reproducer's verify policy), or the whole
    #: pipeline for a failure ``verify = "end"`` could not pin on one pass
    pipeline: Pipeline
    plugins: Any
    what: str  # "pass 'x'" or "pipeline 'p'"
    inputs: list[Any] | None  # the inputs that showed a numeric difference
    device: str


def load_reproducer(directory: str | Path, plugins=None) -> Reproducer:
    """Read a reproducer directory; a directory that is not one (or that the installed
    plugins cannot replay) is a :class:`TorchloomError` naming it."""
    d = Path(directory)
    if not (d / "pass.json").exists() or not (d / "before.ir").exists():
        raise TorchloomError(f"{d} is not a reproducer directory (needs before.ir and "
                             f"pass.json, as written next to a pass failure)")
    meta = _reproducer_meta(d / "pass.json")
    graph = parse_graph(read_text_file(d / "before.ir", "a reproducer's before.ir"),
                        str(d / "before.ir"))
    raw = parse_raw(read_text_file(d / "pipeline.toml", "a reproducer's pipeline.toml",
                                   PipelineError) if (d / "pipeline.toml").exists()
                    else "", str(d / "pipeline.toml"))
    if meta["pass"] is None:  # a whole-pipeline failure (verify = "end")
        loaded = load_pipeline(raw, plugins)
        plugins, pipeline = loaded.plugins, loaded.pipeline
        what = f"pipeline {pipeline.name!r}"
    else:
        plugins = plugins_for(raw, plugins)
        if meta["pass"] in plugins.clashes:
            raise TorchloomError(f"{d / 'pass.json'}: {plugins.clash_message(meta['pass'])}")
        if meta["pass"] not in plugins.passes:
            raise TorchloomError(f"pass {meta['pass']!r} of the reproducer (distribution "
                                 f"{meta.get('distribution')}) is not installed")
        reg = plugins.passes[meta["pass"]]
        try:
            pass_ = reg.obj(**meta["options"])
        except (TypeError, ValueError) as exc:
            raise TorchloomError(f"{d / 'pass.json'}: options of pass {meta['pass']!r} no "
                                 f"longer fit the installed pass: {exc}") from None
        pipeline = Pipeline(name="reproduce", source=str(d / "pipeline.toml"), text=raw.text,
                            steps=(PassStep(pass_, 1, reg.distribution, reg.version),),
                            verify=meta.get("verify", "each"), disable=raw.disable)
        what = f"pass {meta['pass']!r}"
    return Reproducer(d, meta, graph, pipeline, plugins, what, read_inputs(d),
                      meta.get("device", "cpu"))


def _reproducer_meta(path: Path) -> dict[str, Any]:
    """``pass.json`` of a reproducer, checked: the keys :func:`reproduce` reads, with
    their types; anything else is an error naming the file."""
    meta = read_json_file(path, "a reproducer's pass.json")
    if not isinstance(meta, dict):
        problem = f"holds a JSON {type(meta).__name__}, not an object"
    elif "pass" not in meta:
        problem = 'has no "pass" key (the failing pass\'s name, or null for a pipeline)'
    elif meta["pass"] is not None and not isinstance(meta["pass"], str):
        problem = f'"pass" must be a pass name or null, not {meta["pass"]!r}'
    elif meta["pass"] is not None and not isinstance(meta.get("options", {}), dict):
        problem = f'"options" must be an object of pass options, not {meta["options"]!r}'
    elif meta.get("verify", "each") not in VERIFY_POLICIES:
        problem = f'"verify" must be one of {", ".join(VERIFY_POLICIES)}, not {meta["verify"]!r}'
    elif not isinstance(meta.get("device", "cpu"), str):
        problem = f'"device" must be a device name, not {meta["device"]!r}'
    else:
        return {"options": {}, **meta}
    raise TorchloomError(f"{path}: {problem}; torchloom writes this file next to a pass "
                         f"failure: replay an unedited reproducer directory")
