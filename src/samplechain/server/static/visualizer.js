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
// Stepping is stateless and exact: after N steps the page traces `steps: N + 1` from the prompt with the same seed
// and draws the last step, so its tokens are those of one (N + 1)-step trace, one random stream.
const MAX_STEPS = 64;         // the server's limit on `steps`
let nSteps = 0;               // tokens stepped past the prompt
let shownSteps = 0;           // nSteps of the trace on the page
let stopped = false;          // the trace on the page ended the generation
let busy = false;             // a trace is in flight: Trace, Step and Reset are disabled
let pending = false;          // an edit while busy: traced again when the answer is in
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
  body.steps = nSteps + 1;
  body.last_step_only = true;
  const extra = $("#extra").value.trim();
  if (extra) Object.assign(body, JSON.parse(extra));
  return body;
}

function schedule() {
  clearTimeout(timer);
  timer = setTimeout(runTrace, 200);
}

function setBusy(on) {
  busy = on;
  document.body.dataset.busy = on ? "1" : "0";
  $("#busy").hidden = !on;
  $("#trace").disabled = on;
  $("#reset").disabled = on;
  $("#step").disabled = on || stopped || shownSteps + 2 > MAX_STEPS;
}

async function runTrace() {
  clearTimeout(timer);
  if (busy) {  // one trace at a time: an edit meanwhile is traced when the answer is in
    pending = true;
    return;
  }
  pending = false;
  let body;
  try {
    body = requestBody();
  } catch (e) {
    status("More request fields: " + e.message, true);
    return;
  }
  setBusy(true);
  status("");
  try {
    const r = await fetch("/sampling/trace", { method: "POST", headers: headers(), body: JSON.stringify(body) });
    const data = await r.json();
    if (!r.ok) {
      nSteps = Math.min(nSteps, shownSteps);
      status((data.error && data.error.message) || ("HTTP " + r.status), true);
      return;
    }
    nSteps = shownSteps = data.steps.length - 1;
    stopped = !!data.stopped;
    render(data);
    status(`${data.n_prompt_tokens} prompt tokens` + (nSteps ? ` + ${nSteps} stepped` : "")
      + (data.stopped ? " · end of generation" : "")
      + (nSteps + 2 > MAX_STEPS ? ` · the page traces at most ${MAX_STEPS} tokens` : ""));
  } catch (e) {
    nSteps = Math.min(nSteps, shownSteps);
    status(String(e), true);
  } finally {
    setBusy(false);
    if (pending) runTrace();
  }
}

function status(text, error) {
  const el = $("#status");
  el.textContent = text;
  el.classList.toggle("error", !!error);
}

// --- drawing -------------------------------------------------------------------------------------------------

const SVG = (() => {  // the SVG namespace, as the HTML parser gives it
  const t = document.createElement("template");
  t.innerHTML = "<svg></svg>";
  return t.content.firstChild.namespaceURI;
})();

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

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

const num = (v, d) => (v === null ? "-inf" : v.toFixed(d === undefined ? 2 : d));
const pct = (p) => (100 * p).toFixed(p >= 0.1 ? 1 : 2) + "%";
const short = (v) => +v.toPrecision(4);

// How a card draws its rows: logits where the stage works on logits, else probabilities. `before` is the stage's
// input (a ghost bar behind the fill); the fill is the value after the stage (none for a removed candidate).
function scaleOf(stage) {
  if (stage.scale === "logit") {
    const vals = stage.rows.flatMap((r) => [r.logit_before, r.logit]).filter((v) => v !== null);
    const hi = Math.max(...vals);
    const lo = Math.min(...vals);
    const floor = lo - Math.max(0.5, 0.15 * (hi - lo));  // the lowest bar keeps a visible length
    return {
      before: (r) => r.logit_before, after: (r) => r.logit, text: (v) => num(v),
      width: (v) => (v === null ? 0 : (v - floor) / (hi - floor)),
    };
  }
  const hi = Math.max(1e-9, ...stage.rows.flatMap((r) => [r.prob_before, r.prob]));
  return { before: (r) => r.prob_before, after: (r) => r.prob, text: pct, width: (v) => v / hi, max: hi };
}

function barRow(stage, row, scale, token, first) {
  const changed = !first && row.kept && Math.abs(scale.after(row) - scale.before(row)) > 5e-4 * (
    stage.scale === "logit" ? 1 : Math.max(scale.before(row), 1e-3));
  const r = el("div", "bar-row" + (row.id === token ? " selected" : "") + (row.kept ? " kept" : " removed")
    + (changed ? " changed" : "") + (stage.cut.kind === "top-k" && row.rank === stage.cut.kth_rank ? " kth" : ""));
  r.dataset.id = String(row.id);
  r.dataset.rank = String(row.rank);
  r.title = `#${row.rank + 1} · id ${row.id} · logit ${num(row.logit_before, 4)}`
    + (first ? "" : row.kept ? ` → ${num(row.logit, 4)}` : " (removed)")
    + ` · p ${row.prob_before.toFixed(6)}` + (first || !row.kept ? "" : ` → ${row.prob.toFixed(6)}`);
  const piece = el("span", "piece", showPiece(row.piece));
  const track = el("div", "track");
  const w = (v) => (100 * Math.max(0, Math.min(1, scale.width(v)))).toFixed(2) + "%";
  if (!first) {
    const ghost = el("div", "ghost");
    ghost.style.width = w(scale.before(row));
    track.appendChild(ghost);
  }
  const fill = el("div", "fill");
  fill.style.width = row.kept ? w(scale.after(row)) : "0%";
  track.appendChild(fill);
  if (stage.cut.kind === "min-p") {  // min-p's threshold, relative to the top candidate
    const tick = el("div", "tick");
    tick.style.left = w(stage.cut.threshold_prob);
    track.appendChild(tick);
  }
  const value = el("span", "value");
  value.textContent = !row.kept ? scale.text(scale.before(row))
    : changed ? `${scale.text(scale.before(row))} → ${scale.text(scale.after(row))}` : scale.text(scale.after(row));
  r.append(piece, track, value);
  if (stage.cut.kind === "top-p") r.appendChild(el("span", "cum", row.cum.toFixed(3)));
  if (stage.cut.kind === "top-k" && row.rank === stage.cut.kth_rank) piece.prepend(el("b", "kth-mark", "k→ "));
  return r;
}

// One sentence on why the stage removed or changed what it did, from the trace's numbers.
function why(stage) {
  const c = stage.cut;
  const out = `${stage.removed} of ${stage.n_before} removed`;
  if (c.kind === "top-k") {
    return `keeps the ${c.k} largest logits: the k-th is #${c.kth_rank + 1} (logit ${num(c.kth_logit)}); ${out}`;
  }
  if (c.kind === "top-p") {
    return `the running sum reaches p = ${short(c.p)} at #${c.kept} (${c.cum_kept.toFixed(4)}; `
      + `${c.cum_before_last.toFixed(4)} before it): ${c.kept} kept, ${out}`;
  }
  if (c.kind === "min-p") {
    return `threshold p × top = ${short(c.p)} × ${pct(c.top_prob)} = ${pct(c.threshold_prob)} `
      + `(logit ≥ ${num(c.threshold_logit)}): ${out}`;
  }
  if (c.kind === "temperature") {
    const how = c.entropy_after < c.entropy_before ? "sharper" : c.entropy_after > c.entropy_before ? "flatter" : "unchanged";
    return `logits ÷ t = ${short(c.t)}${c.delta ? ` (± ${short(c.delta)} by entropy)` : ""}: entropy `
      + `${c.entropy_before.toFixed(3)} → ${c.entropy_after.toFixed(3)} nats, ${how}`
      + (stage.removed ? `; ${out}` : "");
  }
  if (stage.changed) return `${stage.changed} logit${stage.changed === 1 ? "" : "s"} changed (before → after)`
    + (stage.removed ? `; ${out}` : "");
  return stage.removed ? out : stage.effect === "selector" ? "" : "nothing removed or changed";
}

// top-p: the running sum of the input's probabilities down the shown candidates, and the threshold p.
function cumulativeChart(stage) {
  const rows = stage.rows;
  const W = 300, H = 70, pad = 4;
  const x = (i) => pad + (rows.length === 1 ? 0 : (i * (W - 2 * pad)) / (rows.length - 1));
  const y = (v) => H - pad - v * (H - 2 * pad);
  const chart = svg("svg", { class: "cumulative", viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": "cumulative probability and top-p's threshold" });
  chart.appendChild(svg("line", { class: "threshold", x1: 0, x2: W, y1: y(stage.cut.p), y2: y(stage.cut.p),
    "data-value": stage.cut.p }));
  const label = svg("text", { x: W - pad, y: y(stage.cut.p) - 3, "text-anchor": "end" });
  label.textContent = `p = ${short(stage.cut.p)}`;
  chart.appendChild(label);
  const cutAt = rows.findIndex((r) => !r.kept);
  if (cutAt > 0) {
    const cx = (x(cutAt - 1) + x(cutAt)) / 2;
    chart.appendChild(svg("line", { class: "cut-line", x1: cx, x2: cx, y1: 0, y2: H }));
  }
  chart.appendChild(svg("polyline", { class: "cum",
    points: rows.map((r, i) => `${x(i).toFixed(1)},${y(r.cum).toFixed(1)}`).join(" ") }));
  rows.forEach((r, i) => chart.appendChild(svg("circle", { class: r.kept ? "kept" : "removed", cx: x(i),
    cy: y(r.cum), r: 2.5, "data-id": r.id })));
  return chart;
}

function stageCard(stage, step, first) {
  const card = el("div", "stage " + (stage.effect || "input"));
  card.dataset.name = stage.name;
  card.dataset.scale = stage.scale;
  const h = el("h3", null, stage.name);
  h.appendChild(el("span", "scale", stage.scale === "logit" ? "logits" : "probabilities"));
  const about = el("p", "about", stage.about);
  const params = fmtParams(stage.params);
  const meta = el("div", "meta", (params ? params + " · " : "") + `${stage.size} candidate${stage.size === 1 ? "" : "s"}`
    + (stage.n_masked ? ` (${stage.n_masked} masked)` : "")
    + (stage.selected !== null ? ` · selected ${JSON.stringify(step.piece)}` : ""));
  card.append(h, about, meta);
  const reason = first ? "" : why(stage);
  if (reason) card.appendChild(el("p", "why", reason));
  if (stage.cut.kind === "top-p") card.appendChild(cumulativeChart(stage));
  const scale = scaleOf(stage);
  const bars = el("div", "bars" + (stage.cut.kind === "top-p" ? " with-cum" : ""));
  if (stage.cut.kind === "min-p") {
    const thr = el("div", "threshold", `┆ threshold ${pct(stage.cut.threshold_prob)} = ${short(stage.cut.p)} × top`);
    thr.dataset.value = String(stage.cut.threshold_prob);
    bars.appendChild(thr);
  }
  if (stage.cut.kind === "top-p") {
    bars.append(el("span", "head"), el("span", "head"), el("span", "head", "p"), el("span", "head", "Σ p"));
  }
  let prev = -1;
  let cutDrawn = false;
  stage.rows.forEach((row, i) => {
    if (row.rank > prev + 1) {
      bars.appendChild(el("div", "gap", `… ${row.rank - prev - 1} more`));
    }
    // a prefix cut: every shown candidate from here on is removed
    if (!cutDrawn && !row.kept && stage.rows.slice(i).every((r) => !r.kept) && i > 0) {
      bars.appendChild(el("div", "cut", `✂ ${stage.n_before - stage.removed} kept · ${stage.removed} removed`));
      cutDrawn = true;
    }
    bars.appendChild(barRow(stage, row, scale, step.token, first));
    prev = row.rank;
  });
  card.appendChild(bars);
  return card;
}

function render(data) {
  const step = data.steps[data.steps.length - 1];
  $("#prompt-text").textContent = data.prompt;
  $("#generated").replaceChildren(...data.steps.slice(0, -1).map((g) => {
    const s = el("span", "gen", g.piece);
    s.dataset.id = String(g.token);
    return s;
  }));
  const box = $("#stages");
  box.replaceChildren(...step.stages.map((stage, i) => stageCard(stage, step, i === 0)));
  const traced = new Set(step.stages.map((s) => s.name));
  const inactive = $("#mode").value === "1" || $("#mode").value === "2" ? []
    : chain.filter((s) => !traced.has(KINDS[s.kind].trace)).map((s) => KINDS[s.kind].trace);
  $("#summary").textContent = `step ${data.steps.length}: selected ${JSON.stringify(step.piece)} (id ${step.token})`
    + (step.rejected !== null ? ` · the grammar refused id ${step.rejected} first` : "")
    + (inactive.length ? ` · left out, no-ops with these parameters: ${inactive.join(", ")}` : "");
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
  const restart = () => { nSteps = 0; schedule(); };
  $("#chat").addEventListener("change", restart);
  $("#prompt").addEventListener("input", restart);
  $("#trace").addEventListener("click", runTrace);
  $("#reset").addEventListener("click", () => { nSteps = 0; runTrace(); });
  $("#step").addEventListener("click", () => {  // disabled while busy, after the end and at the limit
    nSteps = shownSteps + 1;
    runTrace();
  });
  runTrace();
}

main();
