/* The job page: renders the live payload, then again each time the server pushes a new one
   (live.js), so that every panel (charts, the rounds timeline, the node table and node states,
   the topology, the cost and the provenance chain) changes without a reload. */
"use strict";

(function () {
  const page = document.getElementById("job-page");
  const url = page.dataset.liveUrl;
  let data = JSON.parse(document.getElementById("live-data").textContent);
  let accChart = null;
  let lossChart = null;
  let lastKey = "";

  function el(id) { return document.getElementById(id); }
  function text(id, value) { const e = el(id); if (e) e.textContent = value; }
  function fmt(v, digits) { return v == null ? "—" : Number(v).toFixed(digits); }
  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }

  function series(d) {
    const done = d.rounds.filter(function (r) { return r.accuracy != null; });
    return {
      x: done.map(function (r) { return r.number; }),
      acc: done.map(function (r) { return r.accuracy; }),
      loss: done.map(function (r) { return r.loss; }),
    };
  }

  function drawCharts(d) {
    const s = series(d);
    if (!accChart) {
      accChart = GFCharts.line(el("chart-acc"), [{ label: "accuracy" }], [s.x, s.acc],
        { xLabel: "round", integerX: true, yRange: [0, 1], format: function (v) { return v.toFixed(3); } });
      lossChart = GFCharts.line(el("chart-loss"), [{ label: "loss", color: "#d98e04" }], [s.x, s.loss],
        { xLabel: "round", integerX: true, format: function (v) { return v.toFixed(3); } });
    } else {
      accChart.setData([s.x, s.acc]);
      lossChart.setData([s.x, s.loss]);
    }
    el("chart-acc").dataset.points = String(s.x.length);
    const last = s.x.length - 1;
    text("stat-acc", last >= 0 ? fmt(s.acc[last], 3) : "—");
    text("stat-loss", last >= 0 ? fmt(s.loss[last], 3) : "—");
  }

  function drawTimeline(d) {
    const parts = [];
    for (let n = 1; n <= d.max_rounds && n <= 200; n++) {
      const r = d.rounds.find(function (x) { return x.number === n; });
      const cls = r ? r.status : "";
      const tip = r ? ("round " + n + ": " + r.status + (r.accuracy != null ? ", accuracy " + fmt(r.accuracy, 3) : "") +
        (r.seconds != null ? ", " + r.seconds + " s" : "")) : ("round " + n);
      parts.push('<span class="r ' + esc(cls) + '" title="' + esc(tip) + '">' + n + "</span>");
    }
    el("timeline").innerHTML = parts.join("");
    const open = d.rounds.find(function (r) { return r.status === "open"; });
    // no node online can take the job: say why (the price cap against the cheapest node that
    // fits, in figures) rather than that its round trains
    const stranded = d.node_states && d.node_states.nodes === 0;
    text("timeline-note", d.status === "running" && open ? "Round " + open.number +
      (stranded ? " waits: " + d.node_states.summary + "." : " is training now.") :
      (d.stop_reason ? "Ended: " + d.stop_reason + "." :
        (d.reached_target ? "Stopped early: the target was reached." : "")));
    text("stat-rounds", String(d.rounds_done));
    el("rounds-bar").style.width = Math.min(100, 100 * d.rounds_done / d.max_rounds) + "%";
  }

  function drawNodes(d) {
    const rows = d.nodes.map(function (n) {
      return "<tr><td><strong>" + esc(n.name) + '</strong><div class="small muted">' + esc(n.kind) + "</div></td>" +
        "<td>" + esc(n.gpu) + '</td><td class="num">' + fmt(n.health, 2) + "</td>" +
        '<td class="num"><span class="badge ' + esc(n.band) + '">' + (n.rtt_ms == null ? "—" : esc(n.rtt_ms) + " ms") + "</span></td>" +
        '<td><div class="share"><div class="bar"><span style="width:' + (100 * n.share).toFixed(1) + '%"></span></div>' +
        (100 * n.share).toFixed(0) + "%</div></td>" +
        '<td class="num">' + n.results + '</td><td><span class="badge ' + esc(n.state) + '" title="' + esc(n.reason || "") + '">' +
        esc(n.state) + "</span>" + (n.reason ? '<div class="small muted">' + esc(n.reason) + "</div>" : "") + "</td></tr>";
    });
    el("node-rows").innerHTML = rows.length ? rows.join("") :
      '<tr><td colspan="7" class="empty">Waiting for nodes to pick up the first tasks…</td></tr>';
    text("node-summary", d.node_states ? d.node_states.summary : "");
    text("sandbox-note", d.sandbox || "");
  }

  function drawTopology(d) {
    const t = d.topology;
    const s = t.size;
    const c = t.centre;
    let svg = '<svg viewBox="0 0 ' + s + " " + s + '" role="img" aria-label="server and nodes, links coloured by RTT">';
    t.nodes.forEach(function (n) {
      svg += '<line class="link ' + esc(n.band) + '" x1="' + c + '" y1="' + c + '" x2="' + n.x + '" y2="' + n.y + '"><title>' +
        esc(n.name) + ": " + (n.rtt_ms == null ? "RTT unknown" : n.rtt_ms + " ms") + "</title></line>";
    });
    svg += '<circle class="server" cx="' + c + '" cy="' + c + '" r="26"></circle>' +
      '<text class="server-label" x="' + c + '" y="' + (c + 4) + '">server</text>';
    t.nodes.forEach(function (n) {
      // a label that fits and tells the nodes apart (jobview.topology), the full name as tooltip
      const tip = "<title>" + esc(n.name) + (n.rtt_ms == null ? "" : ", " + n.rtt_ms + " ms") + "</title>";
      svg += '<g class="topo-node" data-name="' + esc(n.name) + '">' +
        '<circle class="node ' + esc(n.state) + '" cx="' + n.x + '" cy="' + n.y + '" r="16">' + tip + "</circle>" +
        '<text x="' + n.x + '" y="' + (n.y + 4) + '">' + esc(n.rtt_ms == null ? "?" : Math.round(n.rtt_ms)) + "</text>" +
        '<text class="node-label" x="' + n.x + '" y="' + (n.y + 30) + '">' + esc(n.label || n.name) + tip + "</text></g>";
    });
    if (!t.nodes.length) {
      svg += '<text x="' + c + '" y="' + (c + 50) + '" fill="#646b82">no nodes yet</text>';
    }
    el("topology").innerHTML = svg + "</svg>";
  }

  function drawCost(d) {
    const cost = d.cost;
    if (!cost.available) {
      text("stat-cost", "—");
      text("cost-note", "Cost figures are not available on this server yet.");
      el("cost-kv").innerHTML = "<dt>Budget</dt><dd>" + esc(cost.budget) + "</dd>";
      return;
    }
    text("stat-cost", cost.shown.spent);  // with the digits it has: small jobs cost fractions of a cent
    text("stat-budget", "of " + Number(cost.budget).toFixed(2) + " budget");
    const bar = el("cost-bar");
    bar.style.width = Math.min(100, 100 * cost.fraction) + "%";
    bar.parentElement.classList.toggle("warn", cost.fraction > 0.8);
    const labels = [["budget", "Budget"], ["held", "Held in escrow"], ["spent", "Spent"],
      ["provider_share", "Paid to providers"], ["platform_fee", "Platform fee"], ["bonus", "Bonuses"],
      ["redundancy_cost", "Verification replicas"], ["refunded", "Refunded"]];
    el("cost-kv").innerHTML = labels.filter(function (l) { return cost[l[0]] != null; }).map(function (l) {
      return "<dt>" + l[1] + "</dt><dd>" + esc(cost.shown[l[0]]) + "</dd>";
    }).join("");
  }

  function drawPrivacy(d) {
    const p = d.privacy;
    el("privacy-card").hidden = !p;
    if (!p) return;
    const spent = p.epsilon_spent == null ? 0 : p.epsilon_spent;
    text("stat-epsilon", spent.toFixed(2));
    text("stat-privacy", (p.epsilon != null ? "of ε " + p.epsilon + ", " : "") + "δ " + p.delta +
      ", " + p.mode + "-level, noise " + Number(p.noise_multiplier).toFixed(2));
    el("epsilon-bar").style.width = (p.epsilon ? Math.min(100, 100 * spent / p.epsilon) : 0) + "%";
  }

  function drawTrials(d) {
    // a sweep's trials table: new trials, states, rounds and values as they move
    const body = el("trial-rows");
    if (!body || !d.trials) return;
    const rows = d.trials.rows.map(function (t) {
      const params = Object.keys(t.params).map(function (k) { return esc(k) + "=" + esc(t.params[k]); }).join(", ");
      const num = t.url ? '<a href="' + esc(t.url) + '">' + t.number + "</a>" : String(t.number);
      return "<tr" + (t.number === d.trials.best ? ' class="best"' : "") + "><td>" + num + "</td>" +
        '<td class="small">' + params + '</td><td><span class="badge ' + esc(t.state) + '">' + esc(t.state) + "</span>" +
        (t.error ? ' <span class="muted small">' + esc(t.error.slice(0, 80)) + "</span>" : "") + "</td>" +
        "<td>" + t.rounds + "</td><td>" + (t.value == null ? "—" : esc(t.value)) + "</td><td>" + esc(t.cost) + "</td></tr>";
    });
    body.innerHTML = rows.length ? rows.join("") : '<tr><td colspan="6" class="muted">No trial started yet.</td></tr>';
  }

  function drawProvenance(d) {
    // the chain grows by a record as each round closes, and is verified again each time
    const p = d.provenance;
    if (!p) return;
    const badge = el("provenance-status");
    const verdict = p.ok === true ? ["ok", "chain verified"] : p.ok === false ? ["bad", "verification failed"] :
      ["", "no rounds yet"];
    badge.className = "badge " + verdict[0];
    badge.textContent = verdict[1];
    const has = p.records.length > 0;
    el("provenance-note").hidden = !has;
    el("provenance-table").hidden = !has;
    el("provenance-empty").hidden = has;
    text("provenance-head", p.head.slice(0, 16) + "…");
    text("provenance-shown", p.count > p.records.length ?
      " · the latest " + p.records.length + " of " + p.count + " records" : "");
    el("provenance-rows").innerHTML = p.records.map(function (r) {
      return "<tr><td>" + esc(r.round) + "</td><td>" + esc(r.strategy) + '</td><td class="num">' +
        esc(r.contributions) + '</td><td class="mono">' + esc(r.output) + '</td><td class="mono">' +
        esc(r.hash) + "</td></tr>";
    }).join("");
    el("provenance-problems").innerHTML = p.problems.map(function (x) { return "<li>" + esc(x) + "</li>"; }).join("");
  }

  function drawStatus(d) {
    const badge = el("job-status");
    badge.textContent = d.status;
    badge.className = "badge " + d.status;
    document.querySelectorAll("[data-when]").forEach(function (f) {
      f.hidden = f.dataset.when.split(" ").indexOf(d.status) < 0;
    });
    el("download-model").hidden = !d.has_model;
  }

  function render(d) {
    // redraw only what changed: the poll runs every second and usually brings nothing new
    const key = JSON.stringify(d);
    if (key === lastKey) return;
    lastKey = key;
    drawStatus(d);
    drawPrivacy(d);
    drawCharts(d);
    drawTimeline(d);
    drawNodes(d);
    drawTopology(d);
    drawCost(d);
    drawTrials(d);
    drawProvenance(d);
  }

  function active(d) { return d.status === "running" || d.status === "paused"; }


  document.querySelectorAll("[data-confirm]").forEach(function (f) {
    f.addEventListener("submit", function (e) { if (!window.confirm(f.dataset.confirm)) e.preventDefault(); });
  });
  render(data);
  // a finished job changes no more: its page already holds its final round
  if (active(data)) {
    GPUFlexLive.follow({
      streamUrl: page.dataset.eventsUrl, pollUrl: url, pollMs: 1000, active: active,
      onData: function (d) { data = d; render(d); },
    });
  }
})();
