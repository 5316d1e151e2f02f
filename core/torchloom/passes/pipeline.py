"""Pipelines written in TOML.

```toml
[pipeline]
name = "default"
codegen = ["triton", "cpu"]  # tried in order per group; "eager" runs what none takes
verify = "each"        # each | end | off | numeric
on_error = "raise"     # raise | skip

[plugins]
disable = ["some-plugin"]

[runtime]
cudagraphs = true      # enables a runtime wrapper; its options go in [runtime.cudagraphs]
partitioner = "min_cut"  # forward/backward split: "min_cut" (recompute) or "default"
remote_cache = "redis://127.0.0.1:6379/0"  # the fleet's shared cache (needs a key)
first_calls = "eager"  # groups run op by op until their native kernels are built
backward = "lazy"      # a training graph's backward compiled at the first backward()

[[pass]]
name = "views.strip-bookends"

[[pass]]
fixpoint = [{ name = "fusion.vertical", max_group_inputs = 128 }, "fusion.horizontal"]
max_iterations = 10
```

Order is the order of ``[[pass]]`` tables. A pipeline may instead extend another
(``[pipeline] extends = "default"``) and ``[[insert]]`` passes before or after named ones
(:mod:`torchloom.passes.pipeline_extends`). A ``[[pass]]`` with ``optional = true`` is
skipped, with a note, when no installed plugin provides it. Every other mistake (unknown
table, key, pass or option; a wrong option type or value; a broken ordering constraint)
is a :class:`~torchloom.errors.PipelineError` naming file and line, with a did-you-mean.
"""

from __future__ import annotations

import enum
import hashlib
import json
import typing
from pathlib import Path
from typing import Any

import attrs

from torchloom.errors import PipelineError
from torchloom.passes.pipeline_dict import pipeline_toml
from torchloom.passes.pipeline_extends import flat_data, pass_tables
# builtin_pipelines, parse_raw, read_pipeline: re-exported, pipelines are read from here too
from torchloom.passes.pipeline_file import (Lines, RawPipeline, builtin_pipelines,  # noqa: F401
                                            did_you_mean, parse_raw, read_pipeline)
from torchloom.passes.sources import CORE_PACKAGE, SourceHashes
from torchloom.runtime.tiered import FIRST_CALLS

VERIFY_POLICIES = ("each", "end", "off", "numeric")
ON_ERROR = ("raise", "skip")
_PIPELINE_KEYS = {"name", "codegen", "verify", "on_error", "description", "extends"}
_PASS_KEYS = {"name", "optional"}
_FIXPOINT_KEYS = {"fixpoint", "max_iterations", "optional"}
_TOP_TABLES = {"pipeline", "plugins", "runtime", "pass", "insert"}
#: ``[runtime] partitioner``: how aot_autograd splits forward and backward
PARTITIONERS = ("min_cut", "default")
#: ``[runtime] backward``'s values: a training graph's backward compiled with its forward
#: ("ahead") or at the first ``backward()`` (aot_autograd's "lazy"); see compiler/ahead.py
BACKWARD_POLICIES = ("ahead", "lazy")


@attrs.frozen
class PassStep:
    pass_: Any  # a Pass instance
    line: int
    distribution: str = "?"
    version: str = "?"
    #: the pipeline file that names it (one the pipeline extends, perhaps)
    source: str = ""

    @property
    def name(self) -> str:
        return self.pass_.name


@attrs.frozen
class FixpointStep:
    passes: tuple[PassStep, ...]
    max_iterations: int
    line: int
    source: str = ""


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
    #: ``[runtime] first_calls``: what a group whose native kernel still builds runs
    #: ("wait" or "eager"; see runtime/tiered.py)
    first_calls: str = "wait"
    #: ``[runtime] backward``: when a training graph's backward compiles ("ahead": with
    #: its forward; "lazy": at the first ``backward()``; see compiler/ahead.py)
    backward: str = "ahead"
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


def build_pipeline(raw: RawPipeline, plugins) -> Pipeline:
    """Check a raw pipeline, and the pipelines it extends, against the installed passes
    and build it (see :mod:`torchloom.passes.pipeline_extends` for ``extends``)."""
    settings: dict[str, Any] = {}
    runtime: dict[str, Any] = {}
    for layer in raw.layers():  # the extended pipeline first: later files override
        layer_settings, layer_runtime = _check_layer(layer, plugins)
        settings.update(layer_settings)
        runtime.update(layer_runtime)
    steps: list[PassStep | FixpointStep] = []
    missing: list[str] = []
    for t in pass_tables(raw):
        err = _errors_in(t.source)
        if "fixpoint" in t.table:
            step = _build_fixpoint(t.table, t.line, plugins, t.lines, err, missing)
        else:
            step = _build_step(t.table, t.line, plugins, t.lines, err, missing, _PASS_KEYS)
        if isinstance(step, FixpointStep):
            step = attrs.evolve(step, source=t.source, passes=tuple(
                attrs.evolve(p, source=t.source) for p in step.passes))
        if step is not None:
            steps.append(attrs.evolve(step, source=t.source))
    name = raw.data.get("pipeline", {}).get("name", Path(raw.source).stem)
    codegens = settings.get("codegens", ("eager",))
    pipeline = Pipeline(name=name, source=raw.source, steps=tuple(steps),
                        # what a reproducer keeps: one file, whatever it extends
                        text=raw.text if raw.base is None else pipeline_toml(flat_data(raw, name)),
                        codegen=codegens[0], codegens=codegens,
                        verify=settings.get("verify", "each"),
                        on_error=settings.get("on_error", "raise"), disable=raw.disable,
                        runtime={k: v for k, v in runtime.items() if v is not None},
                        partitioner=settings.get("partitioner", "min_cut"),
                        partitioner_set="partitioner" in settings,
                        remote_cache=settings.get("remote_cache"),
                        first_calls=settings.get("first_calls", "wait"),
                        backward=settings.get("backward", "ahead"),
                        missing_optional=tuple(missing),
                        sources=getattr(plugins, "sources", None) or SourceHashes())
    _check_constraints(pipeline)
    return pipeline


def _errors_in(source: str):
    def err(line: int, message: str) -> PipelineError:
        return PipelineError(f"{source}:{line}: {message}")
    return err


def _check_layer(raw: RawPipeline, plugins) -> tuple[dict[str, Any], dict[str, Any]]:
    """One file's tables and keys checked: the settings it gives (``verify``, ``on_error``,
    ``codegens``, ``partitioner``, ``remote_cache``) and its runtime wrappers (name ->
    options, None for one it turns off)."""
    data, lines, err = raw.data, Lines(raw.text), _errors_in(raw.source)
    for key in data:
        if key not in _TOP_TABLES:
            raise err(lines.table(key), f"unknown table [{key}]{did_you_mean(key, _TOP_TABLES)}")
    head = data.get("pipeline", {})
    head_line = lines.table("pipeline")
    for key in head:
        if key not in _PIPELINE_KEYS:
            raise err(lines.key(head_line, key), f"unknown key {key!r} in [pipeline]"
                      f"{did_you_mean(key, _PIPELINE_KEYS)}")
    settings: dict[str, Any] = {}
    verify = settings["verify"] = head.get("verify", "each")
    if verify not in VERIFY_POLICIES:
        raise err(lines.key(head_line, "verify"),
                  f"verify = {verify!r} must be one of {', '.join(VERIFY_POLICIES)}")
    on_error = settings["on_error"] = head.get("on_error", "raise")
    if on_error not in ON_ERROR:
        raise err(lines.key(head_line, "on_error"),
                  f"on_error = {on_error!r} must be one of {', '.join(ON_ERROR)}")
    codegen = head.get("codegen", "eager")
    codegens = settings["codegens"] = tuple(codegen) if isinstance(codegen, list) else (codegen,)
    if not codegens or not all(isinstance(c, str) for c in codegens):
        raise err(lines.key(head_line, "codegen"), "codegen must be a string or a non-empty "
                                                   "list of strings")
    for key in data.get("plugins", {}):
        if key != "disable":
            raise err(lines.key(lines.table("plugins"), key),
                      f"unknown key {key!r} in [plugins] (only 'disable')")
    runtime_table = dict(data.get("runtime", {}))
    partitioner = settings["partitioner"] = runtime_table.pop("partitioner", "min_cut")
    if partitioner not in PARTITIONERS:
        raise err(lines.key(lines.table("runtime"), "partitioner"),
                  f"partitioner = {partitioner!r} must be one of {', '.join(PARTITIONERS)}")
    remote_cache = settings["remote_cache"] = runtime_table.pop("remote_cache", None)
    if remote_cache is not None and not isinstance(remote_cache, str):
        raise err(lines.key(lines.table("runtime"), "remote_cache"),
                  'remote_cache must be a string such as "redis://HOST:PORT/DB"')
    first_calls = settings["first_calls"] = runtime_table.pop("first_calls", "wait")
    if first_calls not in FIRST_CALLS:
        raise err(lines.key(lines.table("runtime"), "first_calls"),
                  f"first_calls = {first_calls!r} must be one of {', '.join(FIRST_CALLS)}")
    backward = settings["backward"] = runtime_table.pop("backward", "ahead")
    if backward not in BACKWARD_POLICIES:
        raise err(lines.key(lines.table("runtime"), "backward"),
                  f"backward = {backward!r} must be one of {', '.join(BACKWARD_POLICIES)}")
    # only what this file sets: it overrides the pipeline it extends, defaults fill the rest
    given = {*head, *data.get("runtime", {})} | ({"codegens"} if "codegen" in head else set())
    return ({k: v for k, v in settings.items() if k in given},
            _build_runtime(runtime_table, plugins, lines, err))


def _build_runtime(table: dict, plugins, lines: Lines, err) -> dict[str, Any]:
    """``[runtime] name = true`` enables a wrapper with default options; a table
    (``[runtime.name]`` or ``name = {...}``) enables it with options (``enabled = false``
    turns it off: None, which also turns off one the extended pipeline enables)."""
    out: dict[str, Any] = {}
    rline = lines.table("runtime")
    for key, value in table.items():
        line = lines.table(f"runtime.{key}") if isinstance(value, dict) else lines.key(rline, key)
        if key not in plugins.wrappers:
            raise err(line, f"unknown runtime setting {key!r}; installed runtime wrappers: "
                      f"{', '.join(sorted(plugins.wrappers)) or 'none'}"
                      f"{did_you_mean(key, plugins.wrappers)}")
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
        out[key] = instance if enabled else None
    return out


def _build_fixpoint(entry: dict, tline: int, plugins, lines: Lines, err,
                    missing: list[str]) -> FixpointStep | None:
    for key in entry:
        if key not in _FIXPOINT_KEYS:
            raise err(lines.key(tline, key), f"unknown key {key!r} in a fixpoint [[pass]]"
                      f"{did_you_mean(key, _FIXPOINT_KEYS)}")
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


def _build_step(entry: dict, tline: int, plugins, lines: Lines, err, missing: list[str],
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
        # a plugin that failed to import registers nothing: say so, not only "unknown"
        why = getattr(plugins, "why_pass_missing", lambda _: "")(name)
        raise err(lines.key(tline, "name") if not inline else tline,
                  f"unknown pass {name!r}{why}{did_you_mean(name, plugins.passes)} "
                  f"(installed: {installed})")
    reg = plugins.passes[name]
    options = {k: v for k, v in entry.items() if k not in keys}
    instance = _instantiate(reg.obj, options, f"pass {name!r}", tline, lines, err, inline)
    return PassStep(instance, tline, reg.distribution, reg.version)


def _instantiate(cls, options: dict, what: str, tline: int, lines: Lines, err,
                 inline: bool = False):
    fields = {f.name: f for f in attrs.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key, value in options.items():
        line = tline if inline else lines.key(tline, key)
        if key not in fields:
            known = ", ".join(fields) or "none"
            raise err(line, f"{what} has no option {key!r}{did_you_mean(key, fields)} "
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


def _check_constraints(pipeline: Pipeline) -> None:
    order = pipeline.flat_steps()
    position = {}
    for i, step in enumerate(order):
        position.setdefault(step.name, i)
    for i, step in enumerate(order):
        cls = type(step.pass_)
        err = _errors_in(step.source or pipeline.source)
        for req in getattr(cls, "requires", ()):
            if req not in position or position[req] >= i:
                raise err(step.line, f"pass {step.name!r} requires {req!r} to run before it, "
                          f"but {'it comes later' if req in position else 'it is not in the pipeline'}")
        for prior in getattr(cls, "after", ()):
            if prior in position and position[prior] > i:
                later = order[position[prior]]
                there = (f"line {later.line}" if later.source == step.source
                         else f"{later.source}:{later.line}")
                raise err(step.line, f"pass {step.name!r} must run after {prior!r}, but "
                          f"{prior!r} comes later ({there})")
