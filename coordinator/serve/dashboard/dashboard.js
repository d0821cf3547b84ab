/* shoal serve's dashboard: reads the JSON snapshots of
 * GET /v1/dashboard/events (server-sent events, about one a second) and
 * draws them. The stream is read with fetch() rather than EventSource so
 * that it can send "Authorization: Bearer KEY" when the server has an API
 * key (EventSource cannot send headers). The key comes from the page's
 * fragment (/#key=KEY, never sent to the server) or the form, and is kept
 * in sessionStorage (this tab only). No build step, no external files. */
"use strict";

const TIER_RGB = {pinned: [180, 140, 255], cache: [62, 207, 142], disk: [255, 140, 66]};
const WORKER_HUES = [210, 185, 240, 165, 265, 145];
const $ = (id) => document.getElementById(id);

let key = null;
let heatShape = "";

function keyFromPage() {
  const m = /(?:^#|&)key=([^&]+)/.exec(location.hash);
  if (m) {
    sessionStorage.setItem("shoal-key", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname);
  }
  return sessionStorage.getItem("shoal-key");
}

function fmtInt(n) { return n == null ? "-" : Math.round(n).toLocaleString("en-US"); }
function fmtRate(x) { return x > 0 ? x.toFixed(x < 10 ? 2 : 1) : "-"; }
function fmtBytes(b) {
  if (b == null) return "-";
  const u = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (b >= 1000 && i < u.length - 1) { b /= 1000; i++; }
  return (i ? b.toFixed(1) : b) + " " + u[i];
}
function fmtSecs(s) {
  if (s == null) return "-";
  if (s < 1) return Math.round(s * 1000) + " ms";
  if (s < 120) return s.toFixed(1) + " s";
  if (s < 7200) return Math.round(s / 60) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function workerRgb(x) {
  const h = WORKER_HUES[x % WORKER_HUES.length], s = 0.85, l = 0.6;
  const f = (n) => {
    const k = (n + h / 30) % 12, a = s * Math.min(l, 1 - l);
    return Math.round(255 * (l - a * Math.max(-1, Math.min(k - 3, 9 - k, 1))));
  };
  return [f(0), f(8), f(4)];
}

function cell(tag, text, cls) {
  const e = document.createElement(tag);
  e.textContent = text;
  if (cls) e.className = cls;
  return e;
}

function renderRequests(d) {
  const tb = $("requests").tBodies[0];
  tb.textContent = "";
  const rows = [];
  for (const j of d.jobs) rows.push({...j, active: true});
  for (const q of d.recent) rows.push({...q, state: q.finish, active: false});
  for (const r of rows) {
    const tr = document.createElement("tr");
    tr.dataset.id = r.id;
    tr.dataset.state = r.state;
    if (!r.active) tr.className = "done";
    tr.append(cell("td", r.id), cell("td", r.endpoint),
              cell("td", r.active ? r.state : r.state + (r.status !== 200 ? " " + r.status : ""),
                   "state-" + r.state),
              cell("td", fmtInt(r.n_prompt) + (r.n_cached ? " (" + fmtInt(r.n_cached) + ")" : "")),
              cell("td", fmtInt(r.n_gen) + (r.active && r.max_tokens ? " / " + fmtInt(r.max_tokens) : "")),
              cell("td", fmtRate(r.tok_per_s)),
              cell("td", r.active ? "" : (r.ttft_s > 0 ? fmtSecs(r.ttft_s) : "-")),
              cell("td", r.active ? fmtSecs(r.age_s) : fmtSecs(r.ago_s) + " ago"));
    tb.append(tr);
  }
  if (!rows.length) {
    const tr = document.createElement("tr");
    const td = cell("td", "no requests yet", "muted");
    td.colSpan = 8;
    tr.append(td);
    tb.append(tr);
  }
}

function renderExecutors(d) {
  const tb = $("executors").tBodies[0];
  tb.textContent = "";
  for (const x of d.executors) {
    const tr = document.createElement("tr");
    tr.dataset.address = x.address;
    tr.dataset.state = x.state;
    tr.append(cell("td", x.index), cell("td", x.address), cell("td", x.state),
              cell("td", fmtInt(x.requests)), cell("td", fmtBytes(x.bytes_sent)),
              cell("td", fmtBytes(x.bytes_received)), cell("td", fmtBytes(x.bytes_read)),
              cell("td", x.local ? "-" : (x.rtt_ms != null ? x.rtt_ms.toFixed(2) + " ms" : "-")));
    tb.append(tr);
  }
  if (!d.executors.length) {
    const tr = document.createElement("tr");
    const td = cell("td", "no expert store (a checkpoint: every expert is in RAM)", "muted");
    td.colSpan = 8;
    tr.append(td);
    tb.append(tr);
  }
}

function bar(el, parts) {
  const sum = parts.reduce((a, p) => a + Math.max(0, p.v), 0);
  el.textContent = "";
  for (const p of parts) {
    if (!(p.v > 0) || !(sum > 0)) continue;
    const s = document.createElement("div");
    s.style.width = (100 * p.v / sum) + "%";
    s.style.background = p.c;
    s.title = p.k + ": " + (100 * p.v / sum).toFixed(1) + "%";
    el.append(s);
  }
}

function renderStore(d) {
  const s = d.store;
  if (!s) {
    bar($("tiers"), []);
    $("store").textContent = "no expert store";
    return;
  }
  bar($("tiers"), [{k: "pinned", v: s.pinned, c: "var(--pinned)"},
                   {k: "cache", v: s.cache, c: "var(--cache)"},
                   {k: "disk", v: s.disk, c: "var(--disk)"}]);
  $("store").textContent = "acquires: pinned " + fmtInt(s.pinned) + ", cache " + fmtInt(s.cache) +
    ", disk " + fmtInt(s.disk) + " | read " + fmtBytes(s.bytes_read) + " (" + s.io_engine +
    ", " + s.queue_depth + " in flight) | RAM: pinned " + fmtBytes(s.pinned_bytes) +
    ", cache " + fmtBytes(s.cached_bytes) + " | stalled " + fmtSecs(s.stall_s);
}

// Where a decode step's time goes: every model has it, expert store or not
// (a checkpoint runs its experts from RAM: "experts (local)").
function renderTimings(d) {
  const t = d.timings;
  if (!t) {
    bar($("timings"), []);
    $("timings-legend").textContent = "";
    return;
  }
  const parts = [{k: "attention", v: t.attention, c: "#8a9099"},
                 {k: "routing", v: t.routing, c: "#d4b84a"},
                 {k: "experts (local)", v: Math.max(0, t.experts - t.expert_wait), c: "var(--cache)"},
                 {k: "routed experts", v: t.expert_wait - t.network, c: "var(--disk)"},
                 {k: "network", v: t.network, c: "var(--worker)"},
                 {k: "combine + head", v: t.combine + t.head, c: "#6b7380"}];
  bar($("timings"), parts);
  const total = parts.reduce((a, p) => a + Math.max(0, p.v), 0);
  $("timings-legend").textContent = total > 0 ? parts.filter((p) => p.v > 0)
    .map((p) => p.k + " " + (100 * p.v / total).toFixed(0) + "%").join(", ") : "";
}

function renderHeat(d) {
  const h = d.heat, root = $("heat");
  if (!h) {
    root.textContent = "";
    $("legend").textContent = "";
    $("heat-note").textContent = "(no expert store: every expert is in RAM)";
    return;
  }
  $("heat-note").textContent = "per layer (rows) and expert (columns); colour: the tier that " +
    "served it, brightness: recent use (half-life " + h.half_life_s + " s)";
  const shape = h.n_layer + "x" + h.n_expert;
  if (shape !== heatShape) {
    heatShape = shape;
    root.textContent = "";
    const w = Math.max(3, Math.min(28, Math.floor(1100 / h.n_expert) - 1));
    root.style.setProperty("--w", w + "px");
    root.style.setProperty("--h", Math.max(4, Math.min(22, w)) + "px");
    for (let il = 0; il < h.n_layer; il++) {
      const row = document.createElement("div");
      row.className = "row" + (h.moe[il] ? "" : " dense");
      row.dataset.layer = il;
      row.append(cell("span", il, "lbl"));
      for (let ie = 0; ie < h.n_expert; ie++) {
        const c = document.createElement("div");
        c.className = "cell";
        c.dataset.expert = ie;
        row.append(c);
      }
      root.append(row);
    }
  }
  const workers = new Map();
  for (let il = 0; il < h.n_layer; il++) {
    const row = root.children[il];
    for (let ie = 0; ie < h.n_expert; ie++) {
      const c = row.children[ie + 1];
      const lvl = h.level[il][ie], t = h.tier[il][ie];
      const name = t >= 0 ? h.tiers[t] : "";
      c.dataset.level = lvl;
      c.dataset.tier = name;
      c.dataset.total = h.total[il][ie];
      let rgb = TIER_RGB[name];
      let who = name;
      if (name === "worker" && h.worker && h.worker[il][ie] >= 0) {
        const x = h.worker[il][ie];
        rgb = workerRgb(x);
        const addr = (d.executors[x] || {}).address || "executor " + x;
        who = "worker " + addr;
        workers.set(x, addr);
      }
      c.style.background = rgb && lvl > 0
        ? "rgba(" + rgb.join(",") + "," + (0.18 + 0.82 * lvl / 100).toFixed(3) + ")" : "";
      c.title = "layer " + il + " expert " + ie + ": " + (name ? who + ", " : "") +
        "recent " + lvl + "%, " + h.total[il][ie] + " uses in all";
    }
  }
  const leg = $("legend");
  leg.textContent = "";
  for (const n of ["pinned", "cache", "disk"]) {
    const s = cell("span", n);
    s.style.setProperty("--c", "rgb(" + TIER_RGB[n].join(",") + ")");
    leg.append(s);
  }
  for (const [x, addr] of workers) {
    const s = cell("span", "worker " + addr);
    s.style.setProperty("--c", "rgb(" + workerRgb(x).join(",") + ")");
    leg.append(s);
  }
}

function render(d) {
  $("model").textContent = d.model;
  $("uptime").textContent = "up " + fmtSecs(d.uptime_s);
  const r = d.requests;
  $("c-running").textContent = r.running + " / " + r.parallel;
  $("c-queued").textContent = r.queued + (r.queue_cap ? " / " + r.queue_cap : "");
  $("c-tps").textContent = fmtRate(r.tok_per_s);
  $("c-gen").textContent = fmtInt(r.completion_tokens);
  $("c-prompt").textContent = fmtInt(r.prompt_tokens) + " (" + fmtInt(r.cached_tokens) + ")";
  $("c-http").textContent = fmtInt(r.http_total);
  renderRequests(d);
  renderExecutors(d);
  renderStore(d);
  renderTimings(d);
  renderHeat(d);
  document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
}

function setConn(up, text) {
  const c = $("conn");
  c.className = "conn " + (up ? "up" : "down");
  c.textContent = text;
}

async function connect() {
  const headers = key ? {Authorization: "Bearer " + key} : {};
  let r;
  try {
    r = await fetch("/v1/dashboard/events", {headers, cache: "no-store"});
  } catch (e) {
    setConn(false, "disconnected");
    setTimeout(connect, 2000);
    return;
  }
  if (r.status === 401) {
    setConn(false, "API key needed");
    $("keyform").hidden = false;
    return;
  }
  if (!r.ok || !r.body) {
    setConn(false, "HTTP " + r.status);
    setTimeout(connect, 2000);
    return;
  }
  $("keyform").hidden = true;
  setConn(true, "live");
  const reader = r.body.getReader(), dec = new TextDecoder();
  let buf = "";
  try {
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, i);
        buf = buf.slice(i + 2);
        for (const line of ev.split("\n"))
          if (line.startsWith("data: ")) render(JSON.parse(line.slice(6)));
      }
    }
  } catch (e) {
    /* the server went away: retry below */
  }
  setConn(false, "disconnected");
  setTimeout(connect, 2000);
}

$("keyform").addEventListener("submit", (e) => {
  e.preventDefault();
  key = $("key").value.trim();
  sessionStorage.setItem("shoal-key", key);
  connect();
});

/* a key pasted into the address bar (/#key=KEY) does not reload the page */
window.addEventListener("hashchange", () => {
  const k = keyFromPage();
  if (k && k !== key) {
    key = k;
    connect();
  }
});

key = keyFromPage();
connect();
