"""Pipelines written in TOML.

```toml
[pipeline]
name = "default"
codegen = ["triton", "cpu"]  # tried in order per group; "eager" runs what none takes
verify = "each"        # each | end | off
on_error = "raise"     # raise | skip

[plugins]
disable = ["some-plugin"]

[runtime]
cudagraphs = true      # enables a runtime wrapper; its options go in [runtime.cudagraphs]
partitioner = "min_cut"  # forward/backward split: "min_cut" (recompute) or "default"
remote_cache = "redis://127.0.0.1:6379/0"  # the fleet's shared cache (needs a key)

[[pass]]
name = "views.strip-bookends"

[[pass]]
fixpoint = [{ name = "fusion.vertical", max_group_inputs = 128 }, "fusion.horizontal"]
max_iterations = 10
```

Order is the order of ``[[pass]]`` tables. A ``[[pass]]`` with ``optional = true`` is
skipped, with a note, when no installed plugin provides it. Every other mistake (unknown
table, key, pass or option; a wrong option type or value; a broken ordering constraint)
is a :class:`~torchloom.errors.PipelineError` naming file and line, with a did-you-mean.
"""

from __future__ import annotations

import difflib
import enum
import hashlib
import json
import re
import typing
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
from torchloom.passes.sources import CORE_PACKAGE, SourceHashes
from torchloom.passes.textfile import BOM, read_text_file

VERIFY_POLICIES = ("each", "end", "off")
ON_ERROR = ("raise", "skip")
_PIPELINE_KEYS = {"name", "codegen", "verify", "on_error", "description"}
_PASS_KEYS = {"name", "optional"}
_FIXPOINT_KEYS = {"fixpoint", "max_iterations", "optional"}
_TOP_TABLES = {"pipeline", "plugins", "runtime", "pass"}
#: ``[runtime] partitioner``: how aot_autograd splits forward and backward
PARTITIONERS = ("min_cut", "default")


@attrs.frozen
class PassStep:
    pass_: Any  # a Pass instance
    line: int
    distribution: str = "?"
    version: str = "?"

    @property
    def name(self) -> str:
        return self.pass_.name


@attrs.frozen
class FixpointStep:
    passes: tuple[PassStep, ...]
    max_iterations: int
    line: int


@attrs.frozen
class Pipeline:
    name: str
    source: str
    text: str
    steps: tuple[PassStep | FixpointStep, ...] = ()
    codegen: str = "eager"  # the first of ``codegens``
    #: the codegens tried in order for each group (``eager`` runs what none of them takes)
    codegens: tuple[str, ...] = ()
    verify: str = "each"
    on_error: str = "raise"
    disable: tuple[str, ...] = ()
    #: runtime wrapper name -> its Options instance
    runtime: dict[str, Any] = attrs.field(factory=dict)
    #: the forward/backward split: "min_cut" (recompute where cheaper) or "default"
    partitioner: str = "min_cut"
    #: the file names the partitioner (otherwise a graph that no codegen but eager takes
    #: gets "default": see backend.py)
    partitioner_set: bool = False
    #: ``[runtime] remote_cache``: the shared cache's URL (see runtime/remote_cache.py)
    remote_cache: str | None = None
    #: passes named optional that no plugin provides
    missing_optional: tuple[str, ...] = ()
    #: memo of source hashes (the plugin set's), so a fingerprint reads each file once
    sources: SourceHashes = attrs.field(factory=SourceHashes, eq=False, repr=False)

    def flat_steps(self) -> list[PassStep]:
        out: list[PassStep] = []
        for s in self.steps:
            out.extend(s.passes if isinstance(s, FixpointStep) else [s])
        return out

    def fingerprint(self) -> str:
        """Hash of every pass identity (name, options, distribution, version, source), the
        core's source and the pipeline settings. Part of every compile-cache key."""
        ids = [s.pass_.identity(s.distribution, s.version, self.sources)
               for s in self.flat_steps()]
        blob = json.dumps({"passes": ids, "codegen": list(self.codegens) or self.codegen,
                           "core": self.sources.of_package(CORE_PACKAGE),
                           "runtime": {k: repr(v) for k, v in sorted(self.runtime.items())},
                           "fixpoints": [s.max_iterations for s in self.steps
                                         if isinstance(s, FixpointStep)]}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]


@attrs.frozen
class RawPipeline:
    """A parsed but unchecked pipeline file: enough to know what to disable before
    plugins are imported."""

    source: str
    text: str
    data: dict[str, Any]

    @property
    def disable(self) -> tuple[str, ...]:
        return tuple(self.data.get("plugins", {}).get("disable", ()))


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
    if isinstance(spec, Mapping):
        from torchloom.passes.pipeline_dict import SOURCE, pipeline_toml
        return parse_raw(pipeline_toml(spec), SOURCE)
    spec_s = str(spec)
    shipped = builtin_pipelines()
    if spec_s in shipped:
        return parse_raw(shipped[spec_s], f"<pipeline {spec_s}>")
    path = Path(spec_s)
    if not path.exists():
        hint = _did_you_mean(spec_s, shipped)
        raise PipelineError(f"pipeline {spec_s!r} is neither a built-in pipeline "
                            f"({', '.join(sorted(shipped))}) nor an existing file{hint}")
    return parse_raw(read_text_file(path, "a pipeline file", PipelineError), str(path))


def parse_raw(text: str, source: str) -> RawPipeline:
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
    return RawPipeline(source, text, data)


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
    lines = _Lines(text)

    def fail(key: str, message: str, line: int | None = None) -> PipelineError:
        if line is None:
            line = lines.table(key) if lines.table(key) > 1 else lines.key(1, key)
        return PipelineError(f"{source}:{line}: {message}")

    for key in ("pipeline", "plugins", "runtime"):
        if key in data and not isinstance(data[key], dict):
            raise fail(key, f"{key} must be a table: write [{key}]")
    if "pass" in data and not (isinstance(data["pass"], list)
                               and all(isinstance(p, dict) for p in data["pass"])):
        raise fail("pass", "pass must be an array of tables: write [[pass]] before each pass")
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
    for index, entry in enumerate(data.get("pass", [])):
        if not isinstance(entry.get("optional", False), bool):
            raise fail("pass", f"optional must be true or false, got {entry['optional']!r}",
                       lines.key(lines.table("pass", index), "optional"))


class _Lines:
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


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def build_pipeline(raw: RawPipeline, plugins) -> Pipeline:
    """Check a raw pipeline against the installed passes and build it."""
    src, data, lines = raw.source, raw.data, _Lines(raw.text)

    def err(line: int, message: str) -> PipelineError:
        return PipelineError(f"{src}:{line}: {message}")

    for key in data:
        if key not in _TOP_TABLES:
            raise err(lines.table(key), f"unknown table [{key}]{_did_you_mean(key, _TOP_TABLES)}")
    head = data.get("pipeline", {})
    head_line = lines.table("pipeline")
    for key in head:
        if key not in _PIPELINE_KEYS:
            raise err(lines.key(head_line, key), f"unknown key {key!r} in [pipeline]"
                      f"{_did_you_mean(key, _PIPELINE_KEYS)}")
    verify = head.get("verify", "each")
    if verify not in VERIFY_POLICIES:
        raise err(lines.key(head_line, "verify"),
                  f"verify = {verify!r} must be one of {', '.join(VERIFY_POLICIES)}")
    on_error = head.get("on_error", "raise")
    if on_error not in ON_ERROR:
        raise err(lines.key(head_line, "on_error"),
                  f"on_error = {on_error!r} must be one of {', '.join(ON_ERROR)}")
    codegen = head.get("codegen", "eager")
    codegens = tuple(codegen) if isinstance(codegen, list) else (codegen,)
    if not codegens or not all(isinstance(c, str) for c in codegens):
        raise err(lines.key(head_line, "codegen"), "codegen must be a string or a non-empty "
                                                   "list of strings")
    plug = data.get("plugins", {})
    for key in plug:
        if key != "disable":
            raise err(lines.key(lines.table("plugins"), key),
                      f"unknown key {key!r} in [plugins] (only 'disable')")
    runtime_table = dict(data.get("runtime", {}))
    partitioner_set = "partitioner" in runtime_table
    partitioner = runtime_table.pop("partitioner", "min_cut")
    if partitioner not in PARTITIONERS:
        raise err(lines.key(lines.table("runtime"), "partitioner"),
                  f"partitioner = {partitioner!r} must be one of {', '.join(PARTITIONERS)}")
    remote_cache = runtime_table.pop("remote_cache", None)
    if remote_cache is not None and not isinstance(remote_cache, str):
        raise err(lines.key(lines.table("runtime"), "remote_cache"),
                  'remote_cache must be a string such as "redis://HOST:PORT/DB"')
    runtime = _build_runtime(runtime_table, plugins, lines, err)
    steps: list[PassStep | FixpointStep] = []
    missing: list[str] = []
    for index, entry in enumerate(data.get("pass", [])):
        tline = lines.table("pass", index)
        if "fixpoint" in entry:
            step = _build_fixpoint(entry, tline, plugins, lines, err, missing)
        else:
            step = _build_step(entry, tline, plugins, lines, err, missing, _PASS_KEYS)
        if step is not None:
            steps.append(step)
    pipeline = Pipeline(name=head.get("name", Path(src).stem), source=src, text=raw.text,
                        steps=tuple(steps), codegen=codegens[0], codegens=codegens,
                        verify=verify, on_error=on_error,
                        disable=raw.disable, runtime=runtime, partitioner=partitioner,
                        partitioner_set=partitioner_set, remote_cache=remote_cache,
                        missing_optional=tuple(missing),
                        sources=getattr(plugins, "sources", None) or SourceHashes())
    _check_constraints(pipeline, err)
    return pipeline


def _build_runtime(table: dict, plugins, lines: _Lines, err) -> dict[str, Any]:
    """``[runtime] name = true`` enables a wrapper with default options; a table
    (``[runtime.name]`` or ``name = {...}``) enables it with options (``enabled = false``
    turns it off)."""
    out: dict[str, Any] = {}
    rline = lines.table("runtime")
    for key, value in table.items():
        line = lines.table(f"runtime.{key}") if isinstance(value, dict) else lines.key(rline, key)
        if key not in plugins.wrappers:
            raise err(line, f"unknown runtime setting {key!r}; installed runtime wrappers: "
                      f"{', '.join(sorted(plugins.wrappers)) or 'none'}"
                      f"{_did_you_mean(key, plugins.wrappers)}")
        if isinstance(value, bool):
            value = {"enabled": value}
        if not isinstance(value, dict):
            raise err(line, f"runtime setting {key!r} must be true, false or a table of options")
        options = dict(value)
        enabled = options.pop("enabled", True)
        if not isinstance(enabled, bool):
            raise err(line, f"runtime.{key}.enabled must be true or false")
        instance = _instantiate(plugins.wrappers[key].obj.Options, options, f"runtime.{key}",
                                line, lines, err)
        if enabled:
            out[key] = instance
    return out


def _build_fixpoint(entry: dict, tline: int, plugins, lines: _Lines, err,
                    missing: list[str]) -> FixpointStep | None:
    for key in entry:
        if key not in _FIXPOINT_KEYS:
            raise err(lines.key(tline, key), f"unknown key {key!r} in a fixpoint [[pass]]"
                      f"{_did_you_mean(key, _FIXPOINT_KEYS)}")
    members = entry["fixpoint"]
    if not isinstance(members, list) or not members:
        raise err(lines.key(tline, "fixpoint"), "fixpoint must be a non-empty list of pass "
                  "names or {name = ..., option = ...} tables")
    max_it = entry.get("max_iterations", 10)
    if not isinstance(max_it, int) or isinstance(max_it, bool) or max_it < 1:
        raise err(lines.key(tline, "max_iterations"), "max_iterations must be an int >= 1")
    steps = []
    for m in members:
        spec = {"name": m} if isinstance(m, str) else m
        if not isinstance(spec, dict):
            raise err(lines.key(tline, "fixpoint"), f"fixpoint member {m!r} must be a pass "
                      "name or an inline table")
        if entry.get("optional"):
            spec = {**spec, "optional": True}
        mline = lines.text(tline, f'"{spec.get("name")}"')
        step = _build_step(spec, mline, plugins, lines, err, missing, _PASS_KEYS, inline=True)
        if step is not None:
            steps.append(step)
    if not steps:
        return None
    return FixpointStep(tuple(steps), max_it, tline)


def _build_step(entry: dict, tline: int, plugins, lines: _Lines, err, missing: list[str],
                keys: set, inline: bool = False) -> PassStep | None:
    name = entry.get("name")
    if not isinstance(name, str):
        raise err(tline, "a [[pass]] needs name = \"...\" (or fixpoint = [...])")
    if name in getattr(plugins, "clashes", {}):  # two plugins register it: which one?
        raise err(lines.key(tline, "name") if not inline else tline, plugins.clash_message(name))
    if name not in plugins.passes:
        if entry.get("optional"):
            missing.append(name)
            return None
        installed = ", ".join(sorted(plugins.passes))
        raise err(lines.key(tline, "name") if not inline else tline,
                  f"unknown pass {name!r}{_did_you_mean(name, plugins.passes)} "
                  f"(installed: {installed})")
    reg = plugins.passes[name]
    options = {k: v for k, v in entry.items() if k not in keys}
    instance = _instantiate(reg.obj, options, f"pass {name!r}", tline, lines, err, inline)
    return PassStep(instance, tline, reg.distribution, reg.version)


def _instantiate(cls, options: dict, what: str, tline: int, lines: _Lines, err,
                 inline: bool = False):
    fields = {f.name: f for f in attrs.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key, value in options.items():
        line = tline if inline else lines.key(tline, key)
        if key not in fields:
            known = ", ".join(fields) or "none"
            raise err(line, f"{what} has no option {key!r}{_did_you_mean(key, fields)} "
                      f"(options: {known})")
        problem = _type_problem(value, hints.get(key, Any))
        if problem:
            raise err(line, f"{what} option {key!r}: {problem}")
    try:
        return cls(**options)
    except (TypeError, ValueError) as exc:
        # attrs validators name the field ("'limit' must be >= 1: 0"): point at its line
        named = [k for k in options if f"'{k}'" in str(exc)]
        line = tline if inline or not named else lines.key(tline, named[0])
        raise err(line, f"{what}: invalid option value: {exc}") from None


def _type_problem(value: Any, hint: Any) -> str | None:
    """None when ``value`` (from TOML) fits the annotation; else what is wrong."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return None
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        return None if value in allowed else f"{value!r} is not one of {list(allowed)}"
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        problems = [_type_problem(value, h) for h in typing.get_args(hint)]
        return None if any(p is None for p in problems) else problems[0]
    if origin in (list, tuple, frozenset, set):
        if not isinstance(value, list):
            return f"expected a list, got {type(value).__name__} {value!r}"
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        for item in value:
            p = _type_problem(item, args[0]) if args else None
            if p:
                return f"list item: {p}"
        return None
    if hint is type(None):
        return None if value is None else f"expected none, got {value!r}"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        names = [m.value for m in hint]
        return None if value in names else f"{value!r} is not one of {names}"
    if hint is bool:
        return None if isinstance(value, bool) else f"expected true/false, got {value!r}"
    if hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"expected an int, got {type(value).__name__} {value!r}"
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else f"expected a number, got {type(value).__name__} {value!r}"
    if hint is str:
        return None if isinstance(value, str) else f"expected a string, got {value!r}"
    return None


def _check_constraints(pipeline: Pipeline, err) -> None:
    order = pipeline.flat_steps()
    position = {}
    for i, step in enumerate(order):
        position.setdefault(step.name, i)
    for i, step in enumerate(order):
        cls = type(step.pass_)
        for req in getattr(cls, "requires", ()):
            if req not in position or position[req] >= i:
                raise err(step.line, f"pass {step.name!r} requires {req!r} to run before it, "
                          f"but {'it comes later' if req in position else 'it is not in the pipeline'}")
        for prior in getattr(cls, "after", ()):
            if prior in position and position[prior] > i:
                raise err(step.line, f"pass {step.name!r} must run after {prior!r}, but "
                          f"{prior!r} comes later (line {order[position[prior]].line})")
