"""A pipeline given inline as a dict (``options={"pipeline": {...}}``), written out as
the TOML text a pipeline file would hold, so that it is checked like a file (with
did-you-mean and line numbers into that text) and a reproducer keeps it as
``pipeline.toml``::

    {"pipeline": {"name": "mine", "codegen": "eager"},
     "pass": [{"name": "cse"}, {"fixpoint": ["fusion.vertical", "fusion.horizontal"]}]}

    [pipeline]
    name = "mine"
    codegen = "eager"

    [[pass]]
    name = "cse"

    [[pass]]
    fixpoint = ["fusion.vertical", "fusion.horizontal"]
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from torchloom.errors import PipelineError

SOURCE = "<inline pipeline>"
_BARE = re.compile(r"[A-Za-z0-9_-]+")


def pipeline_toml(data: Mapping[str, Any]) -> str:
    """The TOML text of a pipeline dict; a value TOML cannot hold is an error naming
    its key."""
    if not isinstance(data, Mapping):
        raise PipelineError(f"{SOURCE}: a pipeline given inline must be a dict (the tables "
                            f"of a pipeline file), not {type(data).__name__}")
    head, tables = [], []
    for key, value in data.items():
        if isinstance(value, Mapping):
            tables.extend(_table(_key(key), value, key))
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            for item in value:
                tables.append(f"\n[[{_key(key)}]]")
                tables.extend(f"{_key(k)} = {_value(v, f'{key}.{k}')}"
                              for k, v in item.items())
        else:
            head.append(f"{_key(key)} = {_value(value, key)}")
    return "\n".join(head + tables).lstrip("\n") + "\n"


def _table(name: str, table: Mapping[str, Any], where: str) -> list[str]:
    lines, subtables = [f"\n[{name}]"], []
    for k, v in table.items():
        if isinstance(v, Mapping):  # [runtime.cudagraphs]
            subtables.extend(_table(f"{name}.{_key(k)}", v, f"{where}.{k}"))
        else:
            lines.append(f"{_key(k)} = {_value(v, f'{where}.{k}')}")
    return lines + subtables


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise PipelineError(f"{SOURCE}: key {key!r} must be a string")
    return key if _BARE.fullmatch(key) else _string(key)


def _string(s: str) -> str:
    # JSON's escapes are TOML's basic-string escapes; TOML also refuses a raw DEL
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(v: Any, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v)
                else repr(v))
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x, f"{where}[{i}]") for i, x in enumerate(v)) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(x, f'{where}.{k}')}"
                               for k, x in v.items()) + "}"
    raise PipelineError(f"{SOURCE}: {where} = {v!r}: a pipeline holds strings, numbers, "
                        f"booleans, lists and tables, not {type(v).__name__}")
