/* The submit page: checks the spec as the buyer types (problems inline, with their line),
   shows the market's estimate, and uploads the form with XHR so that a progress bar can
   follow the dataset; a large one goes first in resumable chunks (upload.js). Without
   JavaScript the form still posts and shows the same errors. */
"use strict";

(function () {
  const form = document.getElementById("job-form");
  const spec = document.getElementById("id_spec");
  const problems = document.getElementById("problems");
  const status = document.getElementById("spec-status");
  const formError = document.getElementById("form-error");
  // not form.dataset: the form has a field named "dataset", which shadows that property
  const csrf = form.querySelector("input[name=csrfmiddlewaretoken]").value;
  let timer = null;
  let seq = 0;
  let uploaded = null; // the finished chunked upload of the file chosen, once there is one

  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }

  function showProblems(list) {
    problems.innerHTML = list.map(function (p) {
      const where = (p.line ? "line " + p.line + " · " : "") + p.field;
      return '<li data-line="' + (p.line || "") + '"><span class="where">' + esc(where) + "</span>" + esc(p.reason) + "</li>";
    }).join("");
    spec.classList.toggle("invalid", list.length > 0);
  }

  // clicking a problem selects its line in the editor
  problems.addEventListener("click", function (e) {
    const li = e.target.closest("li");
    const line = li && Number(li.dataset.line);
    if (!line) return;
    const lines = spec.value.split("\n");
    const start = lines.slice(0, line - 1).join("\n").length + (line > 1 ? 1 : 0);
    spec.focus();
    spec.setSelectionRange(start, start + lines[line - 1].length);
  });

  function duration(s) {
    if (s < 90) return Math.round(s) + " s";
    if (s < 5400) return Math.round(s / 60) + " min";
    return (s / 3600).toFixed(1) + " h";
  }

  function noEstimate(why) {
    document.getElementById("estimate-figures").hidden = true;
    const empty = document.getElementById("estimate-empty");
    empty.hidden = false;
    empty.textContent = why;
  }

  function showEstimate(est) {
    const figures = document.getElementById("estimate-figures");
    const empty = document.getElementById("estimate-empty");
    if (!est) {
      noEstimate("No node online at or under your max price right now; the job would wait for one.");
      return;
    }
    figures.hidden = false;
    empty.hidden = true;
    document.getElementById("est-nodes").textContent = est.nodes;
    const gpuSeconds = est.gpu_hours * 3600;
    document.getElementById("est-gpu").textContent = gpuSeconds < 90 ? gpuSeconds.toFixed(1) + " GPU-s" :
      gpuSeconds < 5400 ? (gpuSeconds / 60).toFixed(1) + " GPU-min" : est.gpu_hours.toFixed(2) + " GPU-h";
    document.getElementById("est-time").textContent = duration(est.seconds);
    document.getElementById("est-price").textContent = est.price_low === est.price_high ?
      est.price_low : est.price_low + " – " + est.price_high;
    document.getElementById("est-cost").textContent = est.cost;
  }

  function check() {
    const body = new FormData();
    body.append("spec", spec.value);
    body.append("tier", form.elements.tier.value);
    body.append("federated_dataset", form.elements.federated_dataset.value);
    body.append("max_price_per_gpu_hour", form.elements.max_price_per_gpu_hour.value);
    const mine = ++seq;
    fetch(form.getAttribute("data-estimate-url"), { method: "POST", body: body, headers: { "X-CSRFToken": csrf, Accept: "application/json" },
      credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(function (d) {
        if (mine !== seq) return; // an older answer arriving late
        showProblems(d.problems || []);
        status.textContent = d.ok ? "✓ valid spec" : "";
        if (d.ok) showEstimate(d.estimate);
        else noEstimate("Fix the problems in the spec to see an estimate.");
      })
      .catch(function () { status.textContent = ""; });
  }

  function later() { clearTimeout(timer); timer = setTimeout(check, 400); }
  spec.addEventListener("input", later);
  form.elements.tier.addEventListener("change", later);
  form.elements.max_price_per_gpu_hour.addEventListener("input", later);
  // Tab indents in the editor instead of leaving it
  spec.addEventListener("keydown", function (e) {
    if (e.key !== "Tab" || e.shiftKey) return;
    e.preventDefault();
    spec.setRangeText("  ", spec.selectionStart, spec.selectionEnd, "end");
    later();
  });

  function showProgress(phase, done, total) {
    const pct = total ? Math.round(100 * done / total) : 100;
    const file = form.elements.dataset.files[0];
    document.getElementById("upload-progress").hidden = false;
    document.getElementById("upload-progress").querySelector(".bar span").style.width = pct + "%";
    // "uploading rows.csv: 40%": which file, when the page has been left for a while
    document.getElementById("upload-phase").textContent = phase + (file ? " " + file.name : "");
    document.getElementById("upload-pct").textContent = pct;
  }

  function failed(message) {
    const button = document.getElementById("submit-btn");
    button.disabled = false;
    button.textContent = "Submit job";
    formError.textContent = message;
    formError.hidden = false;
  }

  function post(body, file) {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", form.action);
    xhr.setRequestHeader("Accept", "application/json");
    xhr.setRequestHeader("X-CSRFToken", csrf);
    if (file) {
      xhr.upload.addEventListener("progress", function (ev) {
        if (ev.lengthComputable) showProgress("uploaded", ev.loaded, ev.total);
      });
    }
    xhr.onload = function () {
      let d = {};
      try { d = JSON.parse(xhr.responseText); } catch (err) { d = { error: "The server answered " + xhr.status + "." }; }
      if (xhr.status < 300 && d.redirect) { window.location.assign(d.redirect); return; }
      showProblems(d.problems || []);
      const fields = d.fields || {};
      const extra = Object.keys(fields).map(function (k) { return k + ": " + fields[k].join(" "); });
      failed([d.error || "The job was not submitted."].concat(extra).join(" "));
    };
    xhr.onerror = function () { failed("The upload failed: check your connection and try again."); };
    xhr.send(body);
  }

  form.addEventListener("submit", function (e) {
    e.preventDefault();
    const button = document.getElementById("submit-btn");
    const file = form.elements.dataset.files[0];
    button.disabled = true;
    button.textContent = "Submitting…";
    formError.hidden = true;
    const body = new FormData(form);
    const chunkedAbove = Number(form.getAttribute("data-chunked-above"));
    if (!file || file.size <= chunkedAbove) { post(body, file); return; }
    // a large file: resumable chunks first (upload.js), then the form names the upload;
    // submitted again (a spec fixed after an error), the same file is not sent twice
    const key = [file.name, file.size, file.lastModified].join("/");
    const sent = uploaded && uploaded.key === key ? Promise.resolve(uploaded.upload) :
      window.GPUFlexUpload.upload(file, form.getAttribute("data-upload-url"), csrf, showProgress);
    button.textContent = "Uploading…";
    sent
      .then(function (up) {
        uploaded = { key: key, upload: up };
        form.elements.dataset_upload.value = up.id;
        body.delete("dataset");
        body.set("dataset_upload", up.id);
        button.textContent = "Submitting…";
        post(body, null);
      })
      .catch(function (err) { failed("The upload failed: " + err.message); });
  });

  check();
})();
