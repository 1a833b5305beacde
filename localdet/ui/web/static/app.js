// The dashboard's one script: routes by path, fetches the JSON API, renders, and polls
// every REFRESH_MS so running experiments update without a reload.
"use strict";

const REFRESH_MS = 2000;
const main = document.getElementById("main");
const sorting = {};   // table id -> {key, desc}: kept across refreshes
let timer = null;

const esc = (value) => String(value ?? "").replace(/[&<>"']/g,
  (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const num = (v) => (typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toPrecision(4)) : (v ?? ""));
const state = (s) => `<span class="state ${esc(s)}">${esc(s)}</span>`;
const when = (iso) => (iso ? new Date(iso).toLocaleString() : "");

function duration(start, end) {
  if (!start) return "";
  const seconds = Math.max(0, ((end ? new Date(end) : new Date()) - new Date(start)) / 1000);
  const h = Math.floor(seconds / 3600), m = Math.floor((seconds % 3600) / 60);
  return h ? `${h}h ${m}m` : m ? `${m}m ${Math.floor(seconds % 60)}s` : `${Math.floor(seconds)}s`;
}

function flat(object, prefix = "") {
  const out = {};
  for (const [k, v] of Object.entries(object || {})) {
    if (v && typeof v === "object" && !Array.isArray(v)) Object.assign(out, flat(v, `${prefix}${k}.`));
    else out[`${prefix}${k}`] = v;
  }
  return out;
}

async function getJSON(url, options) {
  const response = await fetch(url, options);
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
  return body;
}

// A table whose columns sort on click: columns = [{key, label, value(row), html(row)}].
function table(id, columns, rows, rowAttrs = () => "") {
  const sort = sorting[id];
  if (sort) {
    const column = columns.find((c) => c.key === sort.key);
    if (column) {
      const value = column.value || ((r) => r[column.key]);
      rows = [...rows].sort((a, b) => {
        const x = value(a), y = value(b);
        const order = x === y ? 0 : x === undefined || x === null || x === "" ? 1
          : y === undefined || y === null || y === "" ? -1 : x < y ? -1 : 1;
        return sort.desc ? -order : order;
      });
    }
  }
  const head = columns.map((c) => {
    const cls = sort && sort.key === c.key ? `sortable sorted${sort.desc ? " desc" : ""}` : "sortable";
    return `<th class="${cls}" data-table="${id}" data-key="${esc(c.key)}">${esc(c.label)}</th>`;
  }).join("");
  const body = rows.map((r) => `<tr ${rowAttrs(r)}>${columns.map((c) =>
    `<td>${c.html ? c.html(r) : esc(num((c.value || ((x) => x[c.key]))(r)))}</td>`).join("")}</tr>`).join("");
  return `<div class="scroll"><table id="${id}"><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table></div>`;
}

document.addEventListener("click", (event) => {
  const th = event.target.closest("th.sortable");
  if (th) {
    const id = th.dataset.table, key = th.dataset.key, current = sorting[id];
    sorting[id] = {key, desc: current && current.key === key ? !current.desc : false};
    refresh();
    return;
  }
  const row = event.target.closest("tr[data-href]");
  if (row && !event.target.closest("a, input")) go(row.dataset.href);
  const link = event.target.closest("a[data-nav]");
  if (link) { event.preventDefault(); go(link.getAttribute("href")); }
});

function go(path) { history.pushState({}, "", path); render(); }
window.addEventListener("popstate", render);

// A page's fixed frame, made once per path: refreshes fill its parts, so that the charts
// (zoom included), the open <details> and the last action's message survive them.
// Returns whether it was made now (a form's fields are filled then, not on each refresh).
function frame(html, key = location.pathname) {
  if (main.dataset.path === key) return false;
  main.innerHTML = html;
  main.dataset.path = key;
  return true;
}
const fill = (id, html) => { document.getElementById(id).innerHTML = html; };

// A chart is drawn again only when its figure changed: plotly redraws every trace, which
// for a search of 1,000 trials held the page for a second or more at each refresh.
function chart(id, figure) {
  const element = document.getElementById(id);
  if (!element || !figure) return;
  const text = JSON.stringify(figure);
  if (element.drawnFigure === text) return;
  element.drawnFigure = text;
  Plotly.react(element, figure.data || [], figure.layout || {}, {responsive: true, displaylogo: false});
}

// The learning curves as the server thinned them for drawing (a bounded number of points per
// series, the best trials of a large search), or every point of them once asked: then the
// page's refreshes leave that chart alone until asked back.
const everyPoint = new Set();  // page paths whose curves show every point

function curves(drawn, figure) {
  const path = location.pathname;
  if (!everyPoint.has(path)) chart("curves", figure);
  const note = document.getElementById("curves-note");
  if (!note || !drawn) return;
  const which = drawn.of > drawn.trials.length ? `${drawn.trials.length} of ${drawn.of} trials drawn ` +
    "(the best by the searcher metric, and those running)" : "";
  const thinned = figure && figure.thinned ? `each series thinned to at most ${drawn.points_per_series} points (the lowest and highest of each stretch kept)` : "";
  note.innerHTML = everyPoint.has(path)
    ? `Every point drawn. <a href="#" id="curves-thinned">Back to the thinned curves</a>`
    : `${esc([which, thinned].filter(Boolean).join("; "))}
       ${thinned ? `<a href="#" id="curves-full" data-url="${esc(drawn.full)}">Draw every point</a>` : ""}
       ${drawn.of > drawn.trials.length ? ` · <a href="${esc(drawn.all_trials)}" id="curves-all">every trial's points (JSON)</a>` : ""}`;
}

document.addEventListener("click", async (event) => {
  const full = event.target.closest("#curves-full"), thinned = event.target.closest("#curves-thinned");
  if (!full && !thinned) return;
  event.preventDefault();
  if (thinned) { everyPoint.delete(location.pathname); refresh(); return; }
  const path = location.pathname;
  const body = await getJSON(full.dataset.url);
  if (location.pathname !== path) return;
  everyPoint.add(path);
  chart("curves", body.curves);
  curves(body.curves_drawn, null);
});

// -- pages ----------------------------------------------------------------------------------
async function experimentsPage() {
  const params = new URLSearchParams(location.search);
  const archived = params.get("archived") === "1";
  const labels = params.getAll("label");
  const experiments = await getJSON(`/api/experiments${location.search}`);
  const columns = [
    {key: "choose", label: "", value: (e) => chosen.has(String(e.id)), html: chooseBox},
    {key: "id", label: "ID"},
    {key: "name", label: "Name", html: (e) => `${esc(e.name)}${origin(e)}${e.archived ? ' <span class="badge">archived</span>' : ""}`},
    {key: "labels", label: "Labels", value: (e) => (e.labels || []).join(", "), html: (e) => labelLinks(e.labels)},
    {key: "state", label: "State", html: (e) => state(e.state)},
    {key: "searcher", label: "Searcher"},
    {key: "progress", label: "Progress", html: (e) =>
      `<span class="bar"><span style="width:${Math.round(100 * (e.progress || 0))}%"></span></span>${Math.round(100 * (e.progress || 0))}%`},
    {key: "best_metric", label: "Best metric", html: (e) =>
      e.best_metric === null ? "" : `${esc(e.metric)} ${esc(num(e.best_metric))}`},
    {key: "num_trials", label: "Trials"},
    {key: "submitted_at", label: "Started", value: (e) => e.submitted_at, html: (e) => esc(when(e.submitted_at))},
    {key: "duration", label: "Duration", value: (e) => new Date(e.ended_at || Date.now()) - new Date(e.submitted_at),
      html: (e) => esc(duration(e.submitted_at, e.ended_at))},
  ];
  if (!sorting.experiments) sorting.experiments = {key: "id", desc: true};
  // The filters are links and a form: the address says what is shown, so it can be kept.
  const toggled = new URLSearchParams(params);
  if (archived) toggled.delete("archived"); else toggled.set("archived", "1");
  const unlabelled = new URLSearchParams(params);
  unlabelled.delete("label");
  frame(`<h1>Experiments</h1><span id="message"></span>
    <form id="filters" class="filters">
      <label>Label <input id="label-filter" name="label" value="${esc(labels.join(", "))}" placeholder="any"></label>
      <button type="submit">Filter</button>
      ${labels.length ? `<a data-nav id="clear-label" href="/${unlabelled.toString() ? `?${unlabelled}` : ""}">all labels</a>` : ""}
      <a data-nav id="archived-toggle" href="/${toggled.toString() ? `?${toggled}` : ""}">${archived ? "Hide archived" : "Show archived"}</a>
      <button type="button" id="compare" disabled title="tick two or more experiments">Compare</button>
    </form><div id="list"></div>`, location.pathname + location.search);
  showFlash();
  const filtered = labels.length ? ` labelled ${labels.map((l) => `"${esc(l)}"`).join(" and ")}` : "";
  fill("list", experiments.length
    ? table("experiments", columns, experiments, (e) => `class="link${e.archived ? " archived" : ""}" data-href="/experiments/${e.id}"`)
    : filtered || !archived ? `<p class="muted">No ${archived ? "" : "unarchived "}experiments${filtered}.</p>`
    : `<p class="muted">No experiments yet: <code>localdet submit CONFIG MODEL_DIR</code>.</p>`);
  compareButton();
}

// What each button can act on, by the state of an experiment or of a trial (as the CLI).
const ACTIONABLE = {
  experiments: {pause: ["ACTIVE"], resume: ["PAUSED"], kill: ["ACTIVE", "PAUSED"]},
  trials: {pause: ["QUEUED", "RUNNING"], resume: ["PAUSED"],
           kill: ["QUEUED", "RUNNING", "PAUSED", "WAITING"]},
};

function actionButtons(kind, id, currentState) {
  const can = ACTIONABLE[kind];
  return ["pause", "resume", "kill"].map((action) =>
    `<button data-action="${action}" data-kind="${kind}" data-id="${id}"
      ${can[action].includes(currentState) ? "" : "disabled"}>${action[0].toUpperCase() + action.slice(1)}</button>`).join(" ");
}

document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-action]");
  if (!button) return;
  const message = document.getElementById("message");
  try {
    // The header tells the server this comes from its own page (the browser adds Origin).
    const result = await getJSON(`/api/${button.dataset.kind}/${button.dataset.id}/${button.dataset.action}`,
      {method: "POST", headers: {"X-Localdet-Request": "1"}});
    message.className = ""; message.textContent = result.message;
  } catch (error) {
    message.className = "error"; message.textContent = error.message;
  }
  refresh();
});

async function experimentPage(id) {
  const e = await getJSON(`/api/experiments/${id}`);
  const hparamNames = [...new Set(e.trials.flatMap((t) => Object.keys(flat(t.hparams))))].sort();
  const metricNames = [...new Set(e.trials.flatMap((t) => Object.keys(t.latest_validation || {})))].sort();
  const columns = [
    {key: "id", label: "Trial"},
    {key: "state", label: "State", html: (t) => state(t.state)},
    {key: "batches_trained", label: "Batches", html: (t) => `${t.batches_trained}/${t.target_batches}`},
    {key: "restarts", label: "Restarts"},
    ...hparamNames.map((name) => ({key: `h:${name}`, label: name, value: (t) => flat(t.hparams)[name]})),
    ...metricNames.map((name) => ({key: `m:${name}`, label: name, value: (t) => (t.latest_validation || {})[name]})),
    {key: "best", label: `best ${e.metric}`, value: (t) => (t.best_validation || {})[e.metric]},
    {key: "latest_checkpoint", label: "Checkpoint", value: (t) => (t.latest_checkpoint || "").slice(0, 8)},
  ];
  const rungs = e.rungs && e.rungs.length ? `<h2>ASHA rungs</h2>` + table("rungs", [
    {key: "bracket", label: "Bracket"}, {key: "rung", label: "Rung"}, {key: "length", label: "Length (batches)"},
    {key: "reached", label: "Reached"}, {key: "promoted", label: "Promoted"}], e.rungs) : "";
  const fresh = frame(`<div id="head"></div><span id="message"></span>
    <div id="manage"></div>
    <h2>Learning curves</h2><div class="card"><div id="curves"></div><p id="curves-note" class="muted"></p></div>
    <h2>Hyperparameters and <span id="metric"></span></h2><div class="card"><div id="hparams"></div></div>
    <h2>Which hyperparameters mattered</h2><div class="card"><div id="importance"></div></div>
    <h2><span class="metric-name"></span> against each hyperparameter</h2><div class="card"><div id="scatter"></div></div>
    <h2>Timeline</h2><div class="card"><div id="timeline"></div></div>
    <div id="rest"></div>
    <details id="config"><summary>Config</summary><pre id="config-text"></pre></details>`);
  fill("head", `
    <h1>Experiment ${e.id}: ${esc(e.name)} <span id="state">${state(e.state)}</span>
      ${e.archived ? '<span class="badge" id="archived">archived</span>' : ""}
      ${actionButtons("experiments", e.id, e.state)}</h1>
    <div class="facts">${lineage(e)}<span><b>searcher</b> ${esc(e.searcher)}</span>
      <span><b>progress</b> ${Math.round(100 * e.progress)}%</span>
      <span><b>best ${esc(e.metric)}</b> ${esc(num(e.best_metric))}${e.best_trial ? ` (trial ${e.best_trial})` : ""}</span>
      <span><b>trials</b> ${Object.entries(e.trials_by_state).map(([s, n]) => `${n} ${esc(s.toLowerCase())}`).join(", ")}</span>
      <span><b>started</b> ${esc(when(e.submitted_at))}</span>
      <span><b>duration</b> ${esc(duration(e.submitted_at, e.ended_at))}</span></div>
    ${e.error ? `<p class="error">${esc(e.error)}</p>` : ""}${continuations(e)}`);
  managePanel(e, fresh);
  fill("metric", esc(e.metric));
  document.querySelectorAll(".metric-name").forEach((span) => { span.textContent = e.metric; });
  fill("rest", `${rungs}<h2>Trials</h2>
    ${table("trials", columns, e.trials, (t) => `class="link${t.id === e.best_trial ? " best" : ""}" data-href="/trials/${t.id}"`)}`);
  fill("config-text", esc(e.config));
  curves(e.charts.curves_drawn, e.charts.curves);
  chart("hparams", e.charts.hyperparameters);
  chart("importance", e.charts.importance);
  chart("scatter", e.charts.scatter);
  chart("timeline", e.charts.timeline);
}

// How long each launch took to end its first training batch: a slow model folder (heavy
// imports, data loading) shows here. Every launch is listed when there were several.
function launchFacts(t) {
  const secs = (s) => `${s.toFixed(1)} s`;
  const warm = t.launches.length && t.launches[t.launches.length - 1].warm ? " (warm process)" : "";
  const latest = t.launch_seconds === null ? "" :
    `<span id="first-batch"><b>first batch</b> ${secs(t.launch_seconds)} after launch${warm}</span>`;
  if (t.launches.length < 2) return latest;
  const last = t.launches.length - 1;  // only a running trial's latest launch may still train
  const each = t.launches.map((l, i) => `${i + 1}: ${l.first_batch_seconds === null
    ? (i === last && t.state === "RUNNING" ? "not yet" : "no batch") : secs(l.first_batch_seconds)}`);
  return `${latest}<span id="launches"><b>launches</b> ${esc(each.join(", "))}</span>`;
}

async function trialPage(id) {
  const t = await getJSON(`/api/trials/${id}`);
  const hparams = Object.entries(flat(t.hparams)).map(([k, v]) => `<span><b>${esc(k)}</b> ${esc(num(v))}</span>`).join("");
  const checkpoints = table("checkpoints", [
    {key: "uuid", label: "UUID"},
    {key: "batches_trained", label: "Batches"},
    {key: "size_bytes", label: "Size", html: (c) => `${(c.size_bytes / 1e6).toFixed(2)} MB`},
    {key: "metadata", label: "Metadata", value: (c) => Object.entries(c.metadata)
      .filter(([k]) => !["experiment_id", "trial_id", "batches_trained", "format"].includes(k))
      .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(", ")},
    {key: "registered", label: "Model version", value: (c) => (c.registered || []).map((r) => `${r.model} v${r.version}`).join(", "),
      html: (c) => (c.registered || []).map((r) => `<a data-nav href="/models/${r.model_id}">${esc(r.model)} v${r.version}</a>`).join(", ")},
    {key: "download", label: "", html: (c) => `<a href="/api/checkpoints/${esc(c.uuid)}.tar.gz" download>download .tar.gz</a>`},
  ], t.checkpoints);
  frame(`<div id="head"></div><span id="message"></span>
    <h2>Learning curves</h2><div class="card"><div id="curves"></div><p id="curves-note" class="muted"></p></div>
    <h2>System metrics</h2><div class="card"><div id="system"></div></div>
    <h2>Timeline</h2><div class="card"><div id="timeline"></div></div>
    <div id="rest"></div>`);
  fill("head", `
    <h1>Trial ${t.id} <span id="state">${state(t.state)}</span>
      ${actionButtons("trials", t.id, t.state)}
      <a data-nav href="/experiments/${t.experiment.id}">experiment ${t.experiment.id}: ${esc(t.experiment.name)}</a></h1>
    <div class="facts"><span><b>batches</b> ${t.batches_trained}/${t.target_batches}</span>
      <span><b>restarts</b> ${t.restarts}</span>${t.engine ? `<span><b>engine</b> ${esc(t.engine)} on ${(t.slots || []).length} slot(s)</span>` : ""}
      ${launchFacts(t)}</div>
    <h2>Hyperparameters</h2><div class="facts">${hparams || '<span class="muted">none</span>'}</div>`);
  fill("rest", `<h2>Checkpoints</h2>${t.checkpoints.length ? checkpoints : '<p class="muted">none yet</p>'}
    <h2>Log</h2><pre id="log">${esc(t.log_tail || "(empty)")}</pre>`);
  const log = document.getElementById("log");
  log.scrollTop = log.scrollHeight;  // the latest lines in view
  curves(t.charts.curves_drawn, t.charts.curves);
  chart("timeline", t.charts.timeline);
  chart("system", t.charts.system);
}

async function jobsPage() {
  const archived = new URLSearchParams(location.search).get("archived") === "1";
  const jobs = await getJSON(`/api/jobs${archived ? "?archived=1" : ""}`);
  if (!sorting.jobs) sorting.jobs = {key: "id", desc: true};
  main.dataset.path = "";
  main.innerHTML = `<h1>Jobs</h1><div class="filters"><a data-nav id="archived-toggle"
    href="/jobs${archived ? "" : "?archived=1"}">${archived ? "Hide archived" : "Show archived"}</a></div>` + (jobs.length ? table("jobs", [
    {key: "id", label: "ID"}, {key: "name", label: "Name", html: (j) => `${esc(j.name)}${j.archived ? ' <span class="badge">archived</span>' : ""}`},
    {key: "state", label: "State", html: (j) => state(j.state)},
    {key: "slots", label: "Slots"},
    {key: "started_at", label: "Started", html: (j) => esc(when(j.started_at))},
    {key: "duration_seconds", label: "Duration", html: (j) => j.duration_seconds === null ? "" : `${j.duration_seconds} s`},
    {key: "log", label: "Log"},
  ], jobs) : `<p class="muted">No jobs yet: <code>localdet job run CONFIG DIR</code>.</p>`);
}

// -- routing and live updates ---------------------------------------------------------------
async function refresh() {
  const path = location.pathname;
  let match;
  try {
    if ((match = path.match(/^\/experiments\/(\d+)$/))) await experimentPage(match[1]);
    else if ((match = path.match(/^\/trials\/(\d+)$/))) await trialPage(match[1]);
    else if (path === "/jobs") await jobsPage();
    else if (path === "/models") await modelsPage();
    else if ((match = path.match(/^\/models\/(\d+)$/))) await modelPage(match[1]);
    else if (path === "/compare") await comparePage();
    else await experimentsPage();
    const daemon = await getJSON("/api/daemon");  // e.g. launches held: the disk is short
    const notice = document.getElementById("notice");
    notice.hidden = !daemon.notice;
    notice.textContent = daemon.notice || "";
    document.getElementById("updated").textContent =
      `localdet ${daemon.version} · updated ${new Date().toLocaleTimeString()}`;
  } catch (error) {
    main.dataset.path = "";
    main.innerHTML = `<p class="error">${esc(error.message)}</p>`;
  }
}

// The next refresh waits REFRESH_MS, or four times what this one took where that is longer
// (a large page on a slow machine): the page stays free for the user most of the time.
function render() {
  clearTimeout(timer);
  const tick = async () => {
    const started = performance.now();
    await refresh();
    timer = setTimeout(tick, Math.max(REFRESH_MS, 4 * (performance.now() - started)));
  };
  tick();
}

// Opened from the printed address: the cookie set with this page carries the token from
// here on, so it leaves the address bar (and the history).
if (new URLSearchParams(location.search).has("token")) history.replaceState({}, "", location.pathname);
render();
