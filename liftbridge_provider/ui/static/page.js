// The Liftbridge page: reads the plugin's JSON API and draws tables (and small SVG bar charts) from it.
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

  function show(view) {
    state.view = view;
    for (const tab of document.querySelectorAll("[role=tab]")) tab.setAttribute("aria-selected", String(tab.dataset.view === view));
    for (const section of document.querySelectorAll("section[data-view]")) section.hidden = section.dataset.view !== view;
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
