// One job: its card, attempts on a time axis, GPU memory, the log tail, the failure, the events.
"use strict";

const JOB = decodeURIComponent(location.pathname.split("/").pop());
const KINDS = ["phase", "progress", "failure", "metric", "info", "launched", "exited", "verdict", "action", "stacks", "straggler", "gpu_fault", "gpu", "alert", "daemon_restarted", "gpu_wait", "state"];
const PHASES = {"(none)": "#c7c7c7", startup: "#9edae5", config: "#aec7e8", distributed_init: "#c5b0d5",
  model_init: "#dbdb8d", weight_loading: "#ff7f0e", weights_loaded: "#ffbb78", kv_cache_profile: "#bcbd22",
  cuda_graph_capture: "#8c564b", engine_ready: "#17becf", running: "#1f77b4", done: "#2ca02c"};
const ORDER = Object.keys(PHASES).slice(1);
const MAX_ROWS = 2000;
const events = [];  // every event of the job received, in id order
const hidden = new Set();
document.title = "supervise: " + JOB;

function passes(e) {
  const grep = document.getElementById("grep").value.toLowerCase();
  return !hidden.has(e.kind) && (!grep || e.message.toLowerCase().includes(grep));
}

function eventRow(e) {
  const detail = e.kind === "phase" && e.phase ? `${e.phase}: ${e.message}` : e.message;
  return el("li", { class: e.kind, "data-id": e.id, title: detail.length > 200 ? detail.slice(0, 2000) : null }, `${clock(e.ts)} #${e.attempt} `, el("b", { text: e.kind }), " " + detail);
}

function renderEvents() {
  const shown = events.filter(passes).slice(-MAX_ROWS);
  document.getElementById("events").replaceChildren(...shown.map(eventRow));
}

function onEvent(e) {
  events.push(e);
  if (passes(e)) {
    const list = document.getElementById("events");
    const atEnd = list.scrollTop + list.clientHeight >= list.scrollHeight - 4;
    list.append(eventRow(e));
    if (atEnd) list.scrollTop = list.scrollHeight;
    if (list.children.length > MAX_ROWS) list.firstElementChild.remove();
  }
  later("log", 1000, loadLog);
  later("gpu", 5000, loadGpu);
}

const timers = {};
function later(key, ms, fn) {  // at most one call per `ms`, the latest wins
  if (timers[key]) return;
  timers[key] = setTimeout(() => { timers[key] = null; fn(); }, ms);
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  for (const c of children) node.append(c);
  return node;
}

function spans(a, evs, end) {  // (phase, from, to): phases only move forward, as the watchdog sees them
  const out = [];
  let cur = "(none)", since = a.started;
  for (const e of evs) {
    const ph = e.phase || (e.kind === "progress" ? e.data.phase : null);
    if ((e.kind !== "phase" && e.kind !== "progress") || !ORDER.includes(ph)) continue;
    if (cur !== "(none)" && ORDER.indexOf(ph) <= ORDER.indexOf(cur)) continue;
    const at = Math.max(e.ts, since);
    if (at > since) out.push([cur, since, at]);
    cur = ph; since = at;
  }
  out.push([cur, since, Math.max(end, since)]);
  return out;
}

function marker(e) {  // [symbol, colour, title] for the facts `supervise report` marks
  if (e.kind === "failure") return ["▲", "#d62728", "failure: " + e.message];
  if (e.kind === "verdict" && e.data.verdict && e.data.verdict !== "healthy") return ["■", "#6a3d9a", "verdict: " + e.message];
  if (e.kind === "action" && /kill/i.test(e.message)) return ["✕", "#000", "action: " + e.message];
  if (e.kind === "launched" && e.attempt > 1) return ["▶", "#2ca02c", "relaunch: " + e.message];
  return null;
}

function renderTimeline(attempts, now) {
  const box = document.getElementById("timeline");
  if (!attempts.length) { box.replaceChildren(el("p", { class: "muted", text: "no attempts yet" })); return; }
  const shown = attempts.slice(-12);
  const t0 = shown[0].started, t1 = Math.max(now, ...shown.map((a) => a.ended || now));
  const W = 1000, L = 40, lane = 22, H = shown.length * lane + 20;
  const x = (t) => L + (W - L - 10) * (t - t0) / Math.max(1e-6, t1 - t0);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "attempts over time" });
  const seen = new Set();
  shown.forEach((a, i) => {
    const y = i * lane + 4;
    const evs = events.filter((e) => e.attempt === a.n);
    root.append(svg("text", { x: 2, y: y + 14 }, "#" + a.n));
    for (const [ph, from, to] of spans(a, evs, a.ended || now)) {
      seen.add(ph);
      root.append(svg("rect", { x: x(from), y, width: Math.max(1, x(to) - x(from)), height: lane - 6, fill: PHASES[ph] },
        svg("title", {}, `#${a.n} ${ph} ${dur(to - from)}`)));
    }
    for (const e of evs) {
      const m = marker(e);
      if (m) root.append(svg("text", { x: x(e.ts) - 5, y: y + 13, fill: m[1], class: "marker" }, m[0], svg("title", {}, m[2])));
    }
  });
  root.append(svg("text", { x: L, y: H - 4 }, clock(t0)), svg("text", { x: W - 70, y: H - 4 }, clock(t1)));
  box.replaceChildren(root);
  document.getElementById("legend").replaceChildren(...[...seen].map((p) => el("span", {}, el("i", { style: `background:${PHASES[p]}` }), p)),
    el("span", { text: "▲ failure ■ verdict ✕ kill ▶ relaunch" }));
}

function renderFailure(attempts) {
  const failed = [...attempts].reverse().find((a) => a.failure);
  // No probe named a failure: the verdict's reason quotes the log's last line, the evidence there is.
  const unnamed = failed ? null : [...attempts].reverse().find((a) => a.reason && a.verdict && a.verdict !== "done"
    && a.verdict !== "healthy");
  const section = document.getElementById("failure-section");
  section.hidden = !failed && !unnamed;
  if (unnamed) {
    document.getElementById("failure-line").textContent = `attempt #${unnamed.n}: ${unnamed.verdict}: ${unnamed.reason}`;
    document.getElementById("traceback").textContent = "";
    return;
  }
  if (!failed) return;
  document.getElementById("failure-line").textContent = `attempt #${failed.n}: ${failed.failure.kind}: ${failed.failure.line}`;
  document.getElementById("traceback").textContent = failed.failure.traceback || failed.failure.line;
}

function renderJob() {
  const s = live.status;
  if (!s || !s.jobs.length) return;
  const box = document.getElementById("card");
  const card = patchCard(box.querySelector(".card"), jobCard(s.jobs[0], s.read_only));
  if (card.parentNode !== box) box.replaceChildren(card);
}

function onStatus(s) {
  renderJob();
  renderTimeline(s.attempts, s.now);
  renderFailure(s.attempts);
}

async function loadLog() {
  const r = await api(`/api/jobs/${encodeURIComponent(JOB)}/log?lines=200`);
  if (r.status === 404) { refused(await r.text()); return; }
  if (!r.ok) return;
  const tail = await r.json();
  const pre = document.getElementById("log");
  const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  pre.textContent = tail.lines.join("\n") + (tail.partial ? "\n" + tail.partial : "");
  if (atEnd) pre.scrollTop = pre.scrollHeight;
}

async function loadGpu() {
  const r = await api(`/api/jobs/${encodeURIComponent(JOB)}/gpu`);
  if (!r.ok) return;
  const g = await r.json();
  const box = document.getElementById("gpu-chart");
  if (!g.samples.length) { box.replaceChildren(el("p", { class: "muted", text: "no GPU samples over the job's span" })); return; }
  const W = 1000, H = 200, L = 50;
  const top = Math.max(...g.samples.map((s) => s.total_mib));
  const x = (t) => L + (W - L - 10) * (t - g.since) / Math.max(1e-6, g.until - g.since);
  const y = (m) => H - 15 - (H - 25) * m / top;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "GPU memory over time" });
  const colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];
  const byGpu = {};
  for (const s of g.samples) (byGpu[s.gpu] ||= []).push(s);
  for (const [gpu, pts] of Object.entries(byGpu))
    root.append(svg("polyline", { fill: "none", stroke: colours[gpu % 8], "stroke-width": 1.5,
      points: pts.map((s) => `${x(s.ts).toFixed(1)},${y(s.used_mib).toFixed(1)}`).join(" ") }, svg("title", {}, "GPU " + gpu)));
  root.append(svg("text", { x: 2, y: 12 }, `${top} MiB`), svg("text", { x: 2, y: H - 15 }, "0"),
    svg("text", { x: L, y: H - 2 }, clock(g.since)), svg("text", { x: W - 70, y: H - 2 }, clock(g.until)));
  box.replaceChildren(root);
}

for (const k of KINDS) {
  const box = el("input", { type: "checkbox", checked: true, "data-kind": k });
  box.addEventListener("change", () => { box.checked ? hidden.delete(k) : hidden.add(k); renderEvents(); });
  document.getElementById("filters").append(el("label", {}, box, " " + k));
}
document.getElementById("grep").addEventListener("input", renderEvents);
function onSummary(s) {  // the daemon sends the latest events and milestones, and counts the rest
  const parts = Object.entries(s.left_out).map(([k, n]) => `${n.toLocaleString()} ${k}`);
  const box = document.getElementById("left-out");
  box.textContent = `earlier events not shown: ${parts.join(", ")} (\`supervise events ${JOB}\` lists them all)`;
  box.hidden = false;
}

connect(`?job=${encodeURIComponent(JOB)}&after=0`, onEvent, onStatus, onSummary);
setInterval(renderJob, 1000);  // countdowns and ages, from the last status: no request
loadLog(); loadGpu();
