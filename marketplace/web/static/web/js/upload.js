/* Chunked, resumable uploads for the submit page (docs/uploads.md): the file's SHA-256 is
   computed a slice at a time (WebCrypto has no incremental digest, and a whole large file
   would not fit in memory), then the file goes up in 8 MiB chunks with Content-Range; a
   dropped connection asks the server where it stands and goes on from there. */
"use strict";

window.GPUFlexUpload = (function () {
  const K = new Uint32Array([
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2]);

  /* SHA-256 fed in pieces: update(Uint8Array) any number of times, then hex(). */
  function Sha256() {
    this.h = new Uint32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                              0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19]);
    this.w = new Uint32Array(64);
    this.tail = new Uint8Array(64);
    this.tailLen = 0;
    this.length = 0;
  }
  Sha256.prototype.block = function (b, o) {
    const w = this.w, h = this.h;
    for (let i = 0; i < 16; i++) {
      w[i] = (b[o + 4 * i] << 24) | (b[o + 4 * i + 1] << 16) | (b[o + 4 * i + 2] << 8) | b[o + 4 * i + 3];
    }
    for (let i = 16; i < 64; i++) {
      const x = w[i - 15], y = w[i - 2];
      const s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3);
      const s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10);
      w[i] = (w[i - 16] + s0 + w[i - 7] + s1) | 0;
    }
    let a = h[0], b2 = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (let i = 0; i < 64; i++) {
      const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
      const t1 = (hh + S1 + ((e & f) ^ (~e & g)) + K[i] + w[i]) | 0;
      const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
      const t2 = (S0 + ((a & b2) ^ (a & c) ^ (b2 & c))) | 0;
      hh = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b2; b2 = a; a = (t1 + t2) | 0;
    }
    h[0] += a; h[1] += b2; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
  };
  Sha256.prototype.update = function (data) {
    let i = 0;
    this.length += data.length;
    if (this.tailLen) {
      while (this.tailLen < 64 && i < data.length) this.tail[this.tailLen++] = data[i++];
      if (this.tailLen < 64) return;
      this.block(this.tail, 0);
      this.tailLen = 0;
    }
    for (; i + 64 <= data.length; i += 64) this.block(data, i);
    while (i < data.length) this.tail[this.tailLen++] = data[i++];
  };
  Sha256.prototype.hex = function () {
    const bits = this.length * 8;
    const pad = new Uint8Array(((this.tailLen + 9 + 63) & ~63) - this.tailLen);
    pad[0] = 0x80;
    const view = new DataView(pad.buffer);
    view.setUint32(pad.length - 8, Math.floor(bits / 0x100000000));
    view.setUint32(pad.length - 4, bits >>> 0);
    this.update(pad);
    return Array.from(this.h, function (x) { return (x >>> 0).toString(16).padStart(8, "0"); }).join("");
  };

  const CHUNK = 8 * 1024 * 1024;

  function sha256OfFile(file, onProgress) {
    const hash = new Sha256();
    let at = 0;
    function next() {
      if (at >= file.size) return Promise.resolve(hash.hex());
      const end = Math.min(at + CHUNK, file.size);
      return file.slice(at, end).arrayBuffer().then(function (buf) {
        hash.update(new Uint8Array(buf));
        at = end;
        onProgress(at, file.size);
        return next();
      });
    }
    return next();
  }

  function call(method, url, csrf, body, headers) {
    return fetch(url, {
      method: method, body: body, credentials: "same-origin",
      headers: Object.assign({ "X-CSRFToken": csrf, Accept: "application/json" }, headers || {}),
    }).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (d) {
        if (!r.ok) {
          const err = new Error(d.detail || "The server answered " + r.status + ".");
          err.status = r.status; err.code = d.error;
          throw err;
        }
        return d;
      });
    });
  }

  /* Upload `file`; resolves to the finished upload ({id, …}). onProgress(phase, done, total)
     with phase "hashing" or "uploading". */
  function upload(file, base, csrf, onProgress) {
    let failures = 0;
    return sha256OfFile(file, function (d, t) { onProgress("hashing", d, t); })
      .then(function (sha) {
        return call("POST", base, csrf, JSON.stringify({ filename: file.name, size: file.size, sha256: sha }),
                    { "Content-Type": "application/json" });
      })
      .then(function sendFrom(up) {
        onProgress("uploading", up.received, file.size);
        if (up.received >= file.size) return call("POST", base + up.id + "/finish/", csrf);
        const end = Math.min(up.received + CHUNK, file.size);
        return call("PUT", base + up.id + "/", csrf, file.slice(up.received, end), {
          "Content-Type": "application/octet-stream",
          "Content-Range": "bytes " + up.received + "-" + (end - 1) + "/" + file.size,
        }).then(function (next) { failures = 0; return sendFrom(next); }, function (err) {
          // a dropped connection (no status) or a chunk the server did not take whole:
          // ask where it stands and go on from there, a few times
          const retry = !err.status || err.status >= 500 || err.code === "chunk_out_of_order" || err.code === "bad_chunk";
          if (!retry || ++failures > 5) throw err;
          return new Promise(function (ok) { setTimeout(ok, 1000 * failures); })
            .then(function () { return call("GET", base + up.id + "/", csrf); })
            .then(sendFrom);
        });
      });
  }

  return { upload: upload, Sha256: Sha256 };
})();
