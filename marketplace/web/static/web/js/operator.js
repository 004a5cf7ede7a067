/* The operator's overview: its cards and recent jobs, updated as the server pushes them
   (live.js) when jobs, nodes or money change. */
"use strict";

(function () {
  const page = document.getElementById("operator-page");

  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
  function counts(byState) {
    return Object.keys(byState).map(function (k) { return byState[k] + " " + k; }).join(" · ");
  }

  function render(d) {
    document.getElementById("op-online").textContent = d.nodes_online;
    document.getElementById("op-node-states").textContent = counts(d.nodes_by_state);
    document.getElementById("op-running").textContent = d.jobs_by_status.running || 0;
    document.getElementById("op-job-states").textContent = counts(d.jobs_by_status);
    document.getElementById("op-registered").textContent = d.nodes_registered;
    const n = d.ledger.problems.length;
    document.getElementById("op-ledger").innerHTML = '<div class="label">Ledger</div>' + (d.ledger.ok
      ? '<div class="value" style="color:var(--good)">Balanced</div><div class="sub">' + d.ledger.checks + " checks passed</div>"
      : '<div class="value" style="color:var(--poor)">' + n + " problem" + (n === 1 ? "" : "s") + '</div><div class="sub">see below</div>');
    const rows = d.jobs.map(function (j) {
      return '<tr><td><a href="' + esc(j.url) + '">' + esc(j.name) + "</a></td><td>" + esc(j.buyer) +
        '</td><td><span class="badge ' + esc(j.status) + '">' + esc(j.status) + '</span></td><td class="num">' +
        esc(j.rounds_done) + "</td></tr>";
    });
    document.getElementById("op-jobs").innerHTML = rows.length ? rows.join("") :
      '<tr><td colspan="4" class="empty">No jobs.</td></tr>';
  }

  GPUFlexLive.follow({
    streamUrl: page.dataset.eventsUrl, pollUrl: page.dataset.liveUrl, pollMs: 5000, onData: render,
  });
})();
