"""A pipeline that extends another: the pass tables of the whole chain, in running order.

```toml
[pipeline]
name = "mine"
extends = "default"        # a built-in pipeline, or a file (relative to this one)

[[insert]]                 # placed next to a pass of the pipeline it extends
name = "mine.rewrite"
after = "fusion.vertical"  # or before = "..."
limit = 3                  # the pass's options, as in a [[pass]]

[[pass]]                   # appended after the extended pipeline's passes
name = "dce"
```

The ``[[insert]]`` tables go, in file order, before or after the pass they name: a pass of
the extended pipeline (or one inserted above) that runs once in it; a pass inside a
fixpoint group anchors the whole group (inserted passes never join a group). This file's
``[[pass]]`` tables then run after all of those. ``[pipeline]`` keys override the extended pipeline's,
``[runtime]`` settings too, one by one; ``[plugins] disable`` adds to its list.
"""

from __future__ import annotations

from typing import Any

import attrs

from torchloom.errors import PipelineError
from torchloom.passes.pipeline_file import Lines, RawPipeline, did_you_mean

ANCHORS = ("before", "after")


@attrs.frozen
class PassTable:
    """One ``[[pass]]`` (or ``[[insert]]`` without its anchor) and where it was written."""

    table: dict[str, Any]
    line: int
    source: str
    lines: Lines = attrs.field(eq=False, repr=False)

    def names(self) -> list[str]:
        """The passes it runs: its ``name``, or its fixpoint group's members."""
        if "fixpoint" in self.table and isinstance(self.table["fixpoint"], list):
            return [m if isinstance(m, str) else m.get("name") for m in self.table["fixpoint"]
                    if isinstance(m, (str, dict))]
        return [self.table.get("name")]


def pass_tables(raw: RawPipeline) -> list[PassTable]:
    """Every pass table of ``raw`` and the pipelines it extends, in running order."""
    tables: list[PassTable] = []
    for layer in raw.layers():
        lines = Lines(layer.text)
        inserts = layer.data.get("insert", [])
        if inserts and layer.base is None:
            raise PipelineError(f"{layer.source}:{lines.table('insert')}: [[insert]] places a "
                                f"pass in a pipeline this one extends; add [pipeline] extends "
                                f"= \"default\" (or a file), or write the pass as a [[pass]] "
                                f"where it should run")
        for index, table in enumerate(inserts):
            tables = _insert(tables, table, lines.table("insert", index), layer, lines)
        tables += [PassTable(t, lines.table("pass", i), layer.source, lines)
                   for i, t in enumerate(layer.data.get("pass", []))]
    return tables


def _insert(tables: list[PassTable], table: dict, line: int, layer: RawPipeline,
            lines: Lines) -> list[PassTable]:
    where = f"{layer.source}:{line}"
    given = [k for k in ANCHORS if k in table]
    if len(given) != 1:
        raise PipelineError(f"{where}: an [[insert]] needs exactly one of before = \"pass\" "
                            f"or after = \"pass\" (the pass it goes next to)"
                            + (", not both" if given else ""))
    key = given[0]
    anchor = table[key]
    where = f"{layer.source}:{lines.key(line, key)}"
    known = list(dict.fromkeys(n for t in tables for n in t.names() if isinstance(n, str)))
    if not isinstance(anchor, str):
        raise PipelineError(f"{where}: {key} must be a pass name, got {anchor!r}")
    at = [i for i, t in enumerate(tables) if anchor in t.names()]
    if not at:
        raise PipelineError(f"{where}: {key} = {anchor!r} names no pass of the pipeline it "
                            f"extends{did_you_mean(anchor, known)} (its passes: "
                            f"{', '.join(known) or 'none'})")
    if len(at) > 1:
        found = ", ".join(f"{tables[i].source}:{tables[i].line}" for i in at)
        raise PipelineError(f"{where}: {key} = {anchor!r} is ambiguous: the pipeline runs it "
                            f"{len(at)} times ({found}); name a pass next to the one you mean")
    placed = PassTable({k: v for k, v in table.items() if k != key}, line, layer.source, lines)
    position = at[0] + (1 if key == "after" else 0)
    return tables[:position] + [placed] + tables[position:]


def flat_data(raw: RawPipeline, name: str) -> dict[str, Any]:
    """The tables of one self-contained file equivalent to ``raw`` and the pipelines it
    extends (what a reproducer keeps as its ``pipeline.toml``)."""
    head: dict[str, Any] = {}
    runtime: dict[str, Any] = {}
    for layer in raw.layers():
        head.update(layer.data.get("pipeline", {}))
        runtime.update(layer.data.get("runtime", {}))
    head.pop("extends", None)
    head["name"] = name
    data: dict[str, Any] = {"pipeline": head}
    if raw.disable:
        data["plugins"] = {"disable": list(raw.disable)}
    if runtime:
        data["runtime"] = runtime
    passes = [t.table for t in pass_tables(raw)]
    if passes:
        data["pass"] = passes
    return data
