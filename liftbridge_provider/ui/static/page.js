// The Liftbridge page: reads the plugin's JSON API and draws tables, small SVG bar charts of lag per partition,
// and SVG line charts of lag over time (the points come from the server: ui/history.py).
// Every request gives up after BROWSER_TIMEOUT_MS and says so: the page never waits without end.
"use strict";
(function () {
  const BASE = new URL("../", document.currentScript.src);
  const BROWSER_TIMEOUT_MS = 20000;
  const REFRESH_MS = 5000;
  const state = { conn: null, view: "streams", timer: null, inFlight: false };
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null) continue;
      if (key === "class") node.className = value;
      else node.setAttribute(key, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function table(headers, rows, numeric) {
    const head = el("tr", {}, ...headers.map((h) => el("th", {}, h)));
    const body = rows.map(({ cells, attrs }) =>
      el("tr", attrs, ...cells.map((c, i) => el("td", numeric.includes(i) ? { class: "num" } : {}, c))));
    return el("table", {}, el("thead", {}, head), el("tbody", {}, ...body));
  }

  async function getJson(path) {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), BROWSER_TIMEOUT_MS);
    let response;
    try {
      response = await fetch(new URL(path, BASE), { signal: controller.signal, credentials: "same-origin" });
    } catch (err) {
      if (err.name === "AbortError") throw new Error(`No answer from the API server within ${BROWSER_TIMEOUT_MS / 1000} s`);
      throw new Error(`The API server could not be reached: ${err.message}`);
    } finally {
      clearTimeout(timer);
    }
    let body = null;
    try { body = await response.json(); } catch (_) { body = null; }
    if (!response.ok) {
      const detail = body && (body.error || body.detail);
      if (response.status === 401 || response.status === 403) {
        throw new Error(`Not allowed (HTTP ${response.status}): reading connections is needed to see this page. ${detail || ""}`);
      }
      throw new Error(detail ? String(detail) : `HTTP ${response.status}`);
    }
    return body;
  }

  function showError(text) {
    const box = $("lb-error");
    box.hidden = !text;
    box.textContent = text || "";
  }

  function yesNo(flag) { return flag ? "yes" : "no"; }

  function drawStreams(data) {
    const root = $("view-streams");
    root.replaceChildren();
    const brokers = data.brokers.map((b) => `${b.id} (${b.address}, leads ${b.leads})`).join(", ");
    root.append(el("p", { class: "muted" }, `Brokers: ${brokers || "none"}`));
    for (const stream of data.streams) {
      root.append(el("h2", {}, stream.stream, el("span", { class: "muted" },
        `  subject ${stream.subject}, ${stream.partitions.length} partition(s), ${stream.messages} offset(s)`)));
      root.append(table(
        ["Partition", "Leader", "Replicas", "ISR", "High watermark", "Newest offset", "Paused", "Readonly"],
        stream.partitions.map((p) => ({
          attrs: { "data-testid": "stream-row", "data-stream": stream.stream, "data-partition": p.partition },
          cells: [p.partition, p.leader || "none", p.replicas.join(", "),
            el("span", p.under_replicated ? { class: "bad" } : {}, p.isr.join(", ")),
            p.high_watermark, p.newest_offset, yesNo(p.paused), yesNo(p.readonly)],
        })),
        [0, 4, 5],
      ));
    }
  }

  function lagChart(partitions) {
    const ns = "http://www.w3.org/2000/svg";
    const known = partitions.filter((p) => p.lag !== null);
    if (known.length < 2) return null;
    const width = Math.min(600, 14 * known.length), height = 48;
    const top = Math.max(1, ...known.map((p) => p.lag));
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("class", "lag");
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", "lag per partition");
    const step = width / known.length;
    known.forEach((p, i) => {
      const bar = document.createElementNS(ns, "rect");
      const h = Math.max(1, (p.lag / top) * (height - 2));
      bar.setAttribute("x", i * step + 1);
      bar.setAttribute("y", height - h);
      bar.setAttribute("width", Math.max(1, step - 2));
      bar.setAttribute("height", h);
      bar.setAttribute("fill", p.lag > 0 ? "#d64545" : "#3ebd93");
      const title = document.createElementNS(ns, "title");
      title.textContent = `partition ${p.partition}: lag ${p.lag}`;
      bar.append(title);
      svg.append(bar);
    });
    return svg;
  }

  function svg(tag, attrs) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
    return node;
  }

  const COLORS = ["#2680c2", "#d64545", "#3ebd93", "#f0b429", "#7b61ff", "#e668a7", "#40c3f7", "#8d6e63"];

  function historyChart(chart) {
    if (!chart) return null;
    const pad = 36, w = chart.width, h = chart.height;
    const root = svg("svg", { class: "history", width: w + pad + 4, height: h + 22, role: "img",
      "aria-label": `lag over time, ${chart.samples} sample(s)`, "data-testid": "lag-history" });
    root.append(svg("line", { x1: pad, y1: 0, x2: pad, y2: h, stroke: "#9fb3c8" }));
    root.append(svg("line", { x1: pad, y1: h, x2: pad + w, y2: h, stroke: "#9fb3c8" }));
    const top = svg("text", { x: pad - 4, y: 10, "text-anchor": "end", class: "axis" }); top.textContent = chart.top;
    const zero = svg("text", { x: pad - 4, y: h, "text-anchor": "end", class: "axis" }); zero.textContent = "0";
    const span = Math.round(chart.to - chart.from);
    const when = svg("text", { x: pad + w, y: h + 16, "text-anchor": "end", class: "axis" });
    when.textContent = `last ${span} s, ${new Date(chart.to * 1000).toLocaleTimeString()}`;
    root.append(top, zero, when);
    const plot = svg("g", { transform: `translate(${pad},0)` });
    chart.lines.forEach((line, i) => {
      const color = COLORS[i % COLORS.length];
      const poly = svg("polyline", { points: line.points, fill: "none", stroke: color, "stroke-width": 2,
        "data-partition": line.partition });
      const title = svg("title", {}); title.textContent = `partition ${line.partition}: lag ${line.lag} now`;
      poly.append(title);
      plot.append(poly);
      if (line.points.split(" ").length === 1) {
        const [x, y] = line.points.split(",");
        plot.append(svg("circle", { cx: x, cy: y, r: 3, fill: color }));
      }
    });
    root.append(plot);
    const legend = el("p", { class: "muted legend" }, "Lag over time: ",
      ...chart.lines.map((line, i) => el("span", { style: `color:${COLORS[i % COLORS.length]}` }, `■ p${line.partition} `)),
      chart.hidden ? `(${chart.hidden} partition(s) with less lag not drawn)` : "");
    return el("div", { class: "history" }, root, legend);
  }

  function drawCursors(data) {
    const root = $("view-cursors");
    root.replaceChildren();
    const cursors = data.cursors;
    if (cursors.errors.length) root.append(el("p", { class: "bad" }, `Not all of __cursors was read: ${cursors.errors.join("; ")}`));
    if (!cursors.complete && !cursors.errors.length) {
      root.append(el("p", { class: "note" }, `Only the newest ${data.bounds.cursor_scan_limit} messages of each __cursors partition were read: a cursor not written since may be missing.`));
    }
    root.append(el("p", { class: "note" }, `Lag = high watermark − cursor, per partition. Not listed: ${cursors.hidden["watcher-state"]} watcher bookkeeping and ${cursors.hidden["task-state"]} task-state cursor(s).`));
    if (!cursors.rows.length) root.append(el("p", {}, "No cursor positions found."));
    for (const row of cursors.rows) {
      root.append(el("h2", {}, `${row.cursor_id} on ${row.stream}`,
        el("span", { class: "muted" }, `  ${row.kind}, total lag ${row.total_lag}${row.stream_exists ? "" : " (stream deleted)"}`)));
      const chart = lagChart(row.partitions);
      if (chart) root.append(chart);
      const over = historyChart(row.chart);
      if (over) root.append(over);
      root.append(table(["Partition", "Cursor", "High watermark", "Lag"],
        row.partitions.map((p) => ({
          attrs: { "data-testid": "cursor-row", "data-cursor": row.cursor_id, "data-stream": row.stream, "data-partition": p.partition },
          cells: [p.partition, p.offset, p.high_watermark ?? "?", el("span", { class: p.lag ? "bad lag" : "lag" }, p.lag ?? "?")],
        })), [0, 1, 2, 3]));
    }
  }

  function drawWatchers(data) {
    const root = $("view-watchers");
    root.replaceChildren();
    const watchers = data.watchers;
    if (watchers.error) root.append(el("p", { class: "bad" }, watchers.error));
    if (!watchers.rows.length) {
      root.append(el("p", {}, "No asset watcher uses this connection (LiftbridgeMessageTrigger in an AssetWatcher)."));
      return;
    }
    root.append(table(
      ["Watcher", "Asset", "Stream", "Cursor", "Mode", "Last event", "Lag", "Dead letters", "Last refusal"],
      watchers.rows.map((w) => {
        const dl = w.dead_letters;
        const count = !w.dlq_stream ? "no dead-letter stream"
          : dl.error ? `? (${dl.error})` : `${dl.count}${dl.complete ? "" : "+"} in ${w.dlq_stream}`;
        const last = dl && dl.last ? `${dl.last.stream}/${dl.last.partition}@${dl.last.offset}: ${dl.last.error}` : "";
        return {
          attrs: { "data-testid": "watcher-row", "data-watcher": w.name },
          cells: [w.name, w.asset, w.stream_exists ? w.stream : `${w.stream} (missing)`, w.cursor_id, w.mode,
            w.last_event || "none yet", w.total_lag, el("span", dl && dl.count ? { class: "bad" } : {}, count), last],
        };
      }),
      [6],
    ));
  }

  // A range's rows: in the claim ledger's pieces (Parquet) or the table's data files (Delta, Iceberg); when a
  // table's rows could not be counted, the offsets its record holds and why.
  function rangeText(r, format) {
    const unit = format === "parquet" ? "piece(s)" : "file(s)";
    const rows = r.rows === null || r.rows === undefined
      ? `${r.offsets_held} offset(s) held${r.rows_unknown ? `, rows unknown: ${r.rows_unknown}` : ""}`
      : `${r.rows} row(s) in ${r.pieces} ${unit}`;
    return `p${r.partition} [${r.start}, ${r.end}): ${rows}${r.whole ? "" : " (not whole)"}${r.beyond ? " (pieces reach beyond)" : ""}`;
  }

  function drawRuns(data) {
    const root = $("view-runs");
    root.replaceChildren();
    root.append(el("p", { class: "note" }, `The newest ${data.bounds.runs_limit} ingest runs Airflow recorded ` +
      "(tasks whose arguments run spark_jobs/ingest.py), each range's rows from the lake's own record: " +
      "the claim ledger (Parquet), the table's data files over the offsets its record holds (Delta's " +
      "transactions, Iceberg's properties)."));
    if (!data.runs.length) { root.append(el("p", {}, "No ingest run recorded yet.")); return; }
    const ui = new URL("../", BASE);
    root.append(table(
      ["DAG", "Run", "Task", "State", "Started", "Format", "Lake", "Rows", "Ranges"],
      data.runs.map((r) => ({
        attrs: { "data-testid": "run-row", "data-dag": r.dag_id, "data-run": r.run_id },
        cells: [r.dag_id, el("a", { href: new URL(r.link.slice(1), ui).href, target: "_top" }, r.run_id), r.task_id,
          el("span", r.state === "success" ? {} : { class: "bad" }, r.state || "none"), r.started || "",
          r.format, r.lake, r.total_rows ?? "",
          r.error ? el("span", { class: "bad" }, r.error)
            : el("ul", { class: "ranges" }, ...(r.ranges || []).map((x) => el("li", { "data-testid": "run-range", "data-partition": x.partition }, rangeText(x, r.format))))],
      })),
      [7],
    ));
  }

  async function refreshRuns() {
    try {
      drawRuns(await getJson("api/runs"));
    } catch (err) {
      $("view-runs").replaceChildren(el("p", { class: "bad", role: "alert" }, `Runs: ${err.message}`));
    }
  }

  function show(view) {
    state.view = view;
    for (const tab of document.querySelectorAll("[role=tab]")) tab.setAttribute("aria-selected", String(tab.dataset.view === view));
    for (const section of document.querySelectorAll("section[data-view]")) section.hidden = section.dataset.view !== view;
    if (view === "runs") refreshRuns();
  }

  async function refresh() {
    if (!state.conn || state.inFlight) return;
    state.inFlight = true;
    const conn = state.conn;
    $("lb-status").textContent = `Asking ${conn}…`;
    try {
      const data = await getJson(`api/connections/${encodeURIComponent(conn)}`);
      if (conn !== state.conn) return;
      showError("");
      drawStreams(data);
      drawCursors(data);
      drawWatchers(data);
      if (state.view === "runs") refreshRuns();
      $("lb-status").textContent = `${data.connection.conn_id}: ${data.connection.brokers.join(", ")}` +
        `${data.connection.tls ? " (TLS)" : ""} — read at ${data.fetched_at} in ${data.elapsed_ms} ms` +
        ` (cached ${data.age_s} s; refreshed every ${REFRESH_MS / 1000} s)`;
    } catch (err) {
      if (conn !== state.conn) return;
      showError(err.message);
      $("lb-status").textContent = `${conn}: no current data (retrying every ${REFRESH_MS / 1000} s)`;
    } finally {
      state.inFlight = false;
    }
  }

  async function start() {
    for (const tab of document.querySelectorAll("[role=tab]")) tab.addEventListener("click", () => show(tab.dataset.view));
    $("lb-refresh").addEventListener("click", refresh);
    const select = $("lb-connection");
    select.addEventListener("change", () => { state.conn = select.value; refresh(); });
    let listed;
    try {
      listed = (await getJson("api/connections")).connections;
    } catch (err) {
      showError(err.message);
      $("lb-status").textContent = "";
      return;
    }
    if (!listed.length) {
      $("lb-status").textContent = "No connection of type liftbridge: add one under Admin > Connections.";
      return;
    }
    const wanted = new URLSearchParams(location.search).get("conn");
    for (const c of listed) {
      select.append(el("option", { value: c.conn_id }, c.problem ? `${c.conn_id} (unusable)` : c.conn_id));
    }
    state.conn = listed.some((c) => c.conn_id === wanted) ? wanted : listed[0].conn_id;
    select.value = state.conn;
    await refresh();
    state.timer = setInterval(refresh, REFRESH_MS);
  }

  start();
})();
