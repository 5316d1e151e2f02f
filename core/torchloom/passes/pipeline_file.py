"""Reading a pipeline file: its text, its TOML, the shape of its tables, and the pipeline
it extends (``[pipeline] extends``), before any plugin is loaded; what
:func:`~torchloom.passes.pipeline.build_pipeline` then checks against the installed
passes. A mistake is a :class:`~torchloom.errors.PipelineError` naming file and line."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, distributed as tomli
    import tomli as tomllib

from torchloom.errors import PipelineError
from torchloom.passes.textfile import BOM, read_text_file

#: how many pipelines may extend one another in a chain (a longer one is surely a mistake)
MAX_EXTENDS = 16


@attrs.frozen
class RawPipeline:
    """A parsed but unchecked pipeline file: enough to know what to disable before
    plugins are imported. ``base`` is the pipeline it extends, read the same way."""

    source: str
    text: str
    data: dict[str, Any]
    base: "RawPipeline | None" = None

    @property
    def disable(self) -> tuple[str, ...]:
        """The plugins this file and the pipelines it extends disable."""
        own = tuple(self.data.get("plugins", {}).get("disable", ()))
        return tuple(dict.fromkeys((self.base.disable if self.base else ()) + own))

    def layers(self) -> list["RawPipeline"]:
        """The pipeline it extends (and so on), then this one: the order they apply in."""
        return (self.base.layers() if self.base else []) + [self]


def builtin_pipelines() -> dict[str, str]:
    """Name -> TOML text of the pipelines shipped inside the package."""
    out = {}
    for entry in resources.files("torchloom.pipelines").iterdir():
        if entry.name.endswith(".toml"):
            out[entry.name[:-5]] = entry.read_text()
    return out


def read_pipeline(spec: str | Path | Mapping[str, Any]) -> RawPipeline:
    """Read a pipeline by built-in name (``default``, ``none``, ...), by file path, or
    given inline as a dict of its tables (see :mod:`torchloom.passes.pipeline_dict`)."""
    return _read(spec, Path.cwd(), ())


def _read(spec: str | Path | Mapping[str, Any], folder: Path,
          chain: tuple[str, ...]) -> RawPipeline:
    """``spec`` read as :func:`read_pipeline` reads it, a relative path from ``folder``;
    ``chain`` holds the sources extending it (to find a cycle)."""
    if isinstance(spec, Mapping):
        from torchloom.passes.pipeline_dict import SOURCE, pipeline_toml
        return parse_raw(pipeline_toml(spec), SOURCE, _chain=chain)
    spec_s = str(spec)
    shipped = builtin_pipelines()
    if spec_s in shipped:
        return parse_raw(shipped[spec_s], f"<pipeline {spec_s}>", _chain=chain)
    path = folder / spec_s
    if not path.exists():
        hint = did_you_mean(spec_s, shipped)
        raise PipelineError(f"pipeline {spec_s!r} is neither a built-in pipeline "
                            f"({', '.join(sorted(shipped))}) nor an existing file{hint}")
    source = spec_s if not chain else str(path)
    return parse_raw(read_text_file(path, "a pipeline file", PipelineError), source,
                     _chain=chain)


def parse_raw(text: str, source: str, *, _chain: tuple[str, ...] = ()) -> RawPipeline:
    """Parse and shape-check a pipeline's text, and read the pipeline it extends (a
    built-in name, or a file relative to ``source``'s folder)."""
    text = text.removeprefix(BOM)  # a UTF-8 byte-order mark, as some editors write
    try:
        data = tomllib.loads(text)
    except RecursionError:  # tomllib recurses once per nesting level
        raise PipelineError(f"{source}:{_deep_line(text)}: malformed TOML: arrays or inline "
                            f"tables are nested too deeply to read; a pipeline needs a few "
                            f"levels at most") from None
    except tomllib.TOMLDecodeError as exc:
        # tomllib reports "... (at line L, column C)"; lead with source:line like every error
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        where = f"{source}:{m.group(1)}:{m.group(2)}" if m else source
        reason = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        raise PipelineError(f"{where}: malformed TOML: {reason}") from None
    _check_shape(data, text, source)
    return RawPipeline(source, text, data, _read_base(data, text, source, _chain))


def _read_base(data: dict, text: str, source: str,
               chain: tuple[str, ...]) -> RawPipeline | None:
    """The pipeline ``[pipeline] extends`` names, read relative to ``source``'s folder."""
    spec = data.get("pipeline", {}).get("extends")
    if spec is None:
        return None
    lines = Lines(text)
    where = f"{source}:{lines.key(lines.table('pipeline'), 'extends')}"
    if not isinstance(spec, str) or not spec:
        raise PipelineError(f"{where}: extends must be the name of a built-in pipeline or a "
                            f"pipeline file, got {spec!r}")
    chain = chain + (_identity(source),)
    folder = Path(source).parent if not source.startswith("<") else Path.cwd()
    target = spec if spec in builtin_pipelines() else str((folder / spec).resolve())
    target_id = f"<pipeline {spec}>" if spec in builtin_pipelines() else target
    if target_id in chain:
        cycle = " -> ".join([*chain[chain.index(target_id):], target_id])
        raise PipelineError(f"{where}: extends = {spec!r} makes a cycle ({cycle}); a pipeline "
                            f"cannot extend itself")
    if len(chain) > MAX_EXTENDS:
        raise PipelineError(f"{where}: pipelines extend one another more than {MAX_EXTENDS} "
                            f"deep ({' -> '.join(chain)})")
    try:
        return _read(spec, folder, chain)
    except PipelineError as exc:
        if str(exc).startswith(f"pipeline {spec!r} is neither"):
            raise PipelineError(f"{where}: extends = {spec!r}: {exc}") from None
        raise


def _identity(source: str) -> str:
    """How a pipeline is known in an extends chain: a built-in by name, a file by path."""
    return source if source.startswith("<") else str(Path(source).resolve())


def _deep_line(text: str, limit: int = 64) -> int:
    """The line where brackets and braces first nest ``limit`` deep (strings and comments
    skipped roughly): where to point a reader at a too-deeply nested value."""
    depth = 0
    for number, line in enumerate(text.splitlines(), 1):
        quote = None
        for ch in line:
            if quote:
                quote = None if ch == quote else quote
            elif ch in "\"'":
                quote = ch
            elif ch == "#":
                break
            elif ch in "[{":
                depth += 1
                if depth >= limit:
                    return number
            elif ch in "]}":
                depth -= 1
    return 1


def _check_shape(data: dict, text: str, source: str) -> None:
    """The kinds of the top-level entries, before anything reads them: ``[pipeline]``,
    ``[plugins]`` and ``[runtime]`` are tables, ``[[pass]]`` an array of tables."""
    lines = Lines(text)

    def fail(key: str, message: str, line: int | None = None) -> PipelineError:
        if line is None:
            line = lines.table(key) if lines.table(key) > 1 else lines.key(1, key)
        return PipelineError(f"{source}:{line}: {message}")

    for key in ("pipeline", "plugins", "runtime"):
        if key in data and not isinstance(data[key], dict):
            raise fail(key, f"{key} must be a table: write [{key}]")
    for key in ("pass", "insert"):
        if key in data and not (isinstance(data[key], list)
                                and all(isinstance(p, dict) for p in data[key])):
            raise fail(key, f"{key} must be an array of tables: write [[{key}]] before each "
                            f"pass")
    codegen = data.get("pipeline", {}).get("codegen")
    if isinstance(codegen, list) and codegen and all(isinstance(c, str) for c in codegen):
        pass  # a list of codegens, tried in order
    elif codegen is not None and not isinstance(codegen, str):
        raise fail("pipeline", f"[pipeline] codegen must be a string or a non-empty list of "
                               f"strings, got {codegen!r}", lines.key(lines.table("pipeline"),
                                                                     "codegen"))
    for key in ("name", "description"):
        value = data.get("pipeline", {}).get(key)
        if value is not None and not isinstance(value, str):
            raise fail("pipeline", f"[pipeline] {key} must be a string, got {value!r}",
                       lines.key(lines.table("pipeline"), key))
    disable = data.get("plugins", {}).get("disable", [])
    if not isinstance(disable, list) or not all(isinstance(x, str) for x in disable):
        raise fail("plugins", f"[plugins] disable must be a list of plugin or distribution "
                              f"names, got {disable!r}", lines.key(lines.table("plugins"), "disable"))
    for key in ("pass", "insert"):
        for index, entry in enumerate(data.get(key, [])):
            if not isinstance(entry.get("optional", False), bool):
                raise fail(key, f"optional must be true or false, got {entry['optional']!r}",
                           lines.key(lines.table(key, index), "optional"))


class Lines:
    """Finds the line of a table or key in the raw text (tomllib does not keep lines)."""

    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.headers: list[tuple[int, str]] = []  # (line, header text)
        for i, line in enumerate(self.lines, 1):
            m = re.match(r"\s*\[\[?\s*([^\]]+?)\s*\]\]?", line)
            if m and not re.match(r"\s*\w+\s*=", line):
                self.headers.append((i, m.group(1)))

    def table(self, name: str, index: int = 0) -> int:
        found = [ln for ln, h in self.headers if h == name]
        return found[index] if index < len(found) else 1

    def key(self, table_line: int, key: str) -> int:
        end = next((ln for ln, _ in self.headers if ln > table_line), len(self.lines) + 1)
        for i in range(table_line, end):
            if re.match(rf"\s*{re.escape(key)}\s*=", self.lines[i - 1]):
                return i
        return table_line

    def text(self, table_line: int, needle: str) -> int:
        end = next((ln for ln, _ in self.headers if ln > table_line), len(self.lines) + 1)
        for i in range(table_line, end):
            if needle in self.lines[i - 1]:
                return i
        return table_line


def did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
