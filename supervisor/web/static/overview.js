// The overview: every job's card and the GPUs, redrawn from each status the stream pushes.
"use strict";

function renderOverview() {
  const s = live.status;
  if (!s) return;
  const jobs = document.getElementById("jobs");
  const kept = {};  // an action's answer stays on its card across redraws
  for (const m of jobs.querySelectorAll(".card .msg[data-keep]")) kept[m.closest(".card").dataset.job] = m.textContent;
  jobs.replaceChildren(...(s.jobs.length ? s.jobs.map((j) => jobCard(j, s.read_only)) : [el("p", { class: "muted", text: "no jobs yet" })]));
  for (const [job, text] of Object.entries(kept)) {
    const m = jobs.querySelector(`.card[data-job="${CSS.escape(job)}"] .msg`);
    if (m) { m.textContent = text; m.dataset.keep = "1"; }
  }
  document.getElementById("gpus").replaceChildren(gpuBlock(s.gpus, s.gpu_note, s.pid_jobs));
}

connect("", () => {}, renderOverview);
setInterval(renderOverview, 1000);  // countdowns and ages, from the last status: no request
