"""``torchloom opt``: run passes on IR text and print the IR they leave, as ``mlir-opt``
and ``xdsl-opt`` do.

    torchloom opt [FILE] --passes fusion.vertical,dedup.regions{min_nodes=3},cse
    torchloom opt [FILE] --pipeline default [--verify-each]

``FILE`` (``-`` or absent: stdin) holds IR text; ``//`` comments are skipped, so a golden
test file (``// RUN:`` and ``// CHECK:`` lines around a graph) is its own input. The
passes run through the real pass manager (shared subgraphs, fixpoint groups, rollback and
verification as in a compilation), then the graph is printed. Errors name the file and
line (IR that does not parse or verify) or the pass (a pass that raises or leaves a graph
the verifier rejects); codegens do not run.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

from torchloom.errors import PassError, PipelineError, TorchloomError, VerifyError

#: what ``--passes`` is called in errors (it is the "file" they point into)
PASSES_SOURCE = "--passes"
#: ``PassError.pass_name`` of a failure the pass manager could not pin on one pass
PIPELINE_FAILURE = "<pipeline>"


def add_opt_parser(sub) -> None:
    """Register ``opt`` on the CLI's subcommand parsers."""
    p = sub.add_parser("opt", help="run passes on IR text and print the result (like mlir-opt)",
                       description="Parse IR text, run passes through the pass manager and "
                                   "print the IR. Golden tests are files whose '// RUN:' line "
                                   "pipes this into filecheck.")
    p.add_argument("file", nargs="?", default="-",
                   help="IR text file ('-' or absent: stdin); '//' comments are skipped")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--passes", metavar="P1,P2{opt=v},...",
                      help="passes to run in order, by name; options in braces, "
                           "space-separated: cse{regions=false}")
    what.add_argument("--pipeline", metavar="PIPELINE",
                      help="a pipeline TOML file or a built-in name (default, none)")
    p.add_argument("--verify-each", action="store_true",
                   help="verify after every pass, naming the pass that breaks the graph "
                        "(default: the pipeline's policy; after the last pass for --passes)")
    p.add_argument("--device", default="cpu", help="device passes see (default: %(default)s)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the IR here, not to stdout")


def run_opt(args) -> int:
    text, source = _read_input(args.file)
    printed = opt(text, source, passes=args.passes, pipeline=args.pipeline,
                  verify_each=args.verify_each, device=args.device)
    if args.output:
        Path(args.output).write_text(printed)
    else:
        sys.stdout.write(printed)
    return 0


def opt(text: str, source: str, *, passes: str | None = None, pipeline: str | None = None,
        verify_each: bool = False, device: str = "cpu", plugins=None) -> str:
    """Parse ``text``, verify it, run ``passes`` (a ``--passes`` string) or ``pipeline``
    (a name or file) on it and return the printed result."""
    import attrs

    from torchloom.ir.text import parse_graph, print_graph
    from torchloom.ir.verify import verify
    from torchloom.passes.base import PassContext
    from torchloom.passes.manager import PassManager
    from torchloom.passes.pipeline import parse_raw, read_pipeline
    from torchloom.plugins.pipelines import load_pipeline

    if (passes is None) == (pipeline is None):
        raise TorchloomError("opt: give either --passes or --pipeline")
    if passes is not None:
        toml, entries = passes_toml(passes, "each" if verify_each else "end")
        raw = parse_raw(toml, PASSES_SOURCE)
    else:
        raw, entries = read_pipeline(pipeline), None
    try:
        loaded = load_pipeline(raw, plugins)
    except PipelineError as exc:
        raise _point_into_passes(exc, entries) if entries is not None else exc
    plugins, built = loaded.plugins, loaded.pipeline
    if verify_each and built.verify != "numeric":  # numeric verifies after each pass too
        built = attrs.evolve(built, verify="each")
    graph = parse_graph(text, source)
    try:
        verify(graph, plugins.registry)
    except VerifyError as exc:
        raise VerifyError(f"{source}:{_line_of(exc, text)}: the input graph fails "
                          f"verification before any pass ran: {exc}") from None
    ctx = PassContext(registry=plugins.registry, device=device)
    try:
        PassManager(built, plugins).run(graph, ctx)
    except PassError as exc:
        if exc.pass_name != PIPELINE_FAILURE:
            raise
        raise _name_the_pass(exc, text, source, built, plugins, device) from exc.__cause__
    return print_graph(graph)


def _name_the_pass(exc: PassError, text: str, source: str, pipeline, plugins,
                   device: str) -> PassError:
    """The pipeline verifies only after its last pass (``verify = "end"``, the default of
    ``--passes``), so its error cannot say which pass broke the graph: run it again on the
    input with a check after every pass, as ``--verify-each`` does, and report the pass
    that fails (IR text is small; a compilation's pipeline is not rerun this way)."""
    import attrs

    from torchloom.ir.text import parse_graph
    from torchloom.passes.base import PassContext
    from torchloom.passes.manager import PassManager
    each = attrs.evolve(pipeline, verify="each")
    try:
        PassManager(each, plugins).run(parse_graph(text, source),
                                       PassContext(registry=plugins.registry, device=device))
    except PassError as named:
        if named.pass_name != PIPELINE_FAILURE:
            return PassError(f"{named}\n(The pipeline checks the graph only after its last "
                             f"pass, so opt reran it with --verify-each to name the pass.)",
                             named.pass_name, named.distribution, named.reproducer)
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return PassError(f"{pipeline.source}: the graph after the passes of pipeline "
                     f"{pipeline.name!r} fails verification: {cause}\nRerunning them with "
                     f"--verify-each (the pipeline checks only after its last pass) found "
                     f"no single pass to blame; a pass may behave differently from run to "
                     f"run.", exc.pass_name, exc.distribution, exc.reproducer)


def passes_toml(spec: str, verify: str) -> tuple[str, list[tuple[int, str]]]:
    """The pipeline TOML of a ``--passes`` string, and for each pass the TOML line where
    its table starts with the entry as written (to point errors at the entry)."""
    lines = ['[pipeline]', 'name = "opt"', 'codegen = "eager"', f'verify = "{verify}"']
    entries = []
    for entry in _split_top(spec):
        m = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\{(.*)\})?\s*", entry, re.S)
        if m is None:
            raise PipelineError(f"{PASSES_SOURCE}: {entry.strip()!r} is not a pass "
                                f"(write name or name{{option=value ...}})")
        lines.append("")
        entries.append((len(lines) + 1, entry.strip()))
        lines += ["[[pass]]", f'name = "{m.group(1)}"']
        for option in re.split(r"[\s,]+", (m.group(2) or "").strip()):
            if not option:
                continue
            key, eq, value = option.partition("=")
            if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise PipelineError(f"{PASSES_SOURCE}: option {option!r} of {entry.strip()!r}"
                                    f" must be written key=value")
            lines.append(f"{key} = {_toml_value(value)}")
    if not entries:
        raise PipelineError(f"{PASSES_SOURCE}: no pass named (write --passes a,b,c)")
    return "\n".join(lines) + "\n", entries


def _split_top(spec: str) -> list[str]:
    """Split on commas outside braces: ``a{x=1,y=2},b`` -> ``a{x=1,y=2}``, ``b``."""
    out, depth, cur = [], 0, []
    for ch in spec:
        depth += (ch == "{") - (ch == "}")
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [e for e in out if e.strip()]


def _toml_value(value: str) -> str:
    """``3``, ``1.5``, ``true``, ``[1, 2]``, ``"s"`` as TOML reads them; a bare word is a
    string."""
    try:
        tomllib.loads(f"v = {value}")
        return value
    except tomllib.TOMLDecodeError:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _point_into_passes(exc: PipelineError, entries: list[tuple[int, str]]) -> PipelineError:
    """``--passes:9: pass 'x' has no option ...`` -> ``--passes: x{...}: pass 'x' has ...``."""
    m = re.match(rf"{re.escape(PASSES_SOURCE)}:(\d+):\s*", str(exc))
    if m is None:
        return exc
    line = int(m.group(1))
    entry = [e for start, e in entries if start <= line][-1:] or ["?"]
    return PipelineError(f"{PASSES_SOURCE}: {entry[0]}: {str(exc)[m.end():]}")


def _read_input(path: str) -> tuple[str, str]:
    from torchloom.passes.textfile import read_text_file
    if path == "-":
        return sys.stdin.read(), "<stdin>"
    return read_text_file(path, "an IR file"), path


def _line_of(exc: VerifyError, text: str) -> int:
    """The line of ``text`` that defines the node a verify error shows (its printed form
    follows the message), else 1."""
    shown = str(exc).rsplit("\n", 1)[-1].strip()
    m = re.match(r"((?:%[A-Za-z0-9_]+(?:,\s*)?)+)\s*=", shown)
    if m is None:
        return 1
    first = m.group(1).split(",")[0].strip()
    for number, line in enumerate(text.splitlines(), 1):
        if re.match(rf"\s*{re.escape(first)}\b[^=]*=", line):
            return number
    return 1


__all__ = ["add_opt_parser", "run_opt", "opt", "passes_toml", "PASSES_SOURCE"]
