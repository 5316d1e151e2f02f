/* torchloom explain --html: draws the report from the JSON inlined in the page.
 *
 * Layout (no library, nothing loaded): longest-path layering of the drawn units (an op,
 * or a whole fusion group when it is collapsed) in Kahn's topological order, then a few
 * barycentre sweeps to order each layer, then x positions pulled towards the mean of the
 * predecessors. O((V + E) log V); a 10k-node graph lays out in well under a second.
 * window.torchloomReport exposes each graph's state, for tests and the console. */
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("report-data").textContent);
  const NODE_H = 26, LAYER_GAP = 44, NODE_GAP = 14, CHAR_W = 6.7, PAD = 24;
  const report = { graphs: [], ready: false, data: DATA };
  window.torchloomReport = report;

  function h(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "onclick") e.addEventListener("click", v);
      else if (v !== null && v !== undefined) e.setAttribute(k, v);
    }
    for (const c of children.flat()) {
      if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
    }
    return e;
  }
  const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" };
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ESC[c]);
  const colour = (gid) => `hsl(${(gid * 137.508) % 360},70%,76%)`;
  const mb = (b) => (b === null || b === undefined ? "?" : (b / 1e6).toFixed(3) + " MB");
  const shortOp = (op) => op.replace(/^aten\./, "").replace(/\.default$/, "");

  /* ---- layout ------------------------------------------------------------------- */
  function layout(widths, edges, cluster) {
    const n = widths.length, succ = [], pred = [];
    for (let i = 0; i < n; i++) { succ.push([]); pred.push([]); }
    for (const [a, b] of edges) { succ[a].push(b); pred[b].push(a); }
    const indeg = pred.map((p) => p.length), order = [], layer = new Int32Array(n);
    for (let i = 0; i < n; i++) if (indeg[i] === 0) order.push(i);
    for (let k = 0; k < order.length; k++) {
      const u = order[k];
      for (const v of succ[u]) {
        if (layer[u] + 1 > layer[v]) layer[v] = layer[u] + 1;
        if (--indeg[v] === 0) order.push(v);
      }
    }
    if (order.length < n) {  // a cycle (never in a valid graph): draw it anyway, below
      const seen = new Uint8Array(n);
      for (const u of order) seen[u] = 1;
      let deepest = 0;
      for (const u of order) deepest = Math.max(deepest, layer[u]);
      for (let i = 0; i < n; i++) if (!seen[i]) { layer[i] = deepest + 1; order.push(i); }
    }
    // a node with no more inputs than readers moves down to just above its first reader
    // (no edge gets longer in total): graph inputs and weight transposes sit by their use
    for (let k = order.length - 1; k >= 0; k--) {
      const u = order[k];
      if (!succ[u].length || pred[u].length > succ[u].length) continue;
      let first = Infinity;
      for (const v of succ[u]) first = Math.min(first, layer[v]);
      if (first - 1 > layer[u]) layer[u] = first - 1;
    }
    const sparse = [];
    for (const u of order) (sparse[layer[u]] = sparse[layer[u]] || []).push(u);
    const layers = sparse.filter((l) => l);  // no empty rows
    layers.forEach((l, li) => l.forEach((u) => { layer[u] = li; }));
    const pos = new Float64Array(n);
    const number = () => layers.forEach((l) => l.forEach((u, i) => { pos[u] = i; }));
    number();
    const sweep = (ls, nbrs) => {
      for (const l of ls) {
        const key = new Map();
        for (const u of l) {
          const ns = nbrs[u];
          let s = 0;
          for (const v of ns) s += pos[v];
          key.set(u, ns.length ? s / ns.length : pos[u]);
        }
        if (cluster) {  // the units of one box side by side, where its members average
          const sum = new Map(), cnt = new Map();
          for (const u of l) {
            const c = cluster[u];
            if (c >= 0) { sum.set(c, (sum.get(c) || 0) + key.get(u)); cnt.set(c, (cnt.get(c) || 0) + 1); }
          }
          const at = (u) => (cluster[u] >= 0 ? sum.get(cluster[u]) / cnt.get(cluster[u]) : key.get(u));
          l.sort((a, b) => at(a) - at(b) || cluster[a] - cluster[b] || key.get(a) - key.get(b));
        } else {
          l.sort((a, b) => key.get(a) - key.get(b));
        }
        l.forEach((u, i) => { pos[u] = i; });
      }
    };
    for (let it = 0; it < 4; it++) {
      sweep(layers, pred);
      sweep(layers.slice().reverse(), succ);
    }
    const x = new Float64Array(n), y = new Float64Array(n);
    let width = 0;
    layers.forEach((l, li) => {
      let right = PAD;
      for (const u of l) {
        let want = right;
        if (pred[u].length) {
          let s = 0;
          for (const v of pred[u]) s += x[v] + widths[v] / 2;
          want = s / pred[u].length - widths[u] / 2;
        }
        x[u] = Math.max(right, want);
        y[u] = PAD + li * (NODE_H + LAYER_GAP);
        right = x[u] + widths[u] + NODE_GAP;
      }
      width = Math.max(width, right);
    });
    return { x, y, layer, width: width + PAD, height: PAD * 2 + layers.length * (NODE_H + LAYER_GAP) };
  }
  report.layout = layout;

  /* ---- one graph ---------------------------------------------------------------- */
  function GraphPanel(g, index, section) {
    const panel = { graph: g, index, collapsed: new Set(), selected: null, hits: new Set() };
    const groups = g.groups || [], kernels = g.kernels || [];
    if (g.collapsed) groups.forEach((gr) => panel.collapsed.add(gr.id));
    const boxParents = (g.boxes || []).map((b) => b.parent);
    const canvas = h("div", { class: "canvas" });
    const details = h("div", { class: "details" });
    const count = h("span", { class: "muted" });
    const search = h("input", { type: "search", placeholder: "find a node by name or op",
                                "aria-label": "find a node" });
    search.addEventListener("keydown", (e) => { if (e.key === "Enter") panel.search(search.value); });
    section.append(h("div", { class: "toolbar" }, search,
      h("button", { onclick: () => panel.search(search.value) }, "find"), count,
      h("button", { onclick: () => panel.setAll(true) }, "collapse all groups"),
      h("button", { onclick: () => panel.setAll(false) }, "expand all groups")),
      h("div", { class: "canvas-row" }, canvas, details));

    panel.render = function () {
      const t0 = performance.now();
      const nodes = g.nodes, unitOf = new Int32Array(nodes.length), units = [], byGroup = new Map();
      nodes.forEach((nd, i) => {
        if (nd.group !== null && panel.collapsed.has(nd.group)) {
          if (!byGroup.has(nd.group)) { byGroup.set(nd.group, units.length); units.push({ group: nd.group, nodes: [] }); }
          unitOf[i] = byGroup.get(nd.group);
          units[unitOf[i]].nodes.push(i);
        } else {
          unitOf[i] = units.length;
          units.push({ group: nd.group, nodes: [i], node: nd });
        }
      });
      const seen = new Set(), edges = [];
      for (const [s, t] of g.edges) {
        const a = unitOf[s], b = unitOf[t], key = a * units.length + b;
        if (a !== b && !seen.has(key)) { seen.add(key); edges.push([a, b]); }
      }
      const labels = units.map((u) => u.node ? nodeLabel(u.node)
        : `group ${u.group} · ${groups[u.group].ops} ops · ${groups[u.group].codegen || "?"}`);
      const widths = labels.map((l) => Math.max(48, Math.min(320, l.length * CHAR_W + 14)));
      const cluster = units.map((u) => { const b = nodes[u.nodes[0]].box; return b === null || b === undefined ? -1 : b; });
      const L = layout(widths, edges, cluster);
      panel.positions = L;
      panel.units = units;
      const out = [];
      const frames = (key, members) => {  // bounding boxes of members by key
        const bb = new Map();
        members.forEach(([k, u]) => {
          const b = bb.get(k) || [Infinity, Infinity, -Infinity, -Infinity];
          b[0] = Math.min(b[0], L.x[u]); b[1] = Math.min(b[1], L.y[u]);
          b[2] = Math.max(b[2], L.x[u] + widths[u]); b[3] = Math.max(b[3], L.y[u] + NODE_H);
          bb.set(k, b);
        });
        return bb;
      };
      const boxMembers = [];
      units.forEach((u, i) => u.nodes.forEach((ni) => {
        for (let b = nodes[ni].box; b !== null && b !== undefined; b = boxParents[b]) boxMembers.push([b, i]);
      }));
      frames("box", boxMembers).forEach((b, bid) => {
        out.push(`<rect class="box" data-box="${bid}" x="${b[0] - 8}" y="${b[1] - 16}" width="${b[2] - b[0] + 16}" height="${b[3] - b[1] + 24}"/>`,
                 `<text class="box-label" x="${b[0] - 4}" y="${b[1] - 5}">${esc(g.boxes[bid].label.replace(/^torchloom\./, ""))}</text>`);
      });
      const groupMembers = [];
      units.forEach((u, i) => { if (u.node && u.group !== null) groupMembers.push([u.group, i]); });
      frames("group", groupMembers).forEach((b, gid) => {
        out.push(`<rect class="group-frame${panel.selected === gid ? " selected" : ""}" data-group="${gid}" x="${b[0] - 5}" y="${b[1] - 5}" width="${b[2] - b[0] + 10}" height="${b[3] - b[1] + 10}" fill="${colour(gid)}" stroke="${colour(gid)}"/>`);
      });
      for (const [a, b] of edges) {
        const x1 = L.x[a] + widths[a] / 2, y1 = L.y[a] + NODE_H, x2 = L.x[b] + widths[b] / 2, y2 = L.y[b];
        const m = (y1 + y2) / 2;
        out.push(`<path class="edge" d="M${x1} ${y1}C${x1} ${m} ${x2} ${m} ${x2} ${y2}"/>`);
      }
      units.forEach((u, i) => {
        const cls = ["unit", u.node ? u.node.kind : "collapsed"];
        if (u.group !== null) cls.push("group");
        if (u.nodes.some((ni) => panel.hits.has(ni))) cls.push("hit");
        if (u.group !== null && u.group === panel.selected) cls.push("selected");
        const fill = u.group !== null ? colour(u.group) : (u.node.kind === "op" ? "#ffffff" : "");
        const title = u.node ? `${u.node.op} ${u.node.name ? "%" + u.node.name : ""} : ${u.node.type}` : labels[i];
        out.push(`<g class="${cls.join(" ")}" data-unit="${i}"${u.group !== null ? ` data-group="${u.group}"` : ""}>` +
          `<title>${esc(title)}</title><rect x="${L.x[i]}" y="${L.y[i]}" width="${widths[i]}" height="${NODE_H}" rx="4"${fill ? ` fill="${fill}"` : ""}/>` +
          `<text x="${L.x[i] + 7}" y="${L.y[i] + 17}">${esc(labels[i])}</text></g>`);
      });
      const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="${L.width}" height="${L.height}">${out.join("")}</svg>`;
      canvas.innerHTML = svg;
      panel.renderMs = performance.now() - t0;
    };

    function nodeLabel(nd) {
      if (nd.kind === "input") return "%" + nd.op;
      if (nd.kind === "output") return "return";
      return shortOp(nd.op) + (nd.name ? " %" + nd.name.split(" ")[0] : "");
    }

    panel.drawnGroups = () => new Set(Array.from(canvas.querySelectorAll("[data-group]"),
                                                 (e) => Number(e.dataset.group)));
    panel.setAll = function (collapsed) {
      panel.collapsed = new Set(collapsed ? groups.map((gr) => gr.id) : []);
      panel.render();
    };
    panel.toggle = function (gid) {
      if (panel.collapsed.has(gid)) panel.collapsed.delete(gid); else panel.collapsed.add(gid);
      panel.render();
    };
    panel.search = function (query) {
      const q = query.trim().toLowerCase();
      panel.hits = new Set();
      if (q) g.nodes.forEach((nd, i) => {
        if ((nd.name + " " + nd.op).toLowerCase().includes(q)) panel.hits.add(i);
      });
      for (const i of panel.hits) {  // a hit inside a collapsed group: open the group
        const gid = g.nodes[i].group;
        if (gid !== null) panel.collapsed.delete(gid);
      }
      count.textContent = q ? `${panel.hits.size} match${panel.hits.size === 1 ? "" : "es"}` : "";
      panel.render();
      const first = canvas.querySelector(".unit.hit");
      if (first) first.scrollIntoView({ block: "center", inline: "center" });
      return panel.hits.size;
    };
    panel.select = function (gid) {
      panel.selected = gid;
      canvas.querySelectorAll(".selected").forEach((e) => e.classList.remove("selected"));
      canvas.querySelectorAll(`[data-group="${gid}"]`).forEach((e) => e.classList.add("selected"));
      const gr = groups[gid], k = kernels[gr.kernel] || {};
      details.replaceChildren(
        h("h3", {}, `group ${gid}: ${k.name || gr.region}`),
        h("div", {}, `${gr.ops} ops on codegen `, h("b", {}, k.codegen || "?"),
          gr.box !== null ? ` · inside ${g.boxes[gr.box].label}` : ""),
        h("div", {}, `time per call: ${k.ms === null || k.ms === undefined ? "not measured" : k.ms + " ms"}` +
          ` · read ${mb(k.bytes_read)} · written ${mb(k.bytes_written)} · compulsory ${mb(k.bytes_compulsory)}` +
          (k.grid && k.grid.length ? ` · grid [${k.grid.join(", ")}]` : "")),
        ...(k.declined || []).map((r) => h("div", { class: "reason" }, "declined: " + r)),
        h("button", { onclick: () => panel.toggle(gid) }, panel.collapsed.has(gid) ? "expand" : "collapse"),
        h("pre", { class: "source" }, k.source || ""));
    };
    canvas.addEventListener("click", (e) => {
      const t = e.target.closest("[data-group]");
      if (t) panel.select(Number(t.dataset.group));
    });
    canvas.addEventListener("dblclick", (e) => {
      const t = e.target.closest("[data-group]");
      if (t) { panel.toggle(Number(t.dataset.group)); panel.select(Number(t.dataset.group)); }
    });
    return panel;
  }

  /* ---- page --------------------------------------------------------------------- */
  function kernelTable(g, panel) {
    if (!(g.kernels || []).length) return null;
    const firstGroup = new Map();
    (g.groups || []).forEach((gr) => { if (!firstGroup.has(gr.kernel)) firstGroup.set(gr.kernel, gr.id); });
    return h("table", { class: "kernels" },
      h("tr", {}, ["kernel", "codegen", "ms/call", "read", "written", "compulsory", "declined by"].map((c) => h("th", {}, c))),
      g.kernels.map((k, i) => h("tr", { class: "clickable", onclick: () => panel.select(firstGroup.get(i)) },
        h("td", { class: "mono" }, k.name), h("td", {}, k.codegen),
        h("td", {}, k.ms === null ? "—" : k.ms), h("td", {}, mb(k.bytes_read)), h("td", {}, mb(k.bytes_written)),
        h("td", {}, mb(k.bytes_compulsory)), h("td", { class: "reason" }, (k.declined || []).join("; ")))));
  }

  function passTable(g) {
    if (!(g.passes || []).length) return null;
    const most = Math.max(1e-9, ...g.passes.map((p) => p.ms));
    return h("table", { class: "passes" },
      h("tr", {}, ["pass", "ms", "", "changed", "stats", "IR diff"].map((c) => h("th", {}, c))),
      g.passes.map((p) => {
        const stats = Object.entries(p.stats || {}).filter(([, v]) => v).map(([k, v]) => `${k}=${v}`).join(", ");
        let diffCell = h("span", { class: "muted" }, p.skipped ? "skipped: " + p.skipped
          : p.changed ? "changed (IR not kept: loaded from the compile cache)" : "no change");
        if (p.diff) {
          const pre = h("pre", { class: "diff" });
          const det = h("details", {}, h("summary", {}, `${p.diff.split("\n").length - 1} lines`), pre);
          det.addEventListener("toggle", () => {  // drawn when opened: diffs can be long
            if (!det.open || pre.childElementCount) return;
            pre.innerHTML = p.diff.split("\n").map((ln) => {
              const c = ln.startsWith("@@") ? "hunk" : ln.startsWith("+") ? "add" : ln.startsWith("-") ? "del" : "";
              return `<span class="${c}">${esc(ln)}</span>`;
            }).join("\n");
          });
          diffCell = det;
        }
        return h("tr", {}, h("td", { class: "mono" }, p.name), h("td", {}, p.ms.toFixed(2)),
          h("td", {}, h("span", { class: "bar", style: `width:${Math.max(1, 120 * p.ms / most)}px` })),
          h("td", {}, p.changed ? "changed" : "—"), h("td", { class: "mono" }, stats), h("td", {}, diffCell));
      }));
  }

  function summary() {
    const s = DATA.summary, err = s.max_abs_error;
    const head = document.getElementById("summary");
    head.append(h("h1", {}, `torchloom: ${s.workload || ""}`),
      h("div", {}, `pipeline ${s.pipeline} · ${s.graphs} graphs · ${s.fusion_groups} fusion groups · ` +
        `${s.kernels} kernels per call (${s.unique_kernels} unique) · compiled in ${s.compile_seconds} s · ` +
        (s.target ? `built for ${s.target}, nothing ran` : err === null ? "outputs differ from eager" : `max abs error ${err}, ${s.max_scaled_error} of the values' scale`)));
    if (DATA.graph_breaks.length) head.append(h("h3", {}, "graph breaks (Dynamo)"),
      h("ul", {}, DATA.graph_breaks.map((b) => h("li", { class: "reason" }, `${b.where ? b.where + ": " : ""}${b.reason}${b.count > 1 ? ` (×${b.count})` : ""}`))));
    if (DATA.fallbacks.length) head.append(h("h3", {}, "fallbacks"),
      h("ul", {}, DATA.fallbacks.map((f) => h("li", { class: "reason" }, `${f.graph}: ${f.reason}`))));
    if (DATA.notes.length) head.append(h("h3", {}, "notes"), h("ul", {}, DATA.notes.map((n) => h("li", {}, n))));
  }

  function start() {
    const t0 = performance.now();
    summary();
    const main = document.getElementById("graphs");
    DATA.graphs.forEach((g, i) => {
      const section = h("section", { class: "graph", id: `graph-${i}`, "data-graph": g.name });
      main.append(section);
      section.append(h("h2", {}, g.name),
        h("div", { class: "muted" }, `${g.nodes_before} nodes imported · compiled in ${g.compile_ms} ms` +
          (g.cached ? " · loaded from the compile cache" : "")));
      if (g.fallback) section.append(h("p", { class: "fallback" }, "ran eagerly: " + g.fallback));
      let panel = null;
      if (g.nodes) {
        panel = GraphPanel(g, i, section);
        panel.render();
        section.append(h("h3", {}, "kernels"), kernelTable(g, panel) || h("p", { class: "muted" }, "no fusion group"));
      }
      report.graphs.push(panel);
      const passes = passTable(g);
      if (passes) section.append(h("h3", {}, "passes"), passes);
    });
    report.loadMs = performance.now() - t0;
    report.ready = true;
    document.body.dataset.ready = "1";
  }
  start();
})();
