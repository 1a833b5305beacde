// Living with many experiments: labels, description, notes, archive and delete on an
// experiment's page, where it came from (forked, continued), and the model registry's pages.
// Loaded before app.js, whose helpers (esc, getJSON, table, fill, go, refresh) it uses.
"use strict";

let flash = null;   // a message for the next page (after a delete, the list says so)

function showFlash() {
  const message = document.getElementById("message");
  if (flash && message) { message.className = ""; message.textContent = flash; flash = null; }
}

// A POST from the dashboard's own page (the header, with the Origin the browser adds, tells
// the server so) with a JSON body.
const post = (url, body = {}) => getJSON(url, {method: "POST",
  headers: {"X-Localdet-Request": "1", "Content-Type": "application/json"}, body: JSON.stringify(body)});

const labelLinks = (labels) => (labels || []).map((l) =>
  `<a data-nav class="label" href="/?label=${encodeURIComponent(l)}">${esc(l)}</a>`).join(" ");

const experimentLink = (id) => `<a data-nav href="/experiments/${id}">${id}</a>`;

// In the list: the experiment it was forked from, and whether it was continued.
function origin(e) {
  const forked = e.parent_id ? ` <span class="origin">forked from ${experimentLink(e.parent_id)}</span>` : "";
  const times = Array.isArray(e.continued) ? e.continued.length : e.continued;  // the list: a count
  const continued = times ? ` <span class="origin">continued ×${times}</span>` : "";
  return forked + continued;
}

// On its page: the same, and the experiments forked from it.
function lineage(e) {
  const forked = e.parent_id ? `<span id="forked-from"><b>forked from</b> experiment ${experimentLink(e.parent_id)}</span>` : "";
  const forks = (e.forks || []).length ? `<span id="forks"><b>forks</b> ${e.forks.map(experimentLink).join(", ")}</span>` : "";
  return forked + forks;
}

const field = (c, ...names) => names.map((n) => c[n]).find((v) => v !== undefined && v !== null);

// Each `det e continue`: when, from which checkpoint at how many batches, to how many, and
// what it changed (the event `experiment_continued`, which describe lists).
function continuations(e) {
  if (!(e.continued || []).length) return "";
  const items = e.continued.map((c) => {
    const changes = Object.entries(flat(c.overrides || {})).map(([k, v]) => `${k}=${JSON.stringify(v)}`);
    return `<li>continued ${esc(when(c.at))}${c.checkpoint ? ` from checkpoint <code title="${esc(c.checkpoint)}">${
      esc(String(c.checkpoint).slice(0, 8))}</code> at ${esc(num(c.batches))} batches` : " from the start"}${
      c.target ? `, to ${esc(num(c.target))} batches` : ""}${changes.length ? `; changed ${esc(changes.join(", "))}` : ""}</li>`;
  }).join("");
  return `<ul id="continued" class="muted">${items}</ul>`;
}

// Labels, description, notes, archive and delete. The form's fields are filled when the page
// is made (or a save succeeds), never by the refresh, which would overwrite what is typed.
function managePanel(e, fresh) {
  if (fresh) {
    fill("manage", `<div class="manage card">
      <div class="row"><b>Labels</b> <span id="labels"></span>
        <form id="label-form" class="inline"><input id="label-input" placeholder="new label" required>
          <button type="submit">Add label</button></form></div>
      <form id="description-form" class="row"><label for="description-input"><b>Description</b></label>
        <input id="description-input" size="60"><button type="submit">Save description</button></form>
      <form id="notes-form" class="row"><label for="notes-input"><b>Notes</b></label>
        <textarea id="notes-input" rows="3" cols="60"></textarea><button type="submit">Save notes</button></form>
      <div class="row"><button id="archive-button" type="button"></button>
        <button id="delete-button" type="button" class="danger">Delete…</button></div>
      <form id="delete-form" class="row confirm" hidden>
        <span>Deleting experiment ${e.id} removes its trials, metrics, logs, TensorBoard files and
          checkpoints for good. Type <b>${e.id}</b> to confirm:</span>
        <input id="delete-confirm" autocomplete="off" size="6">
        <button id="delete-confirmed" type="submit" class="danger" disabled>Delete experiment ${e.id}</button>
        <button id="delete-cancel" type="button">Cancel</button></form>
    </div>`);
    document.getElementById("description-input").value = e.description || "";
    document.getElementById("notes-input").value = e.notes || "";
  }
  fill("labels", (e.labels || []).map((l) => `<span class="label">${esc(l)}<button type="button"
    class="remove-label" data-label="${esc(l)}" title="remove label ${esc(l)}">×</button></span>`).join(" ")
    || '<span class="muted">none</span>');
  const archive = document.getElementById("archive-button");
  archive.textContent = e.archived ? "Unarchive" : "Archive";
  archive.dataset.what = e.archived ? "unarchive" : "archive";
  archive.dataset.id = e.id;
  document.getElementById("delete-form").dataset.id = e.id;
}

function say(text, error = false) {
  const message = document.getElementById("message");
  if (message) { message.className = error ? "error" : ""; message.textContent = text; }
}

// Runs a change on the experiment whose page is open, says what came of it, refreshes.
async function change(what, body = {}) {
  const id = location.pathname.match(/^\/experiments\/(\d+)$/)[1];
  try {
    const result = await post(`/api/experiments/${id}/${what}`, body);
    say(result.message);
    return true;
  } catch (error) {
    say(error.message, true);
    return false;
  } finally {
    refresh();
  }
}

document.addEventListener("submit", async (event) => {
  const form = event.target;
  event.preventDefault();
  if (form.id === "filters") {
    const labels = document.getElementById("label-filter").value.split(",").map((l) => l.trim()).filter(Boolean);
    const params = new URLSearchParams(location.search);
    params.delete("label");
    labels.forEach((l) => params.append("label", l));
    go(`/${params.toString() ? `?${params}` : ""}`);
  } else if (form.id === "label-form") {
    const input = document.getElementById("label-input");
    if (await change("labels", {add: input.value.trim()})) input.value = "";
  } else if (form.id === "description-form") {
    await change("description", {text: document.getElementById("description-input").value});
  } else if (form.id === "notes-form") {
    await change("notes", {text: document.getElementById("notes-input").value});
  } else if (form.id === "delete-form") {
    const id = form.dataset.id;
    try {
      const result = await post(`/api/experiments/${id}/delete`,
        {confirm: document.getElementById("delete-confirm").value.trim()});
      flash = result.message;
      go("/");
    } catch (error) {
      say(error.message, true);
    }
  }
});

document.addEventListener("click", async (event) => {
  const target = event.target;
  if (target.closest("button.remove-label")) {
    await change("labels", {remove: target.closest("button").dataset.label});
  } else if (target.id === "archive-button") {
    await change(target.dataset.what);
  } else if (target.id === "delete-button" || target.id === "delete-cancel") {
    const form = document.getElementById("delete-form");
    form.hidden = target.id === "delete-cancel";
    document.getElementById("delete-confirm").value = "";
    document.getElementById("delete-confirmed").disabled = true;
    if (!form.hidden) document.getElementById("delete-confirm").focus();
  }
});

document.addEventListener("input", (event) => {
  if (event.target.id === "delete-confirm") {  // enabled once the id is typed
    const form = document.getElementById("delete-form");
    document.getElementById("delete-confirmed").disabled = event.target.value.trim() !== form.dataset.id;
  }
});

// -- the model registry ---------------------------------------------------------------------
async function modelsPage() {
  const archived = new URLSearchParams(location.search).get("archived") === "1";
  const models = await getJSON(`/api/models${archived ? "?archived=1" : ""}`);
  if (!sorting.models) sorting.models = {key: "name", desc: false};
  main.dataset.path = "";
  main.innerHTML = `<h1>Models</h1><div class="filters"><a data-nav id="archived-toggle"
    href="/models${archived ? "" : "?archived=1"}">${archived ? "Hide archived" : "Show archived"}</a></div>` + (models.length ? table("models", [
    {key: "name", label: "Name", html: (m) => `<a data-nav href="/models/${m.id}">${esc(m.name)}</a>${m.archived ? ' <span class="badge">archived</span>' : ""}`},
    {key: "description", label: "Description"},
    {key: "labels", label: "Labels", value: (m) => (m.labels || []).join(", ")},
    {key: "num_versions", label: "Versions"},
    {key: "last_updated", label: "Last updated", value: (m) => field(m, "last_updated_time", "updated_at", "last_updated"),
      html: (m) => esc(when(field(m, "last_updated_time", "updated_at", "last_updated")))},
  ], models, (m) => `class="link" data-href="/models/${m.id}"`)
    : `<p class="muted">No models yet: <code>det model create NAME</code>, then <code>det model register-version NAME UUID</code>.</p>`);
}

async function modelPage(id) {
  const m = await getJSON(`/api/models/${id}`);
  if (!sorting.versions) sorting.versions = {key: "version", desc: true};
  const checkpointOf = (v) => v.checkpoint || {};
  const metadata = Object.entries(flat(m.metadata)).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(", ");
  main.dataset.path = "";
  main.innerHTML = `<h1>Model ${esc(m.name)}</h1>
    <div class="facts"><span><b>description</b> ${esc(m.description) || '<span class="muted">none</span>'}</span>
      <span><b>labels</b> ${esc((m.labels || []).join(", ")) || '<span class="muted">none</span>'}</span>
      ${metadata ? `<span><b>metadata</b> ${esc(metadata)}</span>` : ""}
      <span><b>created</b> ${esc(when(field(m, "creation_time", "created_at")))}</span>
      <span><b>updated</b> ${esc(when(field(m, "last_updated_time", "updated_at")))}</span></div>
    ${m.notes ? `<p>${esc(m.notes)}</p>` : ""}
    <h2>Versions</h2>` + (m.versions.length ? table("versions", [
    {key: "version", label: "Version"},
    {key: "name", label: "Name"},
    {key: "checkpoint", label: "Checkpoint", value: (v) => field(v, "checkpoint_uuid") || checkpointOf(v).uuid,
      html: (v) => { const c = checkpointOf(v), uuid = field(v, "checkpoint_uuid") || c.uuid || "";
        return c.trial_id ? `<a data-nav href="/trials/${c.trial_id}" title="${esc(uuid)}">${esc(uuid.slice(0, 8))}</a>` : esc(uuid.slice(0, 8)); }},
    {key: "experiment", label: "Experiment / trial", value: (v) => checkpointOf(v).experiment_id,
      html: (v) => { const c = checkpointOf(v);
        return c.experiment_id ? `${experimentLink(c.experiment_id)} / <a data-nav href="/trials/${c.trial_id}">${c.trial_id}</a>` : ""; }},
    {key: "batches", label: "Batches", value: (v) => checkpointOf(v).batches_trained},
    {key: "comment", label: "Comment"},
    {key: "created", label: "Created", value: (v) => field(v, "creation_time", "created_at"),
      html: (v) => esc(when(field(v, "creation_time", "created_at")))},
  ], m.versions) : `<p class="muted">No versions yet: <code>det model register-version ${esc(m.name)} UUID</code>.</p>`);
}
