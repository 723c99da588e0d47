// Shared by the overview and the job page: formatting, the job card, the event stream, actions.
"use strict";

// The token: in the fragment of the URL `supervise web` printed (never sent to any server), then
// in this tab's sessionStorage (this origin's only: scheme, host and port), sent as a header.
// No cookie: cookies go to every port of the host.
const TOKEN = (() => {
  const found = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (found) {
    sessionStorage.setItem("supervise-token", decodeURIComponent(found[1]));
    history.replaceState(null, "", location.pathname + location.search);  // out of the address bar
  }
  return sessionStorage.getItem("supervise-token");
})();
// The printed URL opened in a tab already on the page changes only the fragment (no reload):
// reload, and the new token is taken as above.
window.addEventListener("hashchange", () => { if (/(?:^#|&)token=/.test(location.hash)) location.reload(); });

function refused(line) {
  document.body.replaceChildren(el("p", { class: "refused", text: line }));
}

if (!TOKEN) {
  document.addEventListener("DOMContentLoaded", () =>
    refused("no valid token: open the URL that `supervise web` printed (it ends in #token=...)"));
}

async function api(path, init) {
  if (!TOKEN) return new Response("", { status: 401 });
  const options = Object.assign({}, init || {});
  options.headers = Object.assign({}, options.headers || {}, { Authorization: "Bearer " + TOKEN });
  const r = await fetch(path, options);
  if (r.status === 401) refused(await r.text());
  return r;
}

const ACTIVE = new Set(["starting", "waiting", "running", "backoff", "unreachable"]);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") node.textContent = v; else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function dur(s) {
  if (s === null || s === undefined || !isFinite(s)) return "–";
  s = Math.max(0, Math.round(s));
  if (s < 90) return s + "s";
  if (s < 5400) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor(s / 60) % 60).padStart(2, "0") + "m";
}

function clock(ts) { return new Date(ts * 1000).toLocaleTimeString(); }

function rate(sPerIt) {
  if (!sPerIt) return "–";
  return sPerIt < 1 ? (1 / sPerIt).toFixed(1) + " it/s" : sPerIt.toFixed(1) + " s/it";
}

function num(x) { return Number.isInteger(x) ? String(x) : x.toFixed(1); }

// The page's clock: statuses carry the daemon's time; countdowns run on from when one arrived.
const live = { status: null, receivedAt: 0 };
function elapsed() { return (performance.now() - live.receivedAt) / 1000; }

// An ETA only while the bar's attempt is watched (`live`) and the countdown from its last step
// has not run out; once it has, how long the bar has stood still; nothing for an ended attempt.
function etaText(p, live) {
  if (!live) return null;
  const left = p.eta_s === null || p.eta_s === undefined ? null : p.eta_s - elapsed();
  if (left !== null && left > 0) return "ETA " + dur(left);
  if (p.still_s !== null && p.still_s !== undefined) return "still " + dur(p.still_s + elapsed());
  return null;
}

function progressBar(p, live) {
  if (!p) return null;
  const pct = p.total ? Math.min(100, 100 * p.done / p.total) : 0;
  const count = `${num(p.done)}${p.total ? "/" + num(p.total) + ` (${Math.floor(pct)}%)` : ""}`;
  const eta = etaText(p, live);
  return el("div", { class: "progress" },
    el("div", { class: "bar", "data-done": p.done, "data-total": p.total ?? "" },
      el("div", { style: `width:${pct}%` }), el("span", { text: count })),
    el("div", { class: "row" }, el("span", { class: "probe", text: p.probe }),
      live ? el("span", { text: rate(p.rate_s_per_it) }) : null, eta ? el("span", { class: "eta", text: eta }) : null));
}

function health(job) {
  if (!ACTIVE.has(job.state)) return null;
  const nv = job.next_verdict;
  if (job.next_relaunch_in_s !== null && job.next_relaunch_in_s !== undefined)
    return el("span", { class: "health warn", text: `relaunch in ${dur(job.next_relaunch_in_s - elapsed())}` });
  if (!nv) return el("span", { class: "health", text: "healthy" });
  const left = nv.in_s - elapsed();
  return el("span", { class: "health " + (left < 30 ? "bad" : "warn"), title: nv.reason,
    text: `→ ${nv.verdict} in ${dur(left)}` });
}

// The bound a stall verdict (a kill, by default) would use for each watched bar, and where it came from.
function stallBounds(job) {
  const bounds = ACTIVE.has(job.state) ? job.stall_bounds || [] : [];
  if (!bounds.length) return null;
  return el("div", { class: "bounds" }, ...bounds.map((b) => el("div", { class: "bound",
    text: `stall bound ${dur(b.bound_s)} (${b.source}) for ${b.bar}, ${dur(Math.max(0, b.in_s - elapsed()))} left` })));
}

// What an ended attempt used, as `status` says it: CPU, peak memory, GPU-hours.
function usageText(u) {
  const parts = [];
  if (u.cpu_s !== null && u.cpu_s !== undefined) parts.push("cpu " + (u.cpu_s < 1 ? u.cpu_s.toFixed(2) + "s" : dur(u.cpu_s)));
  if (u.peak_memory_mib !== null && u.peak_memory_mib !== undefined)
    parts.push(`peak memory ${u.peak_memory_mib.toLocaleString("en")} MiB${u.peak_memory_sampled ? " (sampled)" : ""}`);
  const gpus = Object.entries(u.gpu_peak_mib || {});
  if (gpus.length) parts.push(`${(u.gpu_s / 3600).toFixed(2)} GPU-hours (` +
    gpus.map(([g, mib]) => `GPU ${g} ${mib.toLocaleString("en")} MiB`).join(", ") + " at most)");
  return parts.length ? "used " + parts.join(", ") : "";
}

function jobCard(job, readOnly) {
  const a = job.attempt;
  const stop = !readOnly && ACTIVE.has(job.state)
    ? el("button", { class: "stop", "data-job": job.name, text: "Stop" }) : null;
  if (stop) stop.addEventListener("click", () => act(job.name, "stop", stop));
  const restart = readOnly ? null : el("button", { class: "restart", "data-job": job.name, text: "Restart" });
  if (restart) restart.addEventListener("click", () => act(job.name, "restart", restart));
  // Postpone a pending kill (health.action = warn_then_kill), or let it come: `supervise hold/release`.
  const hold = !readOnly && ACTIVE.has(job.state)
    ? el("button", { class: "hold", "data-job": job.name, text: "Hold" }) : null;
  if (hold) hold.addEventListener("click", () => act(job.name, "hold", hold));
  const release = !readOnly && ACTIVE.has(job.state)
    ? el("button", { class: "release", "data-job": job.name, text: "Release" }) : null;
  if (release) release.addEventListener("click", () => act(job.name, "release", release));
  const sh = job.shards;  // a sharded job: its shards at a glance and their summed bar, each shard below
  const facts = el("div", { class: "row" },
    sh ? el("span", { class: "attempt", text: `shards ${sh.done}/${sh.total} done, ${sh.running} running, ${sh.failed} failed` })
      : el("span", { class: "attempt", text: a ? `attempt ${a.run_attempt}/${job.max_attempts} (#${a.n})` : "no attempt" }),
    sh ? null : el("span", { class: "phase", text: "phase " + ((a && a.phase) || "–") }),
    sh ? null : health(job),  // a sharded job's health is each shard's, on its card
    job.last_output_age_s !== null && job.last_output_age_s !== undefined && ACTIVE.has(job.state)
      ? el("span", { class: "age", text: `output ${dur(job.last_output_age_s + elapsed())} ago` }) : null,
    job.host !== "local" ? el("span", { text: job.host }) : null,
    !sh && a && a.usage ? el("span", { class: "usage", text: usageText(a.usage) }) : null);
  return el("div", { class: "card job", "data-job": job.name, "data-state": job.state },
    el("h3", {}, el("a", { href: "/job/" + encodeURIComponent(job.name), text: job.name }),
      el("span", { class: "badge " + job.state, text: job.state }), stop, hold, release, restart),
    facts, sh ? progressBar(sh.progress_done === null ? null : { probe: "all shards", done: sh.progress_done,
      total: sh.progress_total, rate_s_per_it: null, eta_s: sh.eta_s }, job.state === "running")
      : progressBar(a && a.progress, job.state === "running" && !!a && a.state === "running"),
    sh ? null : stallBounds(job),
    job.reason ? el("div", { class: "reason", text: job.reason }) : null,
    job.shards ? el("div", { class: "shards" }, ...job.shards.shards.map((s) => shardCard(job, s))) : null,
    el("div", { class: "msg" }));
}

// A sharded job's shard (or its gather step), under its job's card: the same facts as a job's.
function shardCard(job, shard) {
  const a = shard.attempt;
  const name = shard.shard < 0 ? "gather" : "shard " + shard.shard;
  const facts = el("div", { class: "row" },
    el("span", { class: "attempt", text: a ? `attempt ${a.run_attempt}/${job.max_attempts} (#${a.n})` : "no attempt" }),
    el("span", { class: "phase", text: "phase " + ((a && a.phase) || "–") }),
    health(shard),
    shard.last_output_age_s !== null && shard.last_output_age_s !== undefined && ACTIVE.has(shard.state)
      ? el("span", { class: "age", text: `output ${dur(shard.last_output_age_s + elapsed())} ago` }) : null,
    shard.host !== "local" && shard.host !== "-" ? el("span", { text: shard.host }) : null);
  const failed = a && shard.state === "failed" ? (a.failure ? a.failure.line : a.reason) : null;
  return el("div", { class: "card shard", "data-shard-of": job.name, "data-shard": shard.shard, "data-state": shard.state },
    el("h4", {}, el("span", { text: name }), el("span", { class: "badge " + shard.state, text: shard.state })),
    facts, progressBar(a && a.progress, shard.state === "running" && !!a && a.state === "running"), failed ? el("div", { class: "reason", text: failed }) : null);
}

// Redraw a card in place: only the parts that changed are replaced, so a button under the
// pointer survives the once-a-second redraw, and an action's answer (.msg) stays.
function patchCard(old, fresh) {
  if (!old) return fresh;
  if (old.children.length !== fresh.children.length) {
    fresh.querySelector(".msg").replaceWith(old.querySelector(".msg"));
    old.replaceWith(fresh);
    return fresh;
  }
  for (const attr of ["data-state"]) old.setAttribute(attr, fresh.getAttribute(attr));
  [...fresh.children].forEach((child, i) => {
    const mine = old.children[i];
    if (!child.classList.contains("msg") && mine.outerHTML !== child.outerHTML) mine.replaceWith(child);
  });
  return old;
}

// Stop and Restart end a run that may have taken hours to get where it is: asked first.
const CONFIRM = {
  stop: (job) => `Stop ${job}? Its whole process tree is killed (TERM, then KILL after its grace).`,
  restart: (job) => `Restart ${job}? A running attempt is stopped first, and a new run starts from attempt 1.`,
};

async function act(job, verb, button) {
  if (CONFIRM[verb] && !window.confirm(CONFIRM[verb](job))) return;
  button.disabled = true;
  const msg = button.closest(".card").querySelector(".msg");
  msg.textContent = verb + "…";
  try {
    const r = await api(`/api/jobs/${encodeURIComponent(job)}/${verb}`,
      { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" });
    const text = await r.text();
    const body = r.ok ? JSON.parse(text) : null;  // restart answers {stopped, started}
    msg.textContent = body ? (body.message || body.started.message) : text;
  } catch (e) {
    msg.textContent = String(e);
  }
}

// The live feed.  The browser's EventSource reconnects by itself after a drop (a daemon
// restart) and sends the last event id it saw; the daemon replays from there.
function connect(query, onEvent, onStatus) {
  const conn = document.getElementById("conn");
  if (!TOKEN) return new EventTarget();  // nothing of the page runs without it
  // An event stream cannot send a header: the token goes in its own URL, to this origin only.
  const url = "/api/stream" + (query ? query + "&" : "?") + "token=" + encodeURIComponent(TOKEN);
  const source = new EventSource(url);
  source.addEventListener("open", () => { conn.textContent = "live"; conn.className = "conn"; });
  source.addEventListener("error", () => {
    conn.textContent = "reconnecting…"; conn.className = "conn down";
    // A refusal (401: a stale token; 404, 421) closes an EventSource for good without saying
    // why (it cannot read the answer): ask once more, and show the server's line.
    if (source.readyState === EventSource.CLOSED) whyClosed(url, conn);
  });
  source.addEventListener("job-event", (m) => onEvent(JSON.parse(m.data)));
  source.addEventListener("status", (m) => {
    live.status = JSON.parse(m.data);
    live.receivedAt = performance.now();
    onStatus(live.status);
  });
  return source;
}

async function whyClosed(url, conn) {
  const abort = new AbortController();
  try {
    const r = await api(url, { signal: abort.signal });  // api() shows a 401's line itself
    if (r.status !== 401 && !r.ok) refused(await r.text());
    else if (r.ok) conn.textContent = "disconnected: reload the page";
  } catch (e) {
    conn.textContent = "disconnected: " + e;
  } finally {
    abort.abort();  // a stream that answered: its headers were enough
  }
}

function gpuBlock(devices, note, pidJobs) {
  if (!devices.length) return el("p", { class: "muted", text: note || "no GPUs" });
  const box = el("div");
  for (const d of devices) {
    const pct = d.total_mib ? 100 * d.used_mib / d.total_mib : 0;
    const procs = el("ul");
    for (const p of d.processes)
      procs.append(el("li", { text: `pid ${p.pid}: ${p.used_mib} MiB` + (pidJobs[p.pid] ? ` (${pidJobs[p.pid]})` : "") }));
    box.append(el("div", { class: "gpu" }, el("b", { text: `GPU ${d.index} ${d.name}` }),
      el("div", { class: "bar" }, el("div", { style: `width:${pct}%` }),
        el("span", { text: `${d.used_mib} / ${d.total_mib} MiB` + (d.util_pct !== null ? ` · ${d.util_pct}% util` : "") })),
      d.processes.length ? procs : null));
  }
  return box;
}
