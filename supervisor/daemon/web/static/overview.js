// The overview: every job's card and the GPUs, redrawn from each status the stream pushes.
"use strict";

function renderOverview() {
  const s = live.status;
  if (!s) return;
  const jobs = document.getElementById("jobs");
  // Running jobs first (what needs watching), each group in the daemon's order.
  const ordered = [...s.jobs.filter((j) => ACTIVE.has(j.state)), ...s.jobs.filter((j) => !ACTIVE.has(j.state))];
  const cards = ordered.map((j) => patchCard(jobs.querySelector(`.card[data-job="${CSS.escape(j.name)}"]`), jobCard(j, s.read_only)));
  if (!cards.length) cards.push(el("p", { class: "muted", text: "no jobs yet" }));
  if (cards.some((c, i) => jobs.children[i] !== c) || jobs.children.length !== cards.length) jobs.replaceChildren(...cards);
  document.getElementById("gpus").replaceChildren(gpuBlock(s.gpus, s.gpu_note, s.pid_jobs));
}

connect("", () => {}, renderOverview);
setInterval(renderOverview, 1000);  // countdowns and ages, from the last status: no request
