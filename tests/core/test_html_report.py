"""``explain --html``: the page in a real headless Chromium (Debian's, driven through the
DevTools protocol): it loads without errors and fetches nothing, every fusion group is
drawn, clicking a group shows its kernel's source, fallbacks and declined codegens are
named, the pass timeline carries each pass's IR diff, and a 10k-node graph stays usable."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import pytest

from torchloom.cli import main
from torchloom.report.explain import explain
from torchloom.report.html_graph import GraphView
from torchloom.report.html import PassIRRecorder, render_html, write_html
from torchloom.ir.text import parse_graph

from browser import Browser, find_chromium

ROOT = Path(__file__).resolve().parents[2]
#: seconds a 10k-node page may take to load, lay out and draw (2 busy cores in CI;
#: about 2 s on a quiet machine)
BIG_PAGE_BUDGET = 60.0


@pytest.fixture(scope="session")
def browser():
    binary = find_chromium()
    if binary is None:
        pytest.fail("the HTML report tests need Chromium: apt-get install chromium "
                    "(installed automatically when running as root with apt)")
    b = Browser(binary)
    yield b
    b.close()


@pytest.fixture(scope="module")
def transformer(tmp_path_factory):
    """explain of examples/transformer_block.py (forward and backward, a shared
    subgraph) with its HTML report."""
    tmp = tmp_path_factory.mktemp("html")
    os.environ["TORCHLOOM_CACHE_DIR"] = str(tmp / "cache")
    try:
        recorder = PassIRRecorder()
        # relative to where pytest runs (the page's title shows it)
        result = explain(os.path.relpath(ROOT / "examples" / "transformer_block.py"),
                         instruments=[recorder])
        page = write_html(result, tmp / "report.html", recorder)
    finally:
        del os.environ["TORCHLOOM_CACHE_DIR"]
    return result, page, recorder


def _page_of(browser, page: Path):
    seconds = browser.open(page)
    assert browser.errors() == []
    return seconds


@pytest.mark.slow
def test_page_loads_without_errors_and_fetches_nothing(browser, transformer):
    result, page, _ = transformer
    _page_of(browser, page)
    assert browser.evaluate("performance.getEntriesByType('resource').length") == 0
    text = page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text)
    assert "default-src 'none'" in text  # the browser refuses any fetch
    title = browser.evaluate("document.title")
    assert "transformer_block.py" in title


def test_every_fusion_group_is_drawn_collapsed_and_expanded(browser, transformer):
    result, page, _ = transformer
    _page_of(browser, page)
    graphs = [c for c in result.compiler.compilations if c.fallback_reason is None]
    total = 0
    for i, comp in enumerate(graphs):
        view = GraphView(comp.graph)
        want = list(range(len(view.groups)))
        for collapse in ("true", "false"):
            drawn = browser.evaluate(f"torchloomReport.graphs[{i}].setAll({collapse}), "
                                     f"[...torchloomReport.graphs[{i}].drawnGroups()]"
                                     f".sort((a, b) => a - b)")
            assert drawn == want
        # expanded: each op of a group is drawn in the group's colour, one element per op
        per_group = browser.evaluate(
            f"(() => {{ const c = {{}}; document.querySelectorAll('#graph-{i} g.unit[data-group]')"
            f".forEach(e => {{ c[e.dataset.group] = (c[e.dataset.group] || 0) + 1; }}); return c; }})()")
        ops = {}
        for node in view.nodes:
            if node["group"] is not None:
                ops[str(node["group"])] = ops.get(str(node["group"]), 0) + 1
        assert per_group == ops
        total += len(want)
    assert total == result.data["fusion_groups"] > 0
    # the shared subgraph is boxed once per call
    boxes = browser.evaluate("document.querySelectorAll('#graph-0 rect.box').length")
    assert boxes == len(GraphView(graphs[0].graph).boxes) > 0


def _click(browser, selector: str) -> None:
    x, y = browser.evaluate(
        f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
        f" e.scrollIntoView({{block: 'center', inline: 'center'}});"
        f" const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }})()")
    for kind in ("mousePressed", "mouseReleased"):
        browser.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left",
                     clickCount=1)


def test_clicking_a_group_shows_its_kernel_source(browser, transformer):
    result, page, _ = transformer
    _page_of(browser, page)
    compiler = result.compiler
    comp = compiler.compilations[0]
    view = GraphView(comp.graph)
    codegen_of = {id(c.node): c.codegen for c in comp.compiled.choices}
    for gid in (0, len(view.groups) - 1):
        node = view.group_nodes[gid]
        source = compiler.plugins.codegen(codegen_of[id(node)]).generate(
            node, compiler.registry).source
        for collapse in ("true", "false"):
            browser.evaluate(f"torchloomReport.graphs[0].setAll({collapse})")
            _click(browser, f'#graph-0 g.unit[data-group="{gid}"]')
            shown = browser.evaluate("document.querySelector('#graph-0 .details pre.source')"
                                     ".textContent")
            assert shown == source and source.strip()
            heading = browser.evaluate("document.querySelector('#graph-0 .details h3').textContent")
            assert heading.startswith(f"group {gid}:")
            panel = browser.evaluate("document.querySelector('#graph-0 .details').innerText")
            assert "[object" not in panel
            for reason in next(c for c in comp.compiled.choices
                               if c.node is node).fallback_reasons:
                assert f"declined: {reason}" in panel
    assert browser.errors() == []


def test_kernels_fallbacks_and_declined_codegens_are_listed(browser, transformer):
    result, page, _ = transformer
    _page_of(browser, page)
    text = browser.evaluate("document.body.innerText")
    for k in result.data["kernel_details"]:
        if k["codegen"] != "aten":
            assert k["name"] in text
    for f in result.data["fallbacks"]:
        assert f["reason"].removeprefix("group on eager: ") in text
    data = browser.evaluate("torchloomReport.data")
    declined = [r for g in data["graphs"] for k in g.get("kernels", []) for r in k["declined"]]
    assert declined  # on this CPU-only machine, triton declines every group, and says why
    assert all(r in text for r in declined)
    measured = [k["ms"] for g in data["graphs"] for k in g["kernels"]]
    assert all(ms is not None and ms > 0 for ms in measured)


def test_pass_timeline_holds_every_pass_and_its_ir_diff(browser, transformer):
    result, page, recorder = transformer
    _page_of(browser, page)
    data = browser.evaluate("torchloomReport.data")
    for comp, g in zip(result.compiler.compilations, data["graphs"]):
        assert [(p["name"], p["changed"]) for p in g["passes"]] == [
            (r.name, r.changed) for r in comp.report.records]
        for p in g["passes"]:
            assert bool(p["diff"]) == p["changed"]
    # the last changed pass's diff ends in the graph as compiled
    comp, g = result.compiler.compilations[0], data["graphs"][0]
    last = [p for p in g["passes"] if p["diff"]][-1]["diff"]
    added = [ln[1:] for ln in last.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    final = str(comp.graph).splitlines()
    assert added and all(line in final for line in added)
    rows = browser.evaluate("document.querySelectorAll('#graph-0 table.passes tr').length")
    assert rows == len(g["passes"]) + 1
    browser.evaluate("(() => { const d = document.querySelector('#graph-0 table.passes details');"
                     " d.open = true; d.dispatchEvent(new Event('toggle')); })()")
    assert browser.evaluate("document.querySelectorAll('#graph-0 pre.diff span.add').length") > 0


def test_layout_puts_every_edge_downwards_and_no_two_nodes_over_each_other(browser, transformer):
    _, page, _ = transformer
    _page_of(browser, page)
    for collapse in ("true", "false"):
        bad = browser.evaluate(f"""(() => {{
            const p = torchloomReport.graphs[0]; p.setAll({collapse});
            const rects = [...document.querySelectorAll('#graph-0 g.unit > rect')].map(r => r.getBBox());
            let overlaps = 0;
            for (let i = 0; i < rects.length; i++) for (let j = i + 1; j < rects.length; j++) {{
              const a = rects[i], b = rects[j];
              if (a.x < b.x + b.width && b.x < a.x + a.width && a.y < b.y + b.height && b.y < a.y + a.height) overlaps++;
            }}
            const L = p.positions, unitOf = new Map();
            p.units.forEach((u, i) => u.nodes.forEach(n => unitOf.set(n, i)));
            let upwards = 0;
            for (const [s, t] of p.graph.edges) {{
              const a = unitOf.get(s), b = unitOf.get(t);
              if (a !== b && !(L.y[a] < L.y[b])) upwards++;
            }}
            return [overlaps, upwards];
        }})()""")
        assert bad == [0, 0]


def test_the_readme_screenshot_is_made_by_the_browser(browser, transformer, tmp_path):
    """The README's picture of the report; regenerated into docs/ with
    TORCHLOOM_UPDATE_SCREENSHOT=1."""
    _, page, _ = transformer
    _page_of(browser, page)
    browser.evaluate("torchloomReport.graphs[0].setAll(false)")
    _click(browser, '#graph-0 g.unit[data-group="0"]')
    browser.evaluate("window.scrollTo(0, 0)")
    out = (ROOT / "docs" / "images" / "report.png" if os.environ.get("TORCHLOOM_UPDATE_SCREENSHOT")
           else tmp_path / "report.png")
    out.parent.mkdir(parents=True, exist_ok=True)
    browser.screenshot(out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def _big_graph(groups: int = 2000, per_group: int = 4, between: int = 1, seed: int = 0) -> str:
    """IR text of a graph with groups * (per_group + between) ops: fusion groups of
    per_group adds, separated by standalone ops, each reading two earlier values."""
    rng = random.Random(seed)
    lines, values = ["graph @big(%x: f32[8], %y: f32[8]) {"], ["x", "y"]
    for g in range(groups):
        a, b = rng.choice(values[-50:]), rng.choice(values[-200:])
        body = [f"    %t0 = aten.add.Tensor(%in0, %in1) : f32[8]"]
        body += [f"    %t{i} = aten.mul.Tensor(%t{i - 1}, %in1) : f32[8]" for i in range(1, per_group)]
        lines.append(f"  %g{g} = torchloom.fusion_group(%{a}, %{b}) : f32[8] region "
                     f"@k{g}(%in0: f32[8], %in1: f32[8]) {{")
        lines += body + [f"    return %t{per_group - 1}", "  }"]
        values.append(f"g{g}")
        for j in range(between):
            lines.append(f"  %o{g}_{j} = aten.neg.default(%{values[-1]}) : f32[8]")
            values.append(f"o{g}_{j}")
    lines += [f"  return %{values[-1]}", "}"]
    return "\n".join(lines) + "\n"


def test_a_10k_node_graph_loads_collapsed_and_finds_nodes_in_time(browser, tmp_path):
    graph = parse_graph(_big_graph())
    view = GraphView(graph)
    ops = sum(1 for n in view.nodes if n["kind"] == "op")
    assert ops == 10_000
    data = {"summary": {"workload": "big", "pipeline": "test", "graphs": 1},
            "fallbacks": [], "notes": [], "graph_breaks": [],
            "graphs": [{"name": "big", "nodes_before": ops, "fallback": None, "compile_ms": 0,
                        "cached": False, "notes": [], "collapsed": True, "kernels": [],
                        "passes": [], **view.as_json()}]}
    page = tmp_path / "big.html"
    page.write_text(render_html(data))
    seconds = _page_of(browser, page)
    assert seconds < BIG_PAGE_BUDGET
    drawn = browser.evaluate("torchloomReport.graphs[0].drawnGroups().size")
    assert drawn == 2000
    units = browser.evaluate("document.querySelectorAll('#graph-0 g.unit').length")
    assert units == len(view.nodes) - 2000 * 3  # each group of 4 ops is one box
    # a name inside a collapsed group: found, its group opened, the node marked
    found = browser.evaluate("torchloomReport.graphs[0].search('g1234')")
    assert found == 1
    hit = browser.evaluate("document.querySelector('#graph-0 g.unit.hit').dataset.group")
    assert hit == "1234"
    assert browser.evaluate("torchloomReport.graphs[0].collapsed.has(1234)") is False
    # everything expanded: 10k ops drawn, still in time
    ms = browser.evaluate("torchloomReport.graphs[0].setAll(false), torchloomReport.graphs[0].renderMs")
    assert ms / 1e3 < BIG_PAGE_BUDGET
    assert browser.evaluate("document.querySelectorAll('#graph-0 g.unit').length") == len(view.nodes)
    assert browser.errors() == []


def test_cli_html_writes_the_page_and_rejects_a_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCHLOOM_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "gelu.html"
    assert main(["explain", str(ROOT / "examples" / "gelu_bookend.py"), "--html", str(out),
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    page = out.read_text()
    embedded = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)'
                                    r'</script>', page, re.S).group(1))
    assert embedded["summary"]["fusion_groups"] == data["fusion_groups"] == 1
    assert [p["name"] for p in embedded["graphs"][0]["passes"]] == [
        p["name"] for p in data["passes"]]
    assert main(["explain", str(ROOT / "examples" / "gelu_bookend.py"), "--html",
                 str(tmp_path)]) == 2
    assert "--html" in capsys.readouterr().err


def test_the_page_assets_ship_in_the_package():
    import fnmatch
    try:
        import tomllib
    except ModuleNotFoundError:
        import tomli as tomllib
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["torchloom"]
    assets = ROOT / "core" / "torchloom" / "report" / "assets"
    for f in assets.iterdir():
        rel = f.relative_to(ROOT / "core" / "torchloom").as_posix()
        assert any(fnmatch.fnmatch(rel, p) for p in patterns), rel
    # and the page holds each of them
    page = render_html({"summary": {}, "fallbacks": [], "notes": [], "graph_breaks": [],
                        "graphs": []})
    for name in ("report.css", "report.js"):
        first = (assets / name).read_text().splitlines()[0]
        assert first in page
    assert "/*@" not in page  # every placeholder filled
