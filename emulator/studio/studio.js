// amlemu studio: keeps the server-rendered page current from its JSON endpoints (once a second)
// and draws the metric charts, a sweep's parallel coordinates and a pipeline's graph as inline SVG. A job is untrusted
// code and it wrote the logs, file names, metric names and a sweep's values: they are only ever set
// as text (text nodes, textContent, attribute values), never as HTML.
"use strict";
(function () {
  const body = document.body;
  const base = body.dataset.base || "";
  const POLL_MS = 1000;
  const LOG_KEEP = 200000; // characters of each rank's log kept on the page
  const SVG = "http://www.w3.org/2000/svg";

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    node.append(...children.flat(Infinity).map((c) => (c instanceof Node ? c : String(c ?? ""))));
    return node;
  }
  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    return node;
  }
  const pad = (n) => String(n).padStart(2, "0");
  function stamp(ts) {
    if (!ts) return "";
    const d = new Date(ts * 1000);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }
  const jobLink = (id) => (id ? el("a", { href: `${base}/jobs/${encodeURIComponent(id)}` }, id) : "");
  const status = (s) => el("span", { class: `status s-${s}` }, s);
  const num = (v) => (Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3) : String(+v.toFixed(4)));
  function size(n) {
    const units = ["B", "KB", "MB", "GB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return i ? `${n.toFixed(1)} ${units[i]}` : `${n} B`;
  }
  const faultCells = (f) => [stamp(f.ts), f.kind, f.cluster, f.node, jobLink(f.run_id), f.detail];

  function fillRows(table, trs, empty) {
    if (!table) return;
    const columns = table.tHead.rows[0].cells.length;
    table.tBodies[0].replaceChildren(...(trs.length ? trs
      : [el("tr", { class: "empty" }, el("td", { colspan: columns }, empty))]));
  }
  function fillBody(table, rows, empty) {
    fillRows(table, rows.map((cells) => el("tr", {}, cells.map((c) => el("td", {}, c)))), empty);
  }
  function table(heads) {
    return el("table", {}, el("thead", {}, el("tr", {}, heads.map((h) => el("th", {}, h)))), el("tbody"));
  }
  function live(ok, text) {
    const badge = document.getElementById("live");
    badge.className = ok ? "live" : "live off";
    badge.textContent = text;
  }
  async function getJSON(path) {
    const response = await fetch(base + path, { cache: "no-store" });
    if (response.status === 401) throw Object.assign(new Error("logged out"), { loggedOut: true });
    if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
    return response.json();
  }

  // --- the overview ------------------------------------------------------------------------------
  function renderOverview(d) {
    const blocks = d.computes.flatMap((c) => {
      const nodes = table(["node", "state", "job", "address"]);
      fillBody(nodes, c.nodes.map((n) => [n.name,
        [el("span", { class: `node n-${n.state}` }, n.state), n.fault ? [" ", el("span", { class: "fault" }, n.fault)] : []],
        jobLink(n.run), n.address ?? ""]), "no nodes: scaled down");
      const title = el("h3", {}, `${c.name} `, el("small", {},
        `${c.vm_size}, ${c.priority}, ${c.min_nodes}-${c.max_nodes} nodes, ${c.backend}`));
      return [title, nodes];
    });
    document.getElementById("computes").replaceChildren(...(blocks.length ? blocks
      : [el("p", { class: "empty" }, "No computes: ", el("code", {}, "amlemu compute create"))]));
    fillRows(document.getElementById("jobs"), d.jobs.flatMap(jobRows), "no jobs yet");
    fillBody(document.getElementById("faults"), d.faults.map(faultCells), "none injected");
  }

  // A top-level job's row, then a sweep's trials nested under it (as Azure ML studio lists child jobs).
  const nest = () => el("span", { class: "nest" }, "\u21b3 ");
  function jobRow(j, kind, trial) {
    const cells = [[trial ? nest() : "", jobLink(j.id)], kind, j.display_name, j.experiment, j.compute,
      status(j.status), stamp(j.created_at)];
    return el("tr", trial ? { class: "trial" } : {}, cells.map((c) => el("td", {}, c)));
  }
  function jobRows(j) {
    const trials = j.trials || [];
    const child = j.type === "pipeline" ? "step" : "trial";
    const rows = [jobRow(j, j.type, false), ...trials.map((t) => jobRow(t, child, true))];
    const more = (j.trials_total || 0) - trials.length;
    if (more > 0) {
      rows.push(el("tr", { class: "trial more" }, el("td", { colspan: 7 }, nest(),
        `${more} more ${child}s on the page of ${j.type} `, jobLink(j.id))));
    }
    return rows;
  }

  // --- a job -------------------------------------------------------------------------------------
  const drawn = new Map(); // metric name -> the points last drawn
  function chart(name, points) {
    const W = 320, H = 120, P = 8;
    const pts = points.filter((p) => p[1] !== null);
    const plot = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": `chart of ${name}` });
    const last = pts[pts.length - 1];
    if (pts.length) {
      const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
      const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
      const sx = (x) => P + (x1 === x0 ? (W - 2 * P) / 2 : ((x - x0) / (x1 - x0)) * (W - 2 * P));
      const sy = (y) => H - P - (y1 === y0 ? (H - 2 * P) / 2 : ((y - y0) / (y1 - y0)) * (H - 2 * P));
      plot.append(svg("polyline", { points: pts.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ") }));
      for (const p of pts.length <= 30 ? pts : [last]) plot.append(svg("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5 }));
      const top = svg("text", { x: 2, y: 10 }), bottom = svg("text", { x: 2, y: H - 2 });
      top.textContent = num(y1);
      bottom.textContent = num(y0);
      plot.append(top, bottom);
    }
    return el("figure", { class: "chart", "data-metric": name },
      el("figcaption", {}, name, el("span", { class: "last" }, last ? ` ${num(last[1])} at step ${last[0]}` : " no finite value")),
      plot);
  }
  function renderMetrics(metrics) {
    const box = document.getElementById("metrics");
    for (const [name, points] of Object.entries(metrics)) {
      const key = JSON.stringify(points);
      if (drawn.get(name) === key) continue;
      const fresh = chart(name, points);
      const old = [...box.children].find((c) => c.dataset.metric === name);
      if (old) old.replaceWith(fresh);
      else {
        if (!drawn.size) box.replaceChildren();
        box.append(fresh);
      }
      drawn.set(name, key);
    }
  }
  function renderFiles(d) {
    const job = encodeURIComponent(d.id);
    const files = d.files.map((f) => el("li", {},
      el("a", { href: `${base}/files/${job}/${f.path.split("/").map(encodeURIComponent).join("/")}`, download: "" }, f.path),
      " ", el("small", {}, size(f.size))));
    document.getElementById("files").replaceChildren(...(files.length ? files : [el("li", { class: "empty" }, "nothing yet")]));
  }
  function renderJob(d) {
    document.getElementById("status").replaceChildren(status(d.status));
    document.getElementById("job-nodes").textContent = d.nodes.join(", ");
    document.getElementById("error").textContent = d.error || "";
    fillBody(document.getElementById("events"), d.events.map((e) => [stamp(e.ts), status(e.status), e.detail]), "");
    fillBody(document.getElementById("job-faults"), d.faults.map(faultCells), "none injected");
    renderFiles(d);
    if (d.metrics) renderMetrics(d.metrics); // null: unreadable this once, the charts stay
  }
  async function pollLog(pre) {
    const chunk = await getJSON(`/api/jobs/${encodeURIComponent(body.dataset.job)}/logs/${pre.dataset.rank}?offset=${pre.dataset.offset}`);
    if (chunk.text) {
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.append(chunk.text);
      if (pre.textContent.length > LOG_KEEP) pre.textContent = pre.textContent.slice(-LOG_KEEP / 2);
      if (atBottom) pre.scrollTop = pre.scrollHeight;
    }
    pre.dataset.offset = chunk.offset;
    return chunk.terminal && chunk.offset >= chunk.size; // nothing more will come
  }

  // --- a sweep: its trials table and a parallel-coordinates chart of hyperparameters and metric --
  const show = (v) => (v === null || v === undefined ? "" : typeof v === "number" ? num(v) : String(v));
  function trialCells(t, d) {
    const name = [jobLink(t.name), t.best ? [" ", el("span", { class: "best-mark" }, "best")] : []];
    return [name, status(t.status), ...d.params.map((p) => show(t.values[p])), show(t.metric), show(t.reports),
      t.reason || ""];
  }
  function renderTrials(d) {
    const trials = document.getElementById("trials");
    const heads = ["trial", "status", ...d.params, d.primary_metric || "primary metric", "reports", "reason"];
    const headRow = trials.tHead.rows[0];
    if ([...headRow.cells].map((c) => c.textContent).join("\n") !== heads.join("\n")) {
      headRow.replaceChildren(...heads.map((h) => el("th", {}, h)));
    }
    fillRows(trials, d.trials.map((t) => {
      const attrs = t.best ? { class: "best", "data-trial": t.name } : { "data-trial": t.name };
      return el("tr", attrs, trialCells(t, d).map((c) => el("td", {}, c)));
    }), "no trial yet");
  }
  // One axis per hyperparameter, then the primary metric's. A numeric axis is linear (logarithmic
  // when its values are positive and span 100x or more), any other is a category per value.
  function axis(name, values) {
    const known = values.filter((v) => v !== null && v !== undefined);
    if (known.length && known.every((v) => typeof v === "number")) {
      const lo = Math.min(...known), hi = Math.max(...known);
      const log = lo > 0 && hi / lo >= 100;
      const f = log ? Math.log10 : (v) => v;
      const span = f(hi) - f(lo);
      return { name, labels: [[1, num(hi)], [0, num(lo)]], log,
        at: (v) => (typeof v !== "number" ? null : span ? (f(v) - f(lo)) / span : 0.5) };
    }
    const cats = [...new Set(known.map(String))].sort();
    const at = (v) => (v === null || v === undefined ? null : cats.length > 1 ? 1 - cats.indexOf(String(v)) / (cats.length - 1) : 0.5);
    return { name, labels: cats.slice(0, 12).map((c) => [at(c), c]), log: false, at };
  }
  function sweepChart(d) {
    const axes = d.params.map((p) => axis(p, d.trials.map((t) => t.values[p])));
    axes.push(axis(`${d.primary_metric} (${d.goal})`, d.trials.map((t) => t.metric)));
    const metric = axes[axes.length - 1];
    const W = Math.max(420, 150 * axes.length), H = 280, L = 60, R = 60, T = 34, B = 24;
    const x = (i) => L + (axes.length > 1 ? (i * (W - L - R)) / (axes.length - 1) : (W - L - R) / 2);
    const y = (u) => T + (1 - u) * (H - T - B);
    const plot = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
      "aria-label": `parallel coordinates of the hyperparameters and ${d.primary_metric}` });
    axes.forEach((a, i) => {
      plot.append(svg("line", { class: "axis", x1: x(i), x2: x(i), y1: y(1), y2: y(0) }));
      const title = svg("text", { class: "axis-name", x: x(i), y: 14, "text-anchor": "middle" });
      title.textContent = a.log ? `${a.name} (log)` : a.name;
      plot.append(title);
      for (const [u, label] of a.labels) {
        const tick = svg("text", { x: x(i) + 4, y: y(u) + 3 });
        tick.textContent = label;
        plot.append(tick);
      }
    });
    const good = d.goal === "minimize" ? (u) => 1 - u : (u) => u; // 1: the best end of the metric axis
    const ordered = [...d.trials].sort((a, b) => Number(a.best) - Number(b.best)); // the best one on top
    for (const t of ordered) {
      const us = axes.map((a, i) => a.at(i === axes.length - 1 ? t.metric : t.values[a.name]));
      const points = us.map((u, i) => (u === null ? null : `${x(i).toFixed(1)},${y(u).toFixed(1)}`)).filter(Boolean);
      if (points.length < 1) continue;
      const scored = us[us.length - 1] !== null;
      const shade = scored ? good(us[us.length - 1]) : 0;
      const line = svg("polyline", { points: points.join(" "), "data-trial": t.name,
        class: t.best ? "trial best" : scored ? "trial" : "trial unscored",
        stroke: t.best ? "#e65100" : scored ? `hsl(212, 70%, ${75 - 45 * shade}%)` : "#9e9e9e" });
      const tip = svg("title");
      tip.textContent = `${t.name} (${t.status}): ` + d.params.map((p) => `${p}=${show(t.values[p])}`).join(", ") +
        `; ${d.primary_metric}=${scored ? show(t.metric) : "not logged"}`;
      line.append(tip);
      plot.append(line);
    }
    return el("figure", { class: "sweep-chart" }, plot, el("figcaption", {},
      `${d.trials.length} trial(s); darker: better ${metric.name}; orange: the best; grey: no ${d.primary_metric} yet`));
  }
  let sweepDrawn = "";
  function renderSweep(d) {
    document.getElementById("status").replaceChildren(status(d.status));
    document.getElementById("error").textContent = d.error || "";
    document.getElementById("headline").textContent = d.headline;
    document.getElementById("notes").replaceChildren(...d.notes.map((n) => el("li", {}, n)));
    const key = JSON.stringify([d.params, d.trials, d.primary_metric, d.goal]);
    if (key !== sweepDrawn) { // the table and chart redrawn only when a trial changed
      renderTrials(d);
      document.getElementById("sweep-chart").replaceChildren(d.trials.length ? sweepChart(d)
        : el("p", { class: "empty" }, "no trial yet"));
      sweepDrawn = key;
    }
    fillBody(document.getElementById("events"), d.events.map((e) => [stamp(e.ts), status(e.status), e.detail]), "");
    renderFiles(d);
  }

  // --- a pipeline: a box per step in columns by depth, an arrow per data edge, recoloured live -----
  const BOX = { w: 210, h: 66, gapX: 150, gapY: 30, margin: 16 };
  const clip = (s, n) => (s.length > n ? `${s.slice(0, n - 1)}\u2026` : s);
  function svgText(attrs, text) {
    const node = svg("text", attrs);
    node.textContent = text;
    return node;
  }
  function stepBox(s, at) {
    const cls = ["step", `s-${s.status}`, s.reused_from ? "reused" : "", s.not_run ? "not-run" : ""];
    const box = svg("g", { class: cls.filter(Boolean).join(" "), "data-step": s.step, "data-status": s.status,
      transform: `translate(${at.x},${at.y})` });
    const tip = svg("title");
    tip.textContent = [`${s.step} (${s.type}): ${s.status}`, s.reused_from ? `reused ${s.reused_from}` : "", s.detail]
      .filter(Boolean).join("\n");
    box.append(tip, svg("rect", { class: "box", width: BOX.w, height: BOX.h, rx: 6 }),
      svgText({ class: "step-name", x: 10, y: 19 }, clip(s.step, s.reused_from ? 20 : 28)),
      svgText({ class: "step-status", x: 10, y: 37 }, (s.not_run ? `not run (${s.status})` : s.status) +
        (s.type === "sweep" ? ", a sweep" : "")));
    if (s.child_job) {
      const link = svg("a", { class: "child-link", href: `${base}/jobs/${encodeURIComponent(s.child_job)}` });
      link.append(svgText({ x: 10, y: 56 }, clip(s.child_job, 32)));
      box.append(link);
    }
    if (s.reused_from) {
      box.append(svg("rect", { class: "reused-mark", x: BOX.w - 60, y: 7, width: 52, height: 16, rx: 4 }),
        svgText({ class: "reused-mark", x: BOX.w - 34, y: 19, "text-anchor": "middle" }, "reused"));
    }
    return box;
  }
  // Where each arrow leaves and enters its boxes: spread down the box's side in the order of the other
  // ends; an arrow in gets room for the lines of its label (stacked above it).
  function ports(pairs, at) {
    for (const [end, other] of [["from", "to"], ["to", "from"]]) {
      const byBox = new Map();
      for (const p of pairs) byBox.set(p[end], [...(byBox.get(p[end]) || []), p]);
      for (const [name, list] of byBox) {
        list.sort((a, b) => at.get(a[other]).y - at.get(b[other]).y || at.get(a[other]).x - at.get(b[other]).x);
        const room = list.map((p) => (end === "to" ? p.labels.length : 1));
        const total = room.reduce((x, y) => x + y, 1);
        let used = 0;
        list.forEach((p, i) => {
          used += room[i];
          p[`${end}Y`] = at.get(name).y + (BOX.h * used) / total;
        });
      }
    }
  }
  // An arrow to the next column is one curve; one that skips columns runs along the gap between two
  // rows (no box is there), so that it never crosses a box.
  function edgePath(a, b, y1, y2) {
    const x1 = a.x + BOX.w, x2 = b.x - 2, half = BOX.gapX / 2;
    if (b.x - a.x <= BOX.w + BOX.gapX + 1) return `M${x1},${y1} C${x1 + half},${y1} ${x2 - half},${y2} ${x2},${y2}`;
    const lane = b.y > a.y ? a.y + BOX.h + BOX.gapY / 2 : a.y - BOX.gapY / 2;
    const xa = x1 + BOX.gapX, xb = x2 - BOX.gapX;
    return `M${x1},${y1} C${x1 + half},${y1} ${x1 + half},${lane} ${xa},${lane} L${xb},${lane} ` +
      `C${xb + half},${lane} ${xb + half},${y2} ${x2},${y2}`;
  }
  function edgeLines(d, at) { // one arrow per pair of steps, labelled with each output -> input it carries
    const pairs = new Map();
    for (const e of d.edges) {
      if (!at.has(e.from) || !at.has(e.to)) continue;
      const key = JSON.stringify([e.from, e.to]);
      if (!pairs.has(key)) pairs.set(key, { from: e.from, to: e.to, labels: [] });
      pairs.get(key).labels.push(clip(`${e.output} \u2192 ${e.input}`, 24));
    }
    ports([...pairs.values()], at);
    return [...pairs.values()].flatMap((p) => {
      const path = svg("path", { class: "edge", "data-from": p.from, "data-to": p.to, "marker-end": "url(#arrow)",
        d: edgePath(at.get(p.from), at.get(p.to), p.fromY, p.toY) });
      const label = svg("text", { class: "edge-label", "data-from": p.from, "data-to": p.to, "text-anchor": "end" });
      p.labels.forEach((text, i) => { // above the arrow's end, the last binding nearest it
        const line = svg("tspan", { x: at.get(p.to).x - 8, y: p.toY - 4 - 12 * (p.labels.length - 1 - i) });
        line.textContent = text;
        label.append(line);
      });
      return [path, label];
    });
  }
  function pipelineGraph(d) {
    const at = new Map();
    d.layers.forEach((column, i) => column.forEach((name, j) =>
      at.set(name, { x: BOX.margin + i * (BOX.w + BOX.gapX), y: BOX.margin + 12 + j * (BOX.h + BOX.gapY) })));
    const rows = Math.max(1, ...d.layers.map((c) => c.length));
    const W = 2 * BOX.margin + d.layers.length * BOX.w + (d.layers.length - 1) * BOX.gapX;
    const H = 2 * BOX.margin + 12 + rows * BOX.h + (rows - 1) * BOX.gapY;
    const plot = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
      "aria-label": "the pipeline's steps and the data passed between them" });
    const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 8,
      markerHeight: 8, orient: "auto" });
    marker.append(svg("path", { d: "M0,0 L10,5 L0,10 z" }));
    const defs = svg("defs");
    defs.append(marker);
    plot.append(defs, ...edgeLines(d, at));
    for (const s of d.steps) if (at.has(s.step)) plot.append(stepBox(s, at.get(s.step)));
    return el("figure", { class: "pipeline-chart" }, plot, el("figcaption", {},
      "each box a step and its child job; an arrow: an output of one step read by another, output \u2192 input"));
  }
  let pipelineDrawn = "";
  function renderPipeline(d) {
    document.getElementById("status").replaceChildren(status(d.status));
    document.getElementById("error").textContent = d.error || "";
    document.getElementById("step-counts").textContent =
      Object.entries(d.counts).map(([s, n]) => `${n} ${s}`).join(", ") || "no steps";
    const key = JSON.stringify([d.steps, d.edges, d.layers]);
    if (key !== pipelineDrawn) { // the graph and table redrawn only when a step changed
      fillRows(document.getElementById("steps"), d.steps.map((s) => el("tr", { "data-step": s.step },
        [s.step, jobLink(s.child_job), status(s.status), jobLink(s.reused_from), s.detail].map((c) => el("td", {}, c)))),
      "no steps");
      document.getElementById("pipeline-graph").replaceChildren(d.steps.length ? pipelineGraph(d)
        : el("p", { class: "empty" }, "no steps"));
      pipelineDrawn = key;
    }
    fillBody(document.getElementById("events"), d.events.map((e) => [stamp(e.ts), status(e.status), e.detail]), "");
    renderFiles(d);
  }

  // --- polling -----------------------------------------------------------------------------------
  async function tick() {
    if (body.dataset.page === "overview") {
      renderOverview(await getJSON("/api/overview"));
      return true;
    }
    if (body.dataset.page === "sweep") {
      const sweep = await getJSON(`/api/sweeps/${encodeURIComponent(body.dataset.job)}`);
      renderSweep(sweep);
      return !sweep.terminal;
    }
    if (body.dataset.page === "pipeline") {
      const pipeline = await getJSON(`/api/pipelines/${encodeURIComponent(body.dataset.job)}`);
      renderPipeline(pipeline);
      return !pipeline.terminal;
    }
    const job = await getJSON(`/api/jobs/${encodeURIComponent(body.dataset.job)}`);
    renderJob(job);
    const done = await Promise.all([...document.querySelectorAll("pre.log")].map(pollLog));
    return !(job.terminal && done.every(Boolean));
  }
  async function loop() {
    let again = true;
    try {
      again = await tick();
      live(true, again ? "live" : "final");
    } catch (err) {
      if (err.loggedOut) { // the session expired: polling again cannot help, a new login link can
        live(false, "logged out: `amlemu ui --link` gives a login link");
        return;
      }
      live(false, "offline, retrying");
    }
    if (again) setTimeout(loop, POLL_MS);
  }
  if (["overview", "job", "sweep", "pipeline"].includes(body.dataset.page)) loop();
})();
