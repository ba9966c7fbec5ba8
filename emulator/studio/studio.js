// amlemu studio: keeps the server-rendered page current from its JSON endpoints (once a second)
// and draws the metric charts as inline SVG. A job is untrusted code and it wrote the logs, file
// names and metric names: they are only ever set as text (text nodes, textContent), never as HTML.
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

  function fillBody(table, rows, empty) {
    if (!table) return;
    const columns = table.tHead.rows[0].cells.length;
    const trs = rows.length ? rows.map((cells) => el("tr", {}, cells.map((c) => el("td", {}, c))))
      : [el("tr", { class: "empty" }, el("td", { colspan: columns }, empty))];
    table.tBodies[0].replaceChildren(...trs);
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
    fillBody(document.getElementById("jobs"), d.jobs.map((j) => [jobLink(j.id), j.display_name, j.experiment,
      j.compute, status(j.status), stamp(j.created_at)]), "no jobs yet");
    fillBody(document.getElementById("faults"), d.faults.map(faultCells), "none injected");
  }

  // --- a job -------------------------------------------------------------------------------------
  const drawn = new Map(); // metric name -> the points last drawn
  function chart(name, points) {
    const W = 320, H = 120, P = 8;
    const pts = points.filter((p) => p[1] !== null);
    const plot = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `chart of ${name}` });
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
  function renderJob(d) {
    document.getElementById("status").replaceChildren(status(d.status));
    document.getElementById("job-nodes").textContent = d.nodes.join(", ");
    document.getElementById("error").textContent = d.error || "";
    fillBody(document.getElementById("events"), d.events.map((e) => [stamp(e.ts), status(e.status), e.detail]), "");
    fillBody(document.getElementById("job-faults"), d.faults.map(faultCells), "none injected");
    const job = encodeURIComponent(d.id);
    const files = d.files.map((f) => el("li", {},
      el("a", { href: `${base}/files/${job}/${f.path.split("/").map(encodeURIComponent).join("/")}`, download: "" }, f.path),
      " ", el("small", {}, size(f.size))));
    document.getElementById("files").replaceChildren(...(files.length ? files : [el("li", { class: "empty" }, "nothing yet")]));
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

  // --- polling -----------------------------------------------------------------------------------
  async function tick() {
    if (body.dataset.page === "overview") {
      renderOverview(await getJSON("/api/overview"));
      return true;
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
  if (body.dataset.page === "overview" || body.dataset.page === "job") loop();
})();
