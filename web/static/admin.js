// The admin page: polls /admin/stats, /admin/sessions and /admin/history every 2 s and
// renders them: tables, and charts drawn as plain SVG. Rows and charts are keyed by id and
// updated in place, so a device picked for a load survives refreshes. Everything is
// written with textContent: ids, addresses and error messages come from the server and
// are never parsed as HTML.

const TOKEN_KEY = "lipstream-admin-token";
const REFRESH_MS = 2000;

const $ = (id) => document.getElementById(id);
let timer = null;
let deviceNames = [];

class NeedsToken extends Error {}

async function api(method, path, body) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    throw new NeedsToken(data?.error?.message ?? "admin access needs a valid bearer token");
  }
  if (!response.ok) {
    const message = data?.error?.message ?? `${response.status} ${response.statusText}`;
    throw new Error(`${method} ${path}: ${message}`);
  }
  return data;
}

function showError(error) {
  const box = $("error");
  box.textContent = error ? String(error.message ?? error) : "";
  box.hidden = !error;
}

function askForToken(message) {
  const form = $("token-form");
  if (form.hidden) {
    form.hidden = false;
    $("token").focus();
  }
  showError(new Error(message));
}

// -- formatting ----------------------------------------------------------------------

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
}

const number = (n, digits = 0) => (n === null || n === undefined ? "–" : n.toFixed(digits));
const percent = (fraction) => `${(fraction * 100).toFixed(0)} %`;

function duration(seconds) {
  const s = Math.floor(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  return h ? `${h} h ${m} min` : m ? `${m} min ${s % 60} s` : `${s} s`;
}

// -- tables ----------------------------------------------------------------------------

function cell(row, className) {
  const td = row.insertCell();
  if (className) td.className = className;
  return td;
}

function button(label, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.addEventListener("click", async () => {
    b.disabled = true;
    try {
      await onClick();
      showError(null);
    } catch (error) {
      if (error instanceof NeedsToken) askForToken(error.message);
      else showError(error);
    } finally {
      b.disabled = false;
      refreshSoon();
    }
  });
  return b;
}

// Make ``tbody`` hold one row per item, in order, creating rows for new keys, updating
// existing ones in place and removing the rest.
function sync(tbody, items, columns, create, update, emptyText) {
  const existing = new Map();
  for (const row of [...tbody.rows]) {
    if (row.dataset.key === undefined) row.remove();
    else existing.set(row.dataset.key, row);
  }
  let previous = null;
  for (const item of items) {
    let row = existing.get(item.id);
    existing.delete(item.id);
    if (!row) {
      row = document.createElement("tr");
      row.dataset.key = item.id;
      create(row, item);
    }
    update(row, item);
    const expected = previous ? previous.nextSibling : tbody.firstChild;
    if (row !== expected) tbody.insertBefore(row, expected);
    previous = row;
  }
  for (const row of existing.values()) row.remove();
  if (!items.length) {
    const td = cell(tbody.insertRow(), "empty");
    td.colSpan = columns;
    td.textContent = emptyText;
  }
}

function createModelRow(row, model) {
  for (const className of ["", "", "", "num", "num", "num", "num"]) cell(row, className);
  const actions = cell(row);
  const select = document.createElement("select");
  select.setAttribute("aria-label", `Device for ${model.id}`);
  actions.append(
    select,
    button("Load", async () => {
      const body = select.value === "" ? undefined : { device: Number(select.value) };
      await api("POST", `/admin/models/${encodeURIComponent(model.id)}/load`, body);
    }),
    button("Unload", () => api("POST", `/admin/models/${encodeURIComponent(model.id)}/unload`)),
  );
}

function updateModelRow(row, model) {
  const c = row.cells;
  row.dataset.state = model.state;
  c[0].textContent = model.id;
  c[1].textContent = model.state;
  c[1].title = model.last_error ?? "";
  c[2].textContent = model.device ?? "–";
  c[3].textContent = model.state === "loaded" ? bytes(model.memory_bytes) : "–";
  c[4].textContent = model.usage_count + (model.refcount ? ` (${model.refcount} held)` : "");
  c[5].textContent = model.frames;
  c[6].textContent = model.frames ? number(model.mean_inference_ms, 2) : "–";
  const select = c[7].querySelector("select");
  if (select.options.length !== deviceNames.length + 1) {
    const chosen = select.value;
    select.replaceChildren(new Option("any device", ""));
    deviceNames.forEach((name, index) => select.add(new Option(name, String(index))));
    select.value = chosen;
  }
  const [load, unload] = c[7].querySelectorAll("button");
  load.hidden = model.state === "loaded" || model.state === "loading";
  unload.hidden = model.state !== "loaded";
  select.hidden = load.hidden;
}

function createDeviceRow(row) {
  for (const className of ["", "num", "num", "num", "num", "num", "num", "num"]) {
    cell(row, className);
  }
}

function updateDeviceRow(row, device) {
  const c = row.cells;
  c[0].textContent = `${device.name} (${device.kind})`;
  c[1].textContent = device.models_loaded;
  const total = device.memory_total_bytes;
  c[2].textContent = `${bytes(device.memory_used_bytes)}${total ? ` / ${bytes(total)}` : ""}`;
  c[3].textContent = device.queue_depth;
  c[4].textContent = percent(device.busy_fraction);
  c[5].textContent = device.batches;
  c[6].textContent = number(device.mean_batch_size, 2);
  c[7].textContent = `${device.expired} / ${device.rejected}`;
}

function createSessionRow(row, session) {
  for (const className of ["", "", "", "num", "num", "", ""]) cell(row, className);
  cell(row).append(
    button("Hang up", () => api("DELETE", `/admin/sessions/${encodeURIComponent(session.id)}`)),
  );
}

function updateSessionRow(row, session) {
  const c = row.cells;
  c[0].textContent = session.id.slice(0, 10);
  c[0].title = session.id;
  c[1].textContent = session.avatar;
  c[2].textContent = `${session.state} · ${duration(session.uptime_s)}`;
  c[3].textContent = number(session.output_fps, 1);
  const delay = session.added_delay_ms;
  c[4].textContent = `${number(delay.p50)} / ${number(delay.p95)}`;
  c[5].textContent = session.remote ?? "–";
  c[6].textContent =
    `${session.kind} · ${session.viewers} · ${session.outputs}`;
}

function render(stats, sessions) {
  const g = stats.global;
  deviceNames = stats.devices.map((d) => d.name);
  const dropped = Object.values(g.frames_dropped).reduce((a, b) => a + b, 0);
  $("summary").textContent =
    `${g.models_loaded} of ${g.models_registered} models loaded · ` +
    `${g.live_sessions} live sessions (${g.sessions_started} started, ` +
    `${g.sessions_rejected} refused) · ${g.frames_served} frames served, ${dropped} dropped · ` +
    `cache hit rate ${percent(stats.cache.hit_rate)} · up ${duration(g.uptime_s)} · ` +
    `v${g.version}`;
  sync($("models"), stats.models, 8, createModelRow, updateModelRow, "No models registered");
  const devices = stats.devices.map((d) => ({ ...d, id: d.name }));
  sync($("devices"), devices, 8, createDeviceRow, updateDeviceRow, "No devices");
  sync($("sessions"), sessions.sessions, 8, createSessionRow, updateSessionRow, "No live sessions");
}


// -- charts ----------------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 300;
const HEIGHT = 80;
// Which series share a chart, per scope, and their labels (also the charts' aria-labels).
const CHARTS = {
  server: [
    { title: "sessions", series: { live_sessions: "live", speaking_sessions: "speaking" } },
    { title: "cpu ms per frame", series: { cpu_ms_per_frame: "cpu ms per frame" } },
    {
      title: "frames shared vs encoded",
      series: { shared_fps: "shared/s", encoded_fps: "encoded/s" },
    },
  ],
  device: [
    { title: "busy share", series: { busy_share: "busy share" }, max: 1 },
    { title: "queue depth", series: { queue_depth: "queue depth" } },
    { title: "mean batch", series: { mean_batch: "mean batch" } },
  ],
  session: [
    { title: "fps", series: { fps: "fps" } },
    { title: "delay p95 ms", series: { delay_p95_ms: "delay p95 ms" } },
    { title: "drops", series: { dropped: "dropped" } },
    { title: "link kbit/s", series: { link_estimate_kbps: "estimate", link_sent_kbps: "sent" } },
    { title: "link rtt ms", series: { link_rtt_ms: "rtt ms" } },
    { title: "link loss %", series: { link_loss_pct: "loss %" } },
  ],
};

const clock = (t) => new Date(t * 1000).toLocaleTimeString();

function svg(name, attributes) {
  const element = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
  return element;
}

// One chart: a line and a point per sample for each of its series, on a shared y scale
// and the history's time span. Each point carries its time and value (data-t,
// data-value) and a <title>; hovering shows #chart-tip.
function drawChart(target, spec, bySeries, span) {
  const lines = Object.entries(spec.series)
    .map(([name, label]) => ({ name, label, data: bySeries.get(name) }))
    .filter((line) => line.data);
  const values = lines.flatMap((line) => line.data.v);
  const top = Math.max(spec.max ?? 0, ...values, 1e-9);
  const x = (t) => ((t - span.from) / (span.to - span.from || 1)) * WIDTH;
  const y = (v) => HEIGHT - (v / top) * HEIGHT;
  const children = [svg("line", { class: "axis", x1: 0, y1: HEIGHT, x2: WIDTH, y2: HEIGHT })];
  lines.forEach((line, index) => {
    const { t, v } = line.data;
    const points = t.map((time, i) => `${x(time).toFixed(1)},${y(v[i]).toFixed(1)}`);
    children.push(svg("polyline", { class: `s${index}`, points: points.join(" ") }));
    t.forEach((time, i) => {
      const dot = svg("circle", {
        class: `s${index}`,
        cx: x(time).toFixed(1),
        cy: y(v[i]).toFixed(1),
        r: 3,
        "data-series": line.name,
        "data-t": String(time),
        "data-value": String(v[i]),
      });
      const title = svg("title", {});
      title.textContent = `${line.label} ${v[i]} at ${clock(time)}`;
      dot.append(title);
      children.push(dot);
    });
  });
  target.replaceChildren(...children);
  target.dataset.top = String(top);
  // The caption names each line (its colour follows its order) with its newest value,
  // and the top of the scale.
  const latest = lines.map((line, index) => {
    const value = line.data.v[line.data.v.length - 1];
    if (Object.keys(spec.series).length === 1) return String(value);
    return `${line.label} (${index ? "orange" : "blue"}) ${value}`;
  });
  const caption = target.previousElementSibling;
  const scale = `top ${+top.toFixed(3)}`;
  caption.textContent = `${spec.title}: ${latest.join(", ") || "no data"} · ${scale}`;
}

function showTip(event) {
  const dot = event.target.closest("circle[data-value]");
  const tip = $("chart-tip");
  if (!dot) {
    tip.hidden = true;
    return;
  }
  tip.textContent = dot.querySelector("title").textContent;
  tip.style.left = `${event.clientX + 12}px`;
  tip.style.top = `${event.clientY + 12}px`;
  tip.hidden = false;
}

function chartGroup(container, key, heading, scope, subject) {
  let group = container.querySelector(`:scope > [data-key="${CSS.escape(key)}"]`);
  if (!group) {
    group = document.createElement("div");
    group.className = "chart-group";
    group.dataset.key = key;
    group.setAttribute("role", "group");
    group.setAttribute("aria-label", `${scope} ${subject}`);
    group.append(document.createElement("h4"));
    for (const spec of CHARTS[scope]) {
      const figure = document.createElement("figure");
      figure.className = "chart";
      const caption = document.createElement("figcaption");
      caption.textContent = spec.title;
      const drawing = svg("svg", {
        class: "chart",
        role: "img",
        viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
        preserveAspectRatio: "none",
        "aria-label": `${scope} ${subject} ${spec.title}`,
      });
      drawing.addEventListener("mouseover", showTip);
      drawing.addEventListener("mouseleave", () => {
        $("chart-tip").hidden = true;
      });
      figure.append(caption, drawing);
      group.append(figure);
    }
    container.append(group);
  }
  group.querySelector("h4").textContent = heading;
  return group;
}

function renderCharts(history, liveIds) {
  const subjects = new Map(); // "scope subject" -> {scope, subject, series: Map(name -> {t, v})}
  let latest = 0;
  for (const s of history.series) {
    const key = `${s.scope} ${s.subject}`;
    if (!subjects.has(key)) {
      subjects.set(key, { scope: s.scope, subject: s.subject, series: new Map() });
    }
    subjects.get(key).series.set(s.name, s);
    if (s.t.length) latest = Math.max(latest, s.t[s.t.length - 1]);
  }
  const span = { from: latest - history.points * history.interval_s, to: latest };
  const containers = {
    server: $("charts-server"),
    device: $("charts-devices"),
    session: $("charts-sessions"),
  };
  const kept = new Set();
  for (const [key, { scope, subject, series }] of subjects) {
    const container = containers[scope];
    if (!container) continue;
    // Through a cluster's front, "server" is the sum and each worker's own is its name.
    let heading = subject;
    if (scope === "server") heading = subject === "server" ? "all" : `worker ${subject}`;
    if (scope === "session" && !liveIds.has(subject)) heading += " (ended)";
    const group = chartGroup(container, key, heading, scope, subject);
    group.querySelectorAll("svg.chart").forEach((drawing, index) => {
      drawChart(drawing, CHARTS[scope][index], series, span);
    });
    kept.add(group);
  }
  for (const container of Object.values(containers)) {
    for (const group of [...container.children]) if (!kept.has(group)) group.remove();
  }
}

// -- polling ---------------------------------------------------------------------------

async function refresh() {
  clearTimeout(timer);
  timer = null;
  try {
    const [stats, sessions, history] = await Promise.all([
      api("GET", "/admin/stats"),
      api("GET", "/admin/sessions"),
      api("GET", "/admin/history"),
    ]);
    render(stats, sessions);
    renderCharts(history, new Set(sessions.sessions.map((s) => s.id)));
    if ($("error").textContent.startsWith("GET ")) showError(null);
  } catch (error) {
    if (error instanceof NeedsToken) {
      askForToken(error.message);
      return; // polling resumes once a token is entered
    }
    showError(error);
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

function refreshSoon() {
  if (timer !== null) {
    clearTimeout(timer);
    timer = setTimeout(refresh, 100);
  }
}

$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("token").value);
  $("token").value = "";
  $("token-form").hidden = true;
  showError(null);
  refresh();
});

refresh();
