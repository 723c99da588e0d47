// Shared by the overview and the job page: formatting, the job card, the event stream, actions.
"use strict";

// The token: in the fragment of the URL `supervise web` printed (never sent to any server), then
// in this tab's sessionStorage (this origin's only: scheme, host and port).  It is never sent
// itself: see `prove` below.  No cookie: cookies go to every port of the host.
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

// SHA-256 (FIPS 180-4) and HMAC (RFC 2104), written out: crypto.subtle exists only in a secure
// context, and a page served with --allow-remote over plain http is not one.
const K256 = new Uint32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2]);

function sha256(bytes) {
  const rotr = (x, n) => (x >>> n) | (x << (32 - n));
  const h = new Uint32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19]);
  const padded = new Uint8Array((bytes.length + 72) & ~63);
  padded.set(bytes);
  padded[bytes.length] = 0x80;
  const view = new DataView(padded.buffer);
  view.setUint32(padded.length - 4, bytes.length * 8);  // the messages here are short: the high word is 0
  const w = new Uint32Array(64);
  for (let block = 0; block < padded.length; block += 64) {
    for (let i = 0; i < 16; i++) w[i] = view.getUint32(block + 4 * i);
    for (let i = 16; i < 64; i++) {
      const s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >>> 3);
      const s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >>> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    let [a, b, c, d, e, f, g, k] = h;
    for (let i = 0; i < 64; i++) {
      const t1 = (k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i]) | 0;
      const t2 = ((rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      k = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
    }
    [a, b, c, d, e, f, g, k].forEach((x, i) => { h[i] += x; });  // a Uint32Array wraps modulo 2^32
  }
  const out = new Uint8Array(32);
  h.forEach((x, i) => new DataView(out.buffer).setUint32(4 * i, x));
  return out;
}

function hex(bytes) { return [...bytes].map((b) => b.toString(16).padStart(2, "0")).join(""); }

function hmacHex(key, message) {
  let k = new TextEncoder().encode(key);
  if (k.length > 64) k = sha256(k);
  const pad = (byte) => { const p = new Uint8Array(64).fill(byte); k.forEach((x, i) => { p[i] ^= x; }); return p; };
  const join = (x, y) => { const z = new Uint8Array(x.length + y.length); z.set(x); z.set(y, x.length); return z; };
  return hex(sha256(join(pad(0x5c), sha256(join(pad(0x36), new TextEncoder().encode(message))))));
}

// Whatever answers on this address is not necessarily the daemon: with the daemon down, any
// program may take its port.  So the tab sends nothing but a random nonce until the server
// proves it knows the token (an HMAC of that nonce), then sends not the token but a credential
// made for that one server start.  A server that answers without the proof gets nothing more,
// ever: the tab stops.  No answer at all (the daemon restarting) is asked again: a nonce gives
// nothing away.
const RETRY_MS = 1000;
const trust = { bearer: null, pending: null, refused: false };
const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

function conn(text, down) {
  const box = document.getElementById("conn");
  if (box) { box.textContent = text; box.className = down ? "conn down" : "conn"; }
}

function distrust(line) {
  trust.refused = true;
  trust.bearer = null;
  refused(line);
}

async function prove() {  // the bearer to send, or null: send nothing
  if (trust.refused || !TOKEN) return null;
  if (trust.bearer) return trust.bearer;
  trust.pending ||= handshake().finally(() => { trust.pending = null; });
  return trust.pending;
}

async function handshake() {
  const nonce = hex(crypto.getRandomValues(new Uint8Array(16)));
  for (;;) {
    let answer;
    try {
      answer = await fetch("/api/hello?nonce=" + nonce, { cache: "no-store", credentials: "omit" });
    } catch (e) {  // nobody listens: the daemon is down or restarting
      conn("reconnecting…", true);
      await sleep(RETRY_MS);
      continue;
    }
    let hello = null;
    try { hello = answer.ok ? await answer.json() : null; } catch (e) { hello = null; }
    const instance = hello && typeof hello.instance === "string" ? hello.instance : null;
    if (instance !== null && hello.proof === hmacHex(TOKEN, `hello:${nonce}:${instance}`)) {
      trust.bearer = hmacHex(TOKEN, "session:" + instance);
      return trust.bearer;
    }
    distrust("no valid token: the server at this address did not prove it knows this tab's token (another program on " +
             "its port, or a token `supervise web` replaced), and nothing was sent to it: open the URL that " +
             "`supervise web` printed (it ends in #token=...)");
    return null;
  }
}

async function api(path, init) {
  const bearer = await prove();
  if (!bearer) return new Response("", { status: 401 });
  const options = Object.assign({}, init || {});
  options.headers = Object.assign({}, options.headers || {}, { Authorization: "Bearer " + bearer });
  let r;
  try {
    r = await fetch(path, options);
  } catch (e) {
    trust.bearer = null;  // the server went: whoever answers next proves itself first
    throw e;
  }
  if (r.status === 401) distrust(await r.text());
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
    // The program's own word on what it is doing (sd_notify STATUS=), as `status` shows it.
    job.status_line && ACTIVE.has(job.state) ? el("div", { class: "status-line", text: job.status_line }) : null,
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

// The live feed.  The browser's EventSource would reconnect by itself after a drop, sending
// its credential to whatever answers then: it is closed at the first error instead, and a new
// one opened once the server has proved itself again, resuming after the last event id seen.
function connect(query, onEvent, onStatus, onSummary) {
  if (!TOKEN) return;  // nothing of the page runs without it
  let after = null;
  const open = async () => {
    const bearer = await prove();
    if (!bearer) return;
    const params = new URLSearchParams(query);
    if (after !== null) params.set("after", after);
    const path = "/api/stream?" + params;
    // An event stream cannot send a header: the credential goes in its own URL, to this origin only.
    params.set("token", bearer);
    const source = new EventSource("/api/stream?" + params);
    let opened = false;
    source.addEventListener("open", () => { opened = true; conn("live", false); });
    source.addEventListener("error", async () => {
      source.close();
      trust.bearer = null;
      conn("reconnecting…", true);
      // A refusal (404, 421; 401: a stale token) ends a stream before it opens, without saying
      // why (an EventSource cannot read the answer): ask once, through api(), and show the line.
      if (!opened && !(await streamAnswers(path))) return;
      await sleep(RETRY_MS);  // never a tight loop, whatever fails
      open();
    });
    source.addEventListener("job-event", (m) => {
      if (m.lastEventId) after = m.lastEventId;
      onEvent(JSON.parse(m.data));
    });
    source.addEventListener("status", (m) => {
      live.status = JSON.parse(m.data);
      live.receivedAt = performance.now();
      onStatus(live.status);
    });
    if (onSummary) source.addEventListener("summary", (m) => onSummary(JSON.parse(m.data)));
  };
  open();
}

async function streamAnswers(path) {  // false: refused, and the line is shown
  const abort = new AbortController();
  try {
    const r = await api(path, { signal: abort.signal });  // api() shows a 401's line itself
    if (r.status !== 401 && !r.ok) refused(await r.text());
    return r.ok;
  } catch (e) {
    return true;  // no answer: the server went; prove the next one and try again
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
