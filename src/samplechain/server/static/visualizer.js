// The sampler chain visualizer: edit the chain, POST /sampling/trace, draw each stage's candidates.
// Plain JavaScript, no framework, nothing fetched from anywhere but this server.
"use strict";

// Each stage the editor offers: its name in `samplers`, its name in a trace, its effect, its request fields.
const KINDS = {
  penalties: { trace: "penalties", effect: "transform", fields: [
    ["repeat_last_n", 64, 1], ["repeat_penalty", 1.0, 0.05], ["frequency_penalty", 0.0, 0.05],
    ["presence_penalty", 0.0, 0.05]] },
  dry: { trace: "dry", effect: "transform", fields: [
    ["dry_multiplier", 0.0, 0.1], ["dry_base", 1.75, 0.05], ["dry_allowed_length", 2, 1],
    ["dry_penalty_last_n", 64, 1]] },
  top_n_sigma: { trace: "top-n-sigma", effect: "filter", fields: [["top_n_sigma", -1.0, 0.1]] },
  top_k: { trace: "top-k", effect: "filter", fields: [["top_k", 40, 1]] },
  typ_p: { trace: "typical", effect: "filter", fields: [["typical_p", 1.0, 0.01]] },
  top_p: { trace: "top-p", effect: "filter", fields: [["top_p", 0.95, 0.01]] },
  min_p: { trace: "min-p", effect: "filter", fields: [["min_p", 0.05, 0.01]] },
  xtc: { trace: "xtc", effect: "filter", fields: [["xtc_probability", 0.0, 0.05], ["xtc_threshold", 0.1, 0.01]] },
  temperature: { trace: "temp-ext", effect: "transform", fields: [
    ["temperature", 0.8, 0.05], ["dynatemp_range", 0.0, 0.05], ["dynatemp_exponent", 1.0, 0.05]] },
};
const MODE_FIELDS = {
  dist: [],
  adaptive_p: [["adaptive_target", 0.5, 0.05], ["adaptive_decay", 0.9, 0.01]],
  1: [["mirostat_tau", 5.0, 0.1], ["mirostat_eta", 0.1, 0.01]],
  2: [["mirostat_tau", 5.0, 0.1], ["mirostat_eta", 0.1, 0.01]],
};
const INITIAL_CHAIN = ["top_k", "top_p", "min_p", "temperature"];

const $ = (sel) => document.querySelector(sel);
const defaults = {};          // request field -> the server's default (from /props), else the table above
const modeValues = {};        // request field -> value, for the selector's fields
let chain = [];               // [{kind, values: {field: number}}]
let generated = [];           // [{id, piece}] tokens appended by "step"
let lastStep = null;          // the last trace's step
let requestNo = 0;            // only the newest answer is drawn
let timer = null;

function fieldDefault(name, fallback) { return name in defaults ? defaults[name] : fallback; }

function newStage(kind) {
  const values = {};
  for (const [name, fallback] of KINDS[kind].fields) values[name] = fieldDefault(name, fallback);
  return { kind, values };
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("#api-key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

// --- the chain editor --------------------------------------------------------------------------------------------

function numberInput(name, value, step, onChange) {
  const label = document.createElement("label");
  label.textContent = name;
  const input = document.createElement("input");
  input.type = "number";
  input.name = name;
  input.step = String(step);
  input.value = String(value);
  input.addEventListener("input", () => {
    const v = Number(input.value);
    if (input.value !== "" && Number.isFinite(v)) onChange(v);
  });
  label.appendChild(input);
  return label;
}

function button(text, title, onClick, disabled) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  b.title = title;
  b.disabled = !!disabled;
  b.addEventListener("click", onClick);
  return b;
}

function renderChain() {
  const list = $("#chain");
  list.replaceChildren();
  chain.forEach((stage, i) => {
    const kind = KINDS[stage.kind];
    const li = document.createElement("li");
    li.className = "stage-editor " + kind.effect;
    li.id = "stage-" + stage.kind;
    li.dataset.kind = stage.kind;
    const head = document.createElement("div");
    head.className = "head";
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = kind.trace;
    head.append(name,
      button("↑", "move up", () => move(i, -1), i === 0),
      button("↓", "move down", () => move(i, 1), i === chain.length - 1),
      button("✕", "remove", () => { chain.splice(i, 1); changed(); }));
    const params = document.createElement("div");
    params.className = "params";
    for (const [field, , step] of kind.fields) {
      params.appendChild(numberInput(field, stage.values[field], step, (v) => {
        stage.values[field] = v;
        schedule();
      }));
    }
    li.append(head, params);
    list.appendChild(li);
  });
  const add = $("#add-kind");
  add.replaceChildren();
  for (const kind of Object.keys(KINDS)) {
    if (chain.some((s) => s.kind === kind)) continue;  // one stage of each kind: they share request fields
    const o = document.createElement("option");
    o.value = kind;
    o.textContent = KINDS[kind].trace;
    add.appendChild(o);
  }
  $("#add").disabled = add.options.length === 0;
  const mode = $("#mode").value;
  const tail = mode === "1" || mode === "2" ? ["temp", mode === "1" ? "mirostat" : "mirostat-v2"]
    : [...chain.map((s) => KINDS[s.kind].trace), mode === "adaptive_p" ? "adaptive-p" : "dist"];
  $("#chain-preview").textContent = tail.join(" → ");
}

function move(i, delta) {
  const [stage] = chain.splice(i, 1);
  chain.splice(i + delta, 0, stage);
  changed();
}

function renderModeFields() {
  const box = $("#mode-params");
  box.replaceChildren();
  for (const [field, fallback, step] of MODE_FIELDS[$("#mode").value]) {
    if (!(field in modeValues)) modeValues[field] = fieldDefault(field, fallback);
    box.appendChild(numberInput(field, modeValues[field], step, (v) => { modeValues[field] = v; schedule(); }));
  }
}

function changed() {
  renderChain();
  schedule();
}

// --- requests ------------------------------------------------------------------------------------------------

function requestBody() {
  const body = {};
  const prompt = $("#prompt").value;
  if ($("#chat").checked) body.messages = [{ role: "user", content: prompt }];
  else body.prompt = prompt;
  const mode = $("#mode").value;
  body.samplers = chain.map((s) => s.kind);
  if (mode === "adaptive_p") body.samplers.push("adaptive_p");
  body.mirostat = mode === "1" ? 1 : mode === "2" ? 2 : 0;
  for (const s of chain) Object.assign(body, s.values);
  for (const [field] of MODE_FIELDS[mode]) body[field] = modeValues[field];
  const seed = $("#seed").value.trim();
  if (seed !== "") body.seed = Number(seed);
  body.n_top = Number($("#n_top").value) || 10;
  body.steps = 1;
  body.generated = generated.map((g) => g.id);
  const extra = $("#extra").value.trim();
  if (extra) Object.assign(body, JSON.parse(extra));
  return body;
}

function schedule() {
  clearTimeout(timer);
  timer = setTimeout(runTrace, 200);
}

async function runTrace() {
  clearTimeout(timer);
  const no = ++requestNo;
  let body;
  try {
    body = requestBody();
  } catch (e) {
    status("More request fields: " + e.message, true);
    return;
  }
  document.body.dataset.busy = "1";
  status("tracing…");
  try {
    const r = await fetch("/sampling/trace", { method: "POST", headers: headers(), body: JSON.stringify(body) });
    const data = await r.json();
    if (no !== requestNo) return;  // a newer request was sent meanwhile
    if (!r.ok) {
      status((data.error && data.error.message) || ("HTTP " + r.status), true);
      return;
    }
    render(data);
    status(`${data.n_prompt_tokens} prompt tokens` + (generated.length ? ` + ${generated.length} stepped` : "")
      + (data.stopped ? " · end of generation" : ""));
  } catch (e) {
    if (no === requestNo) status(String(e), true);
  } finally {
    if (no === requestNo) document.body.dataset.busy = "0";
  }
}

function status(text, error) {
  const el = $("#status");
  el.textContent = text;
  el.classList.toggle("error", !!error);
}

// --- drawing -------------------------------------------------------------------------------------------------

function showPiece(piece) {
  if (piece === null || piece === undefined) return "";
  return piece.replace(/\n/g, "\\n").replace(/\t/g, "\\t").replace(/ /g, "␣");
}

function fmtParams(params) {
  return Object.entries(params)
    .filter(([k]) => k !== "n_vocab" && k !== "grammar" && k !== "biases")
    .map(([k, v]) => `${k}=${typeof v === "number" ? +v.toPrecision(4) : JSON.stringify(v)}`)
    .join(", ");
}

function barRow(row, token, extra) {
  const el = document.createElement("div");
  el.className = "bar-row" + (row.id === token ? " selected" : "") + (extra ? " extra" : "");
  el.dataset.id = String(row.id);
  el.title = `#${row.rank} · id ${row.id} · logit ${row.logit === null ? "-inf" : row.logit.toFixed(4)}`
    + ` · p ${row.prob.toFixed(6)}`;
  const piece = document.createElement("span");
  piece.className = "piece";
  piece.textContent = showPiece(row.piece);
  const track = document.createElement("div");
  track.className = "track";
  const fill = document.createElement("div");
  fill.className = "fill";
  fill.style.width = (100 * Math.max(0, Math.min(1, row.prob))).toFixed(2) + "%";
  track.appendChild(fill);
  const prob = document.createElement("span");
  prob.className = "prob";
  prob.textContent = (100 * row.prob).toFixed(row.prob >= 0.1 ? 1 : 2) + "%";
  el.append(piece, track, prob);
  return el;
}

function render(data) {
  const step = data.steps[0];
  lastStep = { ...step, stopped: data.stopped };
  $("#prompt-text").textContent = data.prompt;
  const gen = $("#generated");
  gen.replaceChildren(...generated.map((g) => {
    const s = document.createElement("span");
    s.className = "gen";
    s.dataset.id = String(g.id);
    s.textContent = g.piece;
    return s;
  }));
  const box = $("#stages");
  box.replaceChildren();
  for (const stage of step.stages) {
    const card = document.createElement("div");
    card.className = "stage " + (stage.effect || "input");
    card.dataset.name = stage.name;
    const h = document.createElement("h3");
    h.textContent = stage.name;
    const meta = document.createElement("div");
    meta.className = "meta";
    const params = fmtParams(stage.params);
    meta.textContent = (params ? params + " · " : "") + `${stage.size} candidate${stage.size === 1 ? "" : "s"}`
      + (stage.n_masked ? ` (${stage.n_masked} masked)` : "")
      + (stage.selected !== null ? ` · selected ${JSON.stringify(step.piece)}` : "");
    const bars = document.createElement("div");
    bars.className = "bars";
    for (const row of stage.top) bars.appendChild(barRow(row, step.token, false));
    if (stage.chosen && !stage.top.some((r) => r.id === stage.chosen.id)) {
      const gap = document.createElement("div");
      gap.className = "gap";
      gap.textContent = `… the selected token is #${stage.chosen.rank + 1} here`;
      bars.append(gap, barRow(stage.chosen, step.token, true));
    }
    card.append(h, meta, bars);
    box.appendChild(card);
  }
  const traced = new Set(step.stages.map((s) => s.name));
  const inactive = $("#mode").value === "1" || $("#mode").value === "2" ? []
    : chain.filter((s) => !traced.has(KINDS[s.kind].trace)).map((s) => KINDS[s.kind].trace);
  $("#summary").textContent = `selected ${JSON.stringify(step.piece)} (id ${step.token})`
    + (step.rejected !== null ? ` · the grammar refused id ${step.rejected} first` : "")
    + (inactive.length ? ` · left out, no-ops with these parameters: ${inactive.join(", ")}` : "");
  $("#step").disabled = !!data.stopped;
  box.dataset.traces = String(Number(box.dataset.traces || 0) + 1);
}

// --- start ----------------------------------------------------------------------------------------------------

async function loadDefaults() {
  try {
    const r = await fetch("/props", { headers: headers() });
    if (!r.ok) return;
    const props = await r.json();
    Object.assign(defaults, props.default_generation_settings.params);
    $("#model").textContent = "Model: " + props.model_alias;
  } catch (e) {
    // the built-in defaults above are llama.cpp's
  }
}

async function main() {
  const key = localStorage.getItem("samplechain-api-key");
  if (key) $("#api-key").value = key;
  $("#api-key").addEventListener("change", () => localStorage.setItem("samplechain-api-key", $("#api-key").value));
  await loadDefaults();
  chain = INITIAL_CHAIN.map(newStage);
  renderChain();
  renderModeFields();
  $("#add").addEventListener("click", () => {
    const kind = $("#add-kind").value;
    if (kind) { chain.push(newStage(kind)); changed(); }
  });
  $("#mode").addEventListener("change", () => { renderModeFields(); changed(); });
  for (const id of ["#seed", "#n_top", "#extra"]) $(id).addEventListener("input", schedule);
  $("#chat").addEventListener("change", () => { generated = []; schedule(); });
  $("#prompt").addEventListener("input", () => { generated = []; schedule(); });
  $("#trace").addEventListener("click", runTrace);
  $("#reset").addEventListener("click", () => { generated = []; runTrace(); });
  $("#step").addEventListener("click", () => {
    if (!lastStep || lastStep.stopped || document.body.dataset.busy === "1") return;
    generated.push({ id: lastStep.token, piece: lastStep.piece });
    runTrace();
  });
  runTrace();
}

main();
