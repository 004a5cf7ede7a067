"""A platform agent as its zone's aggregator (jobs with `aggregation.hierarchy: zones`).

Members of the zone upload their updates here instead of to the coordinator
(`PUT /zone/v1/rounds/<round>/tasks/<task>`, docs/agent-api.md "Zones"). Each upload carries
the member token the coordinator gave the member with its task (trainer.zones: an HMAC over
task, node and samples under a key the coordinator derives per round and aggregator), and is
checked as the coordinator checks a flat upload: `trainer.compression.decode_any` against the
round's model, with the spec's norm bound. The aggregator sends the coordinator ONE partial
per round and zone (`PUT agent/zone/partial`): the samples-weighted sum and a manifest of its
members. It flushes when every task the coordinator says it should expect is in, or when it
has held updates for `max_hold_s` (a member that never comes must not hold the others past
their leases), and drops members the coordinator no longer expects before it does.

Never unpickles: safetensors and JSON only. Holds each member's decoded update until its
partial is accepted (a zone's fan-in times the model's size), so a partial can be rebuilt
without a member that dropped out.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from torch import Tensor

from desktop.client import ApiError, MarketplaceClient, Unavailable
from trainer.compression import decode_any
from trainer.lora import update_part
from trainer.nesting import TooDeep, loads_json
from trainer.spec import parse_spec
from trainer.updates import UpdateRejected, decode_state
from trainer.zones import TOKEN_HEADER, Member, PartialSum, encode_partial, token_ok

log = logging.getLogger(__name__)

MAX_BODY = 256 * 1024 * 1024  # the coordinator's MAX_UPDATE_BYTES default
_PATH = re.compile(r"^/zone/v1/rounds/(\d+)/tasks/([0-9a-fA-F-]{1,64})$")


@dataclass
class _Round:
    round_id: int
    job_id: str
    key: str
    reference: dict[str, Tensor]
    max_norm: float
    held: dict[str, tuple[dict[str, Tensor], Member]] = field(default_factory=dict)
    done: dict[str, str] = field(default_factory=dict)  # task -> hash, in an accepted partial
    since: float | None = None  # when the oldest held update came
    zone: str = ""


class Refused(Exception):
    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


class ZoneAggregator:
    """The zone's buffer of member updates, and the flushes to the coordinator."""

    def __init__(
        self,
        client: MarketplaceClient,
        zone: str,
        *,
        max_hold_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.zone = zone
        self.max_hold_s = max_hold_s
        self.clock = clock
        self.rounds: dict[int, _Round] = {}
        self.partials_sent = 0
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- members

    def _round(self, round_id: int) -> _Round:
        with self._lock:
            known = self.rounds.get(round_id)
        if known is not None:
            return known
        try:
            info = self.client.zone_round(round_id)
            model, _ = decode_state(self.client.zone_model(round_id))
        except Unavailable:
            raise Refused(503, "unavailable", "the coordinator cannot be reached") from None
        except ApiError as exc:
            raise Refused(404, "not_found", f"no such round here ({exc.detail})") from None
        spec = parse_spec(info["spec"])
        made = _Round(
            round_id, str(info["job_id"]), str(info["key"]), update_part(spec.model, model),
            spec.aggregation.max_update_norm, zone=self.zone,
        )  # fmt: skip
        with self._lock:
            return self.rounds.setdefault(round_id, made)

    def receive(
        self, round_id: int, task_id: str, node_id: str, samples: int, token: str,
        metrics: dict[str, float], body: bytes,
    ) -> int:  # fmt: skip
        """Check and hold one member's update; 202 held, 200 the same bytes again."""
        rnd = self._round(round_id)
        if not token_ok(rnd.key, token, task_id, node_id, samples):
            raise Refused(403, "bad_token", "the zone token does not match this task and node")
        digest = hashlib.sha256(body).hexdigest()
        with self._lock:
            held = rnd.held.get(task_id)
            previous = held[1].update_hash if held else rnd.done.get(task_id)
        if previous is not None:
            if previous == digest:
                return 200
            raise Refused(409, "conflict", "a different update was already taken for this task")
        try:
            delta, _ = decode_any(body, rnd.reference, max_norm=rnd.max_norm)
        except UpdateRejected as exc:
            raise Refused(422, "update_rejected", f"the update was rejected: {exc}") from None
        member = Member(task_id, node_id, digest, samples, metrics)
        with self._lock:
            rnd.held[task_id] = (delta, member)
            rnd.since = rnd.since if rnd.since is not None else self.clock()
        self.maybe_flush(round_id)
        return 202

    # ----------------------------------------------------------------- flushing

    def maybe_flush(self, round_id: int, *, force: bool = False) -> bool:
        """Send the round's partial once every expected member is in (or `force`)."""
        rnd = self.rounds.get(round_id)
        if rnd is None or not rnd.held:
            return False
        try:
            info = self.client.zone_round(round_id)
        except Unavailable:
            return False
        except ApiError:
            with self._lock:
                rnd.held.clear()
            return False
        expected = set(info["expected"])
        with self._lock:
            if not info["open"]:  # closed: the coordinator takes no partial for it now
                log.info("zone round %s closed with %d updates held", round_id, len(rnd.held))
                rnd.held.clear()
                rnd.since = None
                return False
            for gone in set(rnd.held) - expected:  # released, or settled another way
                del rnd.held[gone]
            if not rnd.held or (not force and not expected <= set(rnd.held)):
                return False
            held = dict(rnd.held)
        return self._send(rnd, held)

    def _send(self, rnd: _Round, held: dict[str, tuple[dict[str, Tensor], Member]]) -> bool:
        partial = PartialSum()
        for delta, member in held.values():
            partial.add(delta, member)
        data = encode_partial(partial, job_id=rnd.job_id, round_id=str(rnd.round_id),
                              zone=rnd.zone)  # fmt: skip
        try:
            self.client.put_partial(data)
        except Unavailable:
            return False  # kept: the next tick tries again
        except ApiError as exc:
            # refused whole: the coordinator released these members' tasks to be redone
            log.warning("zone partial for round %s refused: %s", rnd.round_id, exc)
            with self._lock:
                for task_id in held:
                    rnd.held.pop(task_id, None)
                rnd.since = self.clock() if rnd.held else None
            return False
        with self._lock:
            for task_id, (_, member) in held.items():
                rnd.held.pop(task_id, None)
                rnd.done[task_id] = member.update_hash
            rnd.since = self.clock() if rnd.held else None
            self.partials_sent += 1
        log.info("zone partial for round %s: %d members", rnd.round_id, len(held))
        return True

    def tick(self) -> None:
        """Flush what is complete, and what was held too long; forget old rounds."""
        for round_id, rnd in list(self.rounds.items()):
            overdue = rnd.since is not None and self.clock() - rnd.since >= self.max_hold_s
            self.maybe_flush(round_id, force=overdue)
        with self._lock:
            for round_id in sorted(self.rounds)[:-8]:  # a few rounds back is plenty
                if not self.rounds[round_id].held:
                    del self.rounds[round_id]


class _Handler(BaseHTTPRequestHandler):
    server: ZoneHTTPServer

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("zone endpoint: " + fmt, *args)

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        try:
            status = self._put()
            self._answer(status, {"accepted": True})
        except Refused as exc:
            self._answer(exc.status, {"error": exc.code, "detail": exc.detail})

    def _put(self) -> int:
        match = _PATH.match(self.path)
        if match is None:
            raise Refused(404, "not_found", "no such endpoint")
        try:
            length = int(self.headers.get("Content-Length", ""))
            samples = int(self.headers.get("X-GPUFlex-Samples", ""))
            node_id = str(int(self.headers.get("X-GPUFlex-Node", "")))
        except ValueError:
            raise Refused(400, "bad_request", "Content-Length, X-GPUFlex-Samples and "
                          "X-GPUFlex-Node must be whole numbers") from None  # fmt: skip
        if not 0 < length <= MAX_BODY:
            raise Refused(413, "too_large", f"an update is 1 to {MAX_BODY} bytes")
        metrics = _metrics(self.headers.get("X-GPUFlex-Metrics"))
        body = self.rfile.read(length)
        return self.server.aggregator.receive(
            int(match.group(1)), match.group(2), node_id, samples,
            self.headers.get(TOKEN_HEADER, ""), metrics, body,
        )  # fmt: skip


def _metrics(header: str | None) -> dict[str, float]:
    if not header:
        return {}
    try:
        raw = loads_json(header)
    except (json.JSONDecodeError, TooDeep):
        raise Refused(400, "bad_request", "X-GPUFlex-Metrics is not a JSON object") from None
    if not isinstance(raw, dict):
        raise Refused(400, "bad_request", "X-GPUFlex-Metrics is not a JSON object")
    return {
        str(k): float(v)
        for k, v in raw.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and abs(v) < 1e12
    }


class ZoneHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], aggregator: ZoneAggregator) -> None:
        super().__init__(address, _Handler)
        self.aggregator = aggregator


class ZoneService:
    """The endpoint and the flush ticker, in daemon threads, for the agent's lifetime."""

    def __init__(self, aggregator: ZoneAggregator, listen: str, tick_s: float = 1.0) -> None:
        host, _, port = listen.rpartition(":")
        self.aggregator = aggregator
        self.server = ZoneHTTPServer((host or "0.0.0.0", int(port)), aggregator)
        self.tick_s = tick_s
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self.server.serve_forever, name="gpuflex-zone", daemon=True),
            threading.Thread(target=self._ticker, name="gpuflex-zone-tick", daemon=True),
        ]

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _ticker(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.aggregator.tick()
            except Exception:  # a bad tick must not end the service: say so, go on
                log.exception("zone aggregator tick failed")

    def stop(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()
