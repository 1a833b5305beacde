// Experiments side by side: the list's checkboxes choose them, its Compare button opens
// /compare?ids=3,7, whose table (rows: the best trials' facts, hyperparameters and
// metrics; columns: the experiments) and chart come from /api/compare (`localdet compare`).
// Loaded before app.js, whose helpers (esc, num, getJSON, frame, fill, chart, go) it uses.
"use strict";

const chosen = new Set();   // experiment ids ticked on the list, kept across refreshes

const chooseBox = (e) => `<input type="checkbox" class="choose" data-id="${e.id}"
  aria-label="choose experiment ${e.id}" ${chosen.has(String(e.id)) ? "checked" : ""}>`;

function compareButton() {
  const button = document.getElementById("compare");
  if (!button) return;
  button.disabled = chosen.size < 2;
  button.textContent = chosen.size ? `Compare (${chosen.size})` : "Compare";
}

document.addEventListener("change", (event) => {
  const box = event.target.closest("input.choose");
  if (!box) return;
  if (box.checked) chosen.add(box.dataset.id); else chosen.delete(box.dataset.id);
  compareButton();
});

document.addEventListener("click", (event) => {
  if (event.target.closest("button#compare")) go(`/compare?ids=${[...chosen].join(",")}`);
});

async function comparePage() {
  const ids = new URLSearchParams(location.search).get("ids") || "";
  const found = await getJSON(`/api/compare?ids=${encodeURIComponent(ids)}`);
  const columns = found.experiments;
  frame(`<h1>Experiments side by side</h1>
    <p class="muted">Each experiment by its best trial (by its own searcher metric).</p>
    <div id="compared"></div>
    <h2>Validation curves of the best trials</h2><div class="card"><div id="compare-curves"></div></div>`,
    location.pathname + location.search);
  const cell = (v) => `<td>${esc(typeof v === "object" && v !== null ? JSON.stringify(v) : num(v))}</td>`;
  const row = (label, value, cls = "") =>
    `<tr class="${cls}"><th>${esc(label)}</th>${columns.map((c) => cell(value(c))).join("")}</tr>`;
  const section = (title) => `<tr class="section"><th colspan="${columns.length + 1}">${esc(title)}</th></tr>`;
  const head = columns.map((c) =>
    `<th><a data-nav href="/experiments/${c.id}">${c.id}: ${esc(c.name)}</a></th>`).join("");
  fill("compared", `<div class="scroll"><table id="compare-table"><thead><tr><th></th>${head}</tr></thead><tbody>
    ${row("state", (c) => c.state)}${row("searcher", (c) => c.searcher)}
    ${row("trials", (c) => c.num_trials)}
    <tr><th>best trial</th>${columns.map((c) => `<td>${c.best_trial === null ? ""
      : `<a data-nav href="/trials/${c.best_trial}">${c.best_trial}</a>`}</td>`).join("")}</tr>
    ${row("searcher metric", (c) => c.metric)}${row("best", (c) => c.best_metric, "best")}
    ${row("at batches", (c) => c.best_batches)}${row("batches trained", (c) => c.batches)}
    ${section("Hyperparameters")}${found.hyperparameters.map((n) => row(n, (c) => c.hparams[n])).join("")}
    ${section("Validation metrics at the best point")}${found.metrics.map((n) => row(n, (c) => c.validation[n])).join("")}
    </tbody></table></div>`);
  chart("compare-curves", found.charts.curves);
}
