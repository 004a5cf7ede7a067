/* Live pages: the server pushes a page's state (Server-Sent Events) each time it changes.
   Where a stream cannot be held (no EventSource, or the server answers 503 because it holds
   all the streams it may) the page polls instead, and tries the stream again later. */
"use strict";

window.GPUFlexLive = (function () {
  const RETRY_STREAM_MS = 30000;

  function follow(opts) {
    // opts: streamUrl, pollUrl, onData(d), active(d) -> bool, pollMs
    const active = opts.active || function () { return true; };
    let pollTimer = null;
    let streaming = false;

    function poll() {
      pollTimer = null;
      if (streaming) return;
      fetch(opts.pollUrl, { headers: { Accept: "application/json" }, credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (d) {
          if (d) opts.onData(d);
          if (d === null || active(d)) pollTimer = setTimeout(poll, opts.pollMs);
        })
        .catch(function () { pollTimer = setTimeout(poll, opts.pollMs * 3); });
    }

    function stream() {
      if (!window.EventSource) { poll(); return; }
      const es = new EventSource(opts.streamUrl);
      es.addEventListener("state", function (e) {
        streaming = true;
        if (pollTimer) { clearTimeout(pollTimer); pollTimer = null; }
        const d = JSON.parse(e.data);
        opts.onData(d);
        if (!active(d)) es.close();  // ended: nothing more will change
      });
      es.onerror = function () {
        // CONNECTING: the browser reconnects by itself (the stream's lifetime ended, or the
        // network blinked). CLOSED: it was refused; poll, and try streaming again later.
        if (es.readyState === EventSource.CLOSED) {
          streaming = false;
          if (!pollTimer) poll();
          setTimeout(stream, RETRY_STREAM_MS);
        }
      };
    }

    stream();
  }

  return { follow: follow };
})();
