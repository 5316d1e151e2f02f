"""Plugin discovery and loading.

Every entry point of the ``torchloom`` group is loaded on its own: one that fails to
import is recorded (entry point, distribution, error) and skipped while the others load.
``TORCHLOOM_DISABLE_PLUGINS=a,b`` (or ``disable=`` here, from a pipeline's
``[plugins] disable``) skips entry points or distributions by name before importing them.
"""

from __future__ import annotations

import difflib
import importlib.metadata as md
import logging
import os
import platform
import re
import traceback
import types
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import pluggy

from torchloom.environment import env_flag
from torchloom.ops.aten import default_registry
from torchloom.ops.registry import OpRegistry
from torchloom.passes.sources import SourceHashes
from torchloom.plugins.hookspecs import TorchloomSpec

GROUP = "torchloom"
BUILTIN = "torchloom"  # distribution name of the core's built-in plugin
log = logging.getLogger("torchloom.plugins")


@attrs.frozen
class LoadError:
    entry_point: str
    distribution: str
    error: str

    def __str__(self) -> str:
        return (f"plugin {self.entry_point!r} from distribution {self.distribution!r} failed "
                f"to load and was skipped: {self.error}")

    @property
    def summary(self) -> str:
        """The error on one line: its last line (``ImportError: ...``), and where a
        ``SyntaxError`` points (``File "x.py", line 3``)."""
        lines = [ln.strip() for ln in self.error.splitlines() if ln.strip()]
        where = [ln for ln in lines[:-1] if ln.startswith("File ")]
        return (lines[-1] if lines else "?") + (f" ({where[0]})" if where else "")

    def names(self, word: str) -> bool:
        """Whether this plugin's entry point or distribution names ``word`` (a pass's
        namespace, a codegen): ``codegen_triton`` and ``torchloom-codegen-triton`` name
        ``triton`` and ``codegen-triton``."""
        def norm(text: str) -> str:
            return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
        own = {norm(self.entry_point), norm(self.distribution)}
        own |= {n.removeprefix("torchloom-") for n in own}
        own |= {part for n in own for part in n.split("-")}
        return norm(word) in own


@attrs.frozen
class Registered:
    """Something a plugin registered, with where it came from."""

    obj: Any
    plugin: str
    distribution: str
    version: str


@attrs.define
class PluginSet:
    """The result of loading: what every plugin registered, and what failed."""

    pm: pluggy.PluginManager
    passes: dict[str, Registered] = attrs.field(factory=dict)
    codegens: dict[str, Registered] = attrs.field(factory=dict)
    wrappers: dict[str, Registered] = attrs.field(factory=dict)
    instruments: list[Registered] = attrs.field(factory=list)
    registry: OpRegistry = attrs.field(factory=default_registry)
    errors: list[LoadError] = attrs.field(factory=list)
    #: plugin name -> (distribution, version)
    plugins: dict[str, tuple[str, str]] = attrs.field(factory=dict)
    disabled: list[str] = attrs.field(factory=list)
    #: source hashes of the packages passes come from, computed once for this set
    sources: SourceHashes = attrs.field(factory=SourceHashes)
    #: pass name -> every plugin registering a different class under it; such a name is
    #: left out of ``passes``: only a pipeline that uses it fails (see ``clash_message``)
    clashes: dict[str, list[Registered]] = attrs.field(factory=dict)
    #: mistakes that do not stop a plugin loading but make part of it never run (a
    #: misspelled hook, a hook without ``@hookimpl``); the compiler logs them
    warnings: list[str] = attrs.field(factory=list)

    def pass_class(self, name: str):
        return self.passes[name].obj

    def clash_message(self, name: str) -> str:
        """Why pass ``name`` cannot be used: who registers it, and what to do."""
        owners = self.clashes[name]
        times = "twice" if len(owners) == 2 else f"{len(owners)} times"
        who = " and by ".join(f"{r.distribution!r} (plugin {r.plugin!r})" for r in owners)
        return (f"pass {name!r} is registered {times}: by distribution {who}; uninstall or "
                f"disable all but one (TORCHLOOM_DISABLE_PLUGINS={owners[-1].plugin}, or "
                f"[plugins] disable = [\"{owners[-1].plugin}\"] in the pipeline)")

    def codegen(self, name: str):
        return self.codegens[name].obj

    def versions(self) -> dict[str, Any]:
        """torchloom's, torch's and Python's versions and every loaded plugin's
        distribution and version: what a compile-cache key and a reproducer record."""
        import torch
        from torchloom import __version__
        return {"torchloom": __version__, "torch": torch.__version__,
                "python": platform.python_version(),
                "plugins": {name: {"distribution": d, "version": v}
                            for name, (d, v) in sorted(self.plugins.items())}}

    def why_missing(self, codegen: str) -> str:
        """Why codegen ``codegen`` is not available, to follow its quoted name: ``failed to
        load: <error> (...)`` when a plugin whose entry point or distribution names it (as
        ``codegen_triton`` / ``torchloom-codegen-triton`` name ``triton``) failed to load,
        else ``is not installed``."""
        for err in self.errors:
            if err.names(codegen):
                return (f"failed to load: {err.error.splitlines()[-1]} (plugin "
                        f"{err.entry_point!r} from distribution {err.distribution!r})")
        return "is not installed"

    def why_pass_missing(self, name: str) -> str:
        """What to add to ``unknown pass 'ns.name'`` when plugins failed to load: the load
        error of the plugin whose entry point or distribution the pass's namespace names,
        else every load error (one of those plugins may be the one providing it)."""
        namespace = name.split(".")[0] if "." in name else ""
        named = [e for e in self.errors if namespace and e.names(namespace)]
        if named:
            return "; " + "; ".join(
                f"plugin {e.entry_point!r} from distribution {e.distribution!r}, which its "
                f"namespace {namespace!r} names, failed to load: {e.summary}" for e in named
            ) + " (fix that and `torchloom plugins` lists its passes)"
        if not self.errors:
            return ""
        which = "; ".join(f"plugin {e.entry_point!r} from distribution {e.distribution!r}: "
                          f"{e.summary}" for e in self.errors)
        count = "a plugin" if len(self.errors) == 1 else f"{len(self.errors)} plugins"
        return f"; {count} failed to load and may provide it ({which})"

    def codegen_chain(self, preferred: str | Sequence[str]) -> list[Any]:
        """Codegens to try for a group: the preferred ones that are installed, in order
        (each declines the groups it does not serve, e.g. devices), then ``eager``."""
        names = [preferred] if isinstance(preferred, str) else list(preferred)
        chain = [self.codegens[n].obj for n in dict.fromkeys(names) if n in self.codegens]
        if "eager" not in names:
            chain.append(self.codegens["eager"].obj)
        return chain


def _dist_of(ep: md.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ("<unknown>", "?")
    return (dist.metadata["Name"] or "<unknown>", dist.version or "?")


def disabled_from_env() -> list[str]:
    raw = os.environ.get("TORCHLOOM_DISABLE_PLUGINS", "")
    return [x.strip() for x in raw.split(",") if x.strip()]


def load_plugins(disable: Iterable[str] = (), *, entry_points: Iterable[md.EntryPoint] | None = None,
                 extra: Iterable[tuple[str, Any, str, str]] = ()) -> PluginSet:
    """Load the built-ins and every installed plugin.

    ``entry_points`` replaces discovery (tests); ``extra`` adds already-imported plugin
    objects as ``(name, module, distribution, version)``.
    """
    pm = pluggy.PluginManager(GROUP)
    pm.add_hookspecs(TorchloomSpec)
    if env_flag("TORCHLOOM_TRACE_PLUGINS", False):  # pluggy's trace of every hook call
        pm.trace.root.setwriter(lambda line: log.debug("%s", line.rstrip("\n")))
        pm.enable_tracing()
    disabled = set(disable) | set(disabled_from_env())
    result = PluginSet(pm, disabled=sorted(disabled))
    from torchloom.plugins import builtin
    from torchloom import __version__
    candidates: list[tuple[str, Any, str, str]] = [("builtin", builtin, BUILTIN, __version__)]
    eps = md.entry_points(group=GROUP) if entry_points is None else entry_points
    for ep in sorted(eps, key=lambda e: e.name):
        dist, version = _dist_of(ep)
        if ep.name in disabled or dist in disabled:
            continue
        try:
            module = ep.load()
        except Exception as exc:  # a broken plugin must not take the others down
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            result.errors.append(LoadError(ep.name, dist, detail))
            continue
        candidates.append((ep.name, module, dist, version))
    candidates.extend((name, _hashable(name, obj), dist, version)
                      for name, obj, dist, version in extra)
    for name, module, dist, version in candidates:
        try:
            pm.register(module, name=name)
        except Exception as exc:
            result.errors.append(LoadError(name, dist, f"registration failed: {exc}"))
            continue
        result.plugins[name] = (dist, version)
        result.warnings.extend(hook_name_problems(name, module, dist))
    _collect(result)
    return result


def _hashable(name: str, plugin: Any) -> Any:
    """pluggy keeps plugins in sets: an unhashable plugin object (a namespace a test
    builds) is registered as a module holding the same attributes."""
    try:
        hash(plugin)
        return plugin
    except TypeError:
        module = types.ModuleType(f"torchloom_plugin_{name}")
        module.__dict__.update(vars(plugin))
        return module


#: the hooks a plugin may implement (the specs of :class:`TorchloomSpec`)
HOOKS = tuple(sorted(n for n in vars(TorchloomSpec) if n.startswith(f"{GROUP}_")))


def hook_name_problems(plugin: str, module: Any, distribution: str) -> list[str]:
    """What pluggy would silently ignore in a plugin module: a function named like a hook
    (``torchloom_*``) that is no hook (a misspelling such as ``torchloom_pass``), and a hook
    function without ``@hookimpl``."""
    problems = []
    for attr in sorted(dir(module)):
        function = getattr(module, attr, None) if attr.startswith(f"{GROUP}_") else None
        if not callable(function) or isinstance(function, type):
            continue
        who = f"plugin {plugin!r} (distribution {distribution!r})"
        if attr not in HOOKS:
            close = difflib.get_close_matches(attr, HOOKS, n=1)
            problems.append(f"{who} defines {attr}, which is not a torchloom hook, so it is "
                            f"never called" + (f"; did you mean {close[0]}?" if close else "")
                            + f" (hooks: {', '.join(HOOKS)})")
        elif not hasattr(function, f"{GROUP}_impl"):
            problems.append(f"{who} defines {attr} without @hookimpl "
                            f"(torchloom.api.hookimpl), so it is never called")
    return problems


def _collect(result: PluginSet) -> None:
    pm = result.pm
    from torchloom.passes.base import Pass
    for impl in pm.hook.torchloom_passes.get_hookimpls():
        plugin = impl.plugin_name
        dist, version = result.plugins[plugin]
        for cls in _call(result, impl, "torchloom_passes"):
            name = getattr(cls, "name", "")
            if not (isinstance(cls, type) and issubclass(cls, Pass)) or not name:
                what = getattr(cls, "__qualname__", repr(cls))
                result.errors.append(LoadError(plugin, dist, f"torchloom_passes returned "
                                               f"{what}, which is not a Pass subclass with a "
                                               f"name; it was skipped"))
                continue
            if not attrs.has(cls):
                result.errors.append(LoadError(plugin, dist, f"pass {name!r} "
                                               f"({cls.__qualname__}) is not an @attrs.frozen "
                                               f"class, so its options cannot be checked; it "
                                               f"was skipped"))
                continue
            registered = Registered(cls, plugin, dist, version)
            if name in result.clashes:
                result.clashes[name].append(registered)
            elif name in result.passes and result.passes[name].obj is not cls:
                # not an error here: only the pipelines that use the name fail
                result.clashes[name] = [result.passes.pop(name), registered]
            else:
                result.passes[name] = registered
    for impl in pm.hook.torchloom_codegens.get_hookimpls():
        dist, version = result.plugins[impl.plugin_name]
        for cg in _call(result, impl, "torchloom_codegens"):
            result.codegens[cg.name] = Registered(cg, impl.plugin_name, dist, version)
    for impl in pm.hook.torchloom_runtime_wrappers.get_hookimpls():
        dist, version = result.plugins[impl.plugin_name]
        for w in _call(result, impl, "torchloom_runtime_wrappers"):
            result.wrappers[w.name] = Registered(w, impl.plugin_name, dist, version)
    for impl in pm.hook.torchloom_instruments.get_hookimpls():
        dist, version = result.plugins[impl.plugin_name]
        for ins in _call(result, impl, "torchloom_instruments"):
            result.instruments.append(Registered(ins, impl.plugin_name, dist, version))
    for impl in pm.hook.torchloom_ops.get_hookimpls():
        _call(result, impl, "torchloom_ops", registry=result.registry)


def _call(result: PluginSet, impl, hook: str, **kwargs) -> list:
    """Call one plugin's hook implementation, through pluggy (so its tracing and call
    monitoring see it) but on its own. One that raises is recorded as a load error naming
    the plugin, hook and distribution, and contributes nothing: a broken plugin must not
    take the others down."""
    others = [p for p in result.pm.get_plugins() if p is not impl.plugin]
    try:
        returned = result.pm.subset_hook_caller(hook, remove_plugins=others)(**kwargs)
        return list(returned[0] or []) if returned else []
    except Exception as exc:
        dist = result.plugins.get(impl.plugin_name, ("?", "?"))[0]
        result.errors.append(LoadError(impl.plugin_name, dist, f"{hook} raised "
                                       f"{type(exc).__name__}: {exc}"))
        return []
