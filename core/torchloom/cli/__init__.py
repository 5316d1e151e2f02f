"""The ``torchloom`` command line.

    torchloom plugins [--json]
    torchloom check PIPELINE [--json]
    torchloom explain WORKLOAD [--pipeline P] [--device D] [--json] [--dump DIR] [--show-ir]
                      [--target sm_NN] [--cached] [--html FILE] [--dynamic]
    torchloom bench WORKLOAD [--pipeline P] [--device D] [--iters N] [--rounds R] [--json]
    torchloom reproduce DIR
    torchloom reduce DIR
    torchloom opt [FILE] (--passes P1,P2{opt=v} | --pipeline P) [--verify-each] [-o OUT]
    torchloom perf-history [GATE] [--storage DIR] [--machine ID] [--json]

    torchloom --version        (python -m torchloom is the same command line)

User errors exit with code 2 and a one-paragraph message (``--traceback``, before or after
the command, shows more).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import re
import sys
import traceback

from torchloom.errors import TorchloomError


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser; every option has a help text."""
    parser = argparse.ArgumentParser(
        prog="torchloom", description="torchloom, a fusion compiler for PyTorch: list plugins, "
        "check pipelines, explain and benchmark a workload, replay a reproducer.",
        epilog="User errors exit with code 2, a failing pass with 1.")
    parser.add_argument("--version", action="version", version=_version(),
                        help="print the versions of torchloom and torch, then exit")
    _add_traceback(parser, False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("plugins", help="list installed plugins, passes, codegens, load errors")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p = sub.add_parser("check", help="validate a pipeline file (or built-in name)")
    p.add_argument("pipeline", help="a pipeline TOML file or a built-in name (default, none)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON document (ok, passes, codegens, notes; or the error)")
    p = _add_workload(sub, "explain", "compile a workload, run it once, compare with eager")
    p.add_argument("--json", action="store_true",
                   help="print one JSON document (schema: docs/explain-json.md)")
    p.add_argument("--dump", metavar="DIR",
                   help="write the IR after each pass, its diff, and kernel sources")
    p.add_argument("--show-ir", action="store_true", help="print the IR before and after")
    p.add_argument("--html", metavar="FILE",
                   help="also write a self-contained HTML report: each graph drawn by fusion "
                        "group, kernels with source, time and bytes, fallbacks, pass "
                        "timeline and IR diffs")
    p.add_argument("--cached", action="store_true",
                   help="use the compile cache, as a warm start does (graphs compiled "
                        "before run no pass); by default every pass runs")
    p.add_argument("--target", metavar="sm_NN",
                   help="generate every kernel for this CUDA GPU and compile it ahead of "
                        "time, without one: trace on the meta device, run nothing")
    p.add_argument("--dynamic", action="store_true",
                   help="compile with every size symbolic, as torch.compile(dynamic=True)")
    p = _add_workload(sub, "bench", "time eager, Inductor and torchloom side by side")
    p.add_argument("--iters", type=int, default=20, help="calls per timed round")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls after compiling")
    p.add_argument("--no-inductor", action="store_true", help="do not time Inductor")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p = sub.add_parser("reproduce", help="replay a pass-failure reproducer directory")
    p.add_argument("directory", help="a reproducer directory (as named by a pass's error)")
    p = sub.add_parser("reduce", help="shrink a failing reproducer to a small graph that "
                                      "fails the same way",
                       description="Delta-debug a reproducer's IR (drop outputs, replace "
                                   "nodes by inputs, shrink shapes) while the pass fails the "
                                   "same way; write reduced.ir and reduced.toml beside it.")
    p.add_argument("directory", help="a reproducer directory (as named by a pass's error)")
    from torchloom.cli.opt import add_opt_parser
    from torchloom.cli.perf_history import add_perf_history_parser
    add_opt_parser(sub)
    add_perf_history_parser(sub)
    for p in sub.choices.values():  # also accepted after the command: explain X --traceback
        _add_traceback(p, argparse.SUPPRESS)
    return parser


def _add_workload(sub, name: str, help: str) -> argparse.ArgumentParser:
    """A command that compiles a workload file: its workload, pipeline and device."""
    p = sub.add_parser(name, help=help)
    p.add_argument("workload", help="a Python file defining workload()")
    p.add_argument("--pipeline", default="default",
                   help="a pipeline TOML file or a built-in name (default: %(default)s)")
    p.add_argument("--device", default="cpu",
                   help="device the workload is built on (default: %(default)s)")
    return p


def _add_traceback(parser: argparse.ArgumentParser, default) -> None:
    # SUPPRESS in subcommands: absent there, it keeps what the main parser set
    parser.add_argument("--traceback", action="store_true", default=default,
                        help="show tracebacks of errors")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from torchloom import __version__
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "not installed"
    return f"torchloom {__version__} (torch {torch_version}, Python {sys.version.split()[0]})"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse printed usage and the error on stderr
        if exc.code == 2 and "--json" in argv:  # the one document a --json command prints
            command = next((a for a in argv if a in _COMMANDS), None)
            print(json.dumps({"ok": False, "command": command, "exit_code": 2,
                              "error": "invalid command line (usage on stderr)"}, indent=2))
        raise
    try:
        return _run(args)
    except TorchloomError as exc:
        if args.traceback:
            traceback.print_exc()
        print(f"torchloom {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code


def _run(args) -> int:
    """Run a command. With ``--json``, stdout carries exactly one JSON document, an error
    included (``{"ok": false, "error": ...}``): while the command runs, whatever else
    writes to stdout (the workload's print() calls, a compiler a codegen starts) goes to
    stderr; the document is printed afterwards."""
    if not getattr(args, "json", False):
        return _COMMANDS[args.command](args)
    args = argparse.Namespace(**vars(args), document=[])  # where _json puts the document
    try:
        with _stdout_to_stderr():
            code = _COMMANDS[args.command](args)
    except Exception as exc:  # the command's own error document (check's) wins
        if not args.document:
            _json(args, _error_document(args, exc))
        raise
    finally:
        if args.document:
            print(args.document[-1])
    return code


def _error_document(args, exc: Exception, **extra) -> dict:
    """The ``--json`` document of a command that failed: what stderr says, and the exit
    code (2 for a user error, 1 for a failing pass or a bug in torchloom or a plugin)."""
    user = isinstance(exc, TorchloomError)
    return {"ok": False, "command": args.command, **extra,
            "error": str(exc) if user else f"{type(exc).__name__}: {exc}",
            "exit_code": exc.exit_code if user else 1}


@contextlib.contextmanager
def _stdout_to_stderr():
    """Send Python's ``sys.stdout`` and, when both are real files, file descriptor 1 to
    stderr (what child processes and C code write)."""
    sys.stdout.flush()
    try:
        fd, err_fd = sys.stdout.fileno(), sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # captured streams (pytest, notebooks)
        fd = err_fd = None
    saved = os.dup(fd) if fd is not None else None
    if saved is not None:
        sys.stderr.flush()
        os.dup2(err_fd, fd)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, fd)
            os.close(saved)


def _json(args, data) -> None:
    """The one JSON document of a ``--json`` command (printed by :func:`_run`)."""
    args.document.append(json.dumps(data, indent=2))


def _plugins(args) -> int:
    from torchloom.plugins.loader import load_plugins
    ps = load_plugins()
    data = {
        "plugins": [{"name": n, "distribution": d, "version": v}
                    for n, (d, v) in sorted(ps.plugins.items())],
        "passes": {n: {"distribution": r.distribution, "plugin": r.plugin,
                       "doc": first_sentence(r.obj.__doc__)}
                   for n, r in sorted(ps.passes.items())},
        # a name several plugins register: every owner (pipelines using it fail)
        "clashes": {n: [{"distribution": r.distribution, "plugin": r.plugin,
                         "version": r.version} for r in owners]
                    for n, owners in sorted(ps.clashes.items())},
        "codegens": {n: r.distribution for n, r in sorted(ps.codegens.items())},
        "runtime_wrappers": {n: r.distribution for n, r in sorted(ps.wrappers.items())},
        "errors": [{"entry_point": e.entry_point, "distribution": e.distribution,
                    "error": e.error} for e in ps.errors],
        "warnings": list(ps.warnings),
        "disabled": ps.disabled,
    }
    if args.json:
        _json(args, data)
        return 0
    print("plugins:")
    for p in data["plugins"]:
        print(f"  {p['name']:<16} {p['distribution']} {p['version']}")
    print("passes:")
    for n, info in data["passes"].items():
        print(f"  {n:<24} ({info['distribution']}) {info['doc']}")
    for n in data["clashes"]:
        print(f"  {n:<24} CLASH: {ps.clash_message(n)}; a pipeline that uses it fails")
    print("codegens: " + ", ".join(f"{n} ({d})" for n, d in data["codegens"].items()))
    print("runtime wrappers: " + (", ".join(data["runtime_wrappers"]) or "none"))
    for e in ps.errors:
        print(f"load error: {e}")
    for w in ps.warnings:
        print(f"warning: {w}")
    if ps.disabled:
        print("disabled: " + ", ".join(ps.disabled))
    return 0


def first_sentence(doc: str | None) -> str:
    """The first sentence of a docstring, whole: its first paragraph on one line, cut
    after the first ``.``, ``!`` or ``?`` that a capitalised sentence follows (``e.g. x``
    and ``1.5`` do not end one)."""
    paragraph = inspect.cleandoc(doc or "").split("\n\n")[0]
    text = " ".join(paragraph.split())
    return re.split(r"(?<=[.!?])\s+(?=[A-Z`(\"'])", text, maxsplit=1)[0]


def _check(args) -> int:
    if not args.json:
        report = _check_report(args.pipeline)
        print(f"{report['source']}: ok ({report['passes']} passes, codegen "
              f"{', '.join(report['codegens'])}, verify {report['verify']}, fingerprint "
              f"{report['fingerprint']})")
        for note in report["notes"]:
            print(f"  note: {note}")
        return 0
    try:
        _json(args, {"ok": True, **_check_report(args.pipeline)})
    except TorchloomError as exc:  # the document says what is wrong; stderr and exit 2 too
        _json(args, _error_document(args, exc, pipeline=args.pipeline))
        raise
    return 0


def _check_report(spec: str) -> dict:
    """What ``check`` finds in a pipeline: its shape, and notes on what will not run."""
    import difflib

    from torchloom.plugins.pipelines import load_pipeline
    loaded = load_pipeline(spec)
    raw, plugins, pipeline = loaded.raw, loaded.plugins, loaded.pipeline
    notes = [f"optional pass {name!r} is not installed" for name in pipeline.missing_optional]
    if not pipeline.steps and not pipeline.missing_optional:
        what = f"{raw.source} is empty" if not raw.data else "the pipeline has no [[pass]]"
        notes.append(f"{what}: no pass runs, so graphs are compiled as they are imported "
                     f"(every op its own kernel); add [[pass]] tables to fuse")
    for name in pipeline.codegens:
        if name in plugins.codegens:
            continue
        close = difflib.get_close_matches(name, list(plugins.codegens), n=1)
        fallback = ("every group will run on 'eager'" if len(pipeline.codegens) == 1
                    else "its groups run on the next codegen or 'eager'")
        notes.append(f"codegen {name!r} {plugins.why_missing(name)}, {fallback} "
                     f"(installed: {', '.join(sorted(plugins.codegens))})"
                     + (f"; did you mean {close[0]!r}?" if close else ""))
    # the pipeline is valid without them, but what they provide is missing from every run
    notes.extend(f"plugin {e.entry_point!r} from distribution {e.distribution!r} failed to "
                 f"load and was skipped (its passes and codegens are unavailable): "
                 f"{e.summary}" for e in plugins.errors)
    return {"source": raw.source, "name": pipeline.name, "passes": len(pipeline.flat_steps()),
            "pass_names": [s.name for s in pipeline.flat_steps()],
            "codegens": list(pipeline.codegens), "verify": pipeline.verify,
            "fingerprint": pipeline.fingerprint(), "notes": notes,
            "load_errors": [{"entry_point": e.entry_point, "distribution": e.distribution,
                             "error": e.error} for e in plugins.errors]}


def _explain(args) -> int:
    from torchloom.report.explain import explain, format_explain
    recorder = None
    if args.html:
        from torchloom.report.diagnose import check_output_file
        from torchloom.report.html import PassIRRecorder
        check_output_file(args.html, "--html")
        recorder = PassIRRecorder()
    result = explain(args.workload, pipeline=args.pipeline, device=args.device,
                     dump_dir=args.dump, keep_ir=args.show_ir, target=args.target,
                     cached=args.cached, instruments=[recorder] if recorder else [],
                     dynamic=args.dynamic)
    if args.html:
        from torchloom.report.html import write_html
        write_html(result, args.html, recorder, result.data.get("graph_breaks"))
    if args.json:
        _json(args, result.data)
    else:
        print(format_explain(result, show_ir=args.show_ir))
    return 0


def _bench(args) -> int:
    from torchloom.cli.bench import bench, format_bench
    from torchloom.errors import TorchloomError
    if args.iters < 1 or args.rounds < 1 or args.warmup < 0:
        raise TorchloomError("bench: --iters and --rounds must be >= 1, --warmup >= 0")
    result = bench(args.workload, pipeline=args.pipeline, device=args.device,
                   iters=args.iters, rounds=args.rounds, warmup=args.warmup,
                   inductor=not args.no_inductor)
    if args.json:
        _json(args, result.data)
    else:
        print(format_bench(result))
    return 0


def _reproduce(args) -> int:
    from torchloom.compiler.reproduce import reproduce
    print(reproduce(args.directory))
    return 0


def _reduce(args) -> int:
    from torchloom.cli.reduce import reduce_reproducer, summary
    sys.stdout.write(summary(reduce_reproducer(args.directory)))
    return 0


def _opt(args) -> int:
    from torchloom.cli.opt import run_opt
    return run_opt(args)


def _perf_history(args) -> int:
    from torchloom.cli.perf_history import perf_history
    gates, text = perf_history(args)
    if args.json:
        _json(args, {"ok": True, "gates": gates})
    else:
        print(text)
    return 0


_COMMANDS = {"plugins": _plugins, "check": _check, "explain": _explain, "bench": _bench,
             "reproduce": _reproduce, "reduce": _reduce, "opt": _opt,
             "perf-history": _perf_history}
