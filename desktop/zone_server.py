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

The endpoint faces the network, so a request costs little until it has proved itself:
- the token is checked from the headers before a byte of the body is read, and a body longer
  than the round's model allows is refused (413) unread;
- a token is checked against the round's key held here; only a round not yet known is asked
  of the coordinator, once (a round it does not know is remembered for a while), one lookup
  at a time and at most `lookups_per_minute`, and the round's model is fetched only for a
  member whose token is good;
- the body goes to a temporary file in bounded chunks (hashed on the way), and is read
  whole only to be decoded, a few decodes at a time;
- every connection has a deadline: the headers within `timeout_s`, the body at no less than
  `min_body_rate` bytes a second after them, each read at most `timeout_s`; at most
  `max_connections` connections are served at once, each in its own thread, and one more is
  answered 503 and closed at once;
- bad headers are a 4xx naming the problem (a malformed metric: 400 naming it), never a
  dropped connection.

Never unpickles: safetensors and JSON only. Holds each member's decoded update until the
coordinator takes its partial (200, or 202: received, its worker checks the sum; a zone's
fan-in times the model's size), so a partial can be rebuilt without a member that dropped out.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import math
import re
import socket
import tempfile
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import IO, Any

from torch import Tensor

from desktop.client import ApiError, MarketplaceClient, Unavailable
from trainer.compression import decode_any, max_payload_bytes
from trainer.lora import update_part
from trainer.nesting import TooDeep, loads_json
from trainer.spec import JobSpec, parse_spec
from trainer.updates import UpdateRejected, decode_state
from trainer.zones import TOKEN_HEADER, Member, PartialSum, encode_partial, token_ok

log = logging.getLogger(__name__)

MAX_BODY = 256 * 1024 * 1024  # the coordinator's MAX_UPDATE_BYTES default
_PATH = re.compile(r"^/zone/v1/rounds/(\d{1,18})/tasks/([0-9a-fA-F-]{1,64})$")
_TOKEN = re.compile(r"[0-9a-f]{64}")  # trainer.zones.member_token: an HMAC-SHA256, hex

TIMEOUT_S = 30.0  # headers in, and any one read or write, within this
MIN_BODY_RATE = 64 * 1024  # bytes/s a body must keep up after its headers (0.5 Mbit/s)
MAX_CONNECTIONS = 64  # served at once, a thread each; more are answered 503
LOOKUPS_PER_MINUTE = 60  # coordinator calls for rounds not known here yet
UNKNOWN_ROUND_S = 60.0  # how long a round the coordinator does not know is taken as unknown
UNKNOWN_ROUNDS_KEPT = 1024
MAX_DECODES = 2  # bodies read into memory and decoded at once
CHUNK = 64 * 1024
LINGER_S = 2.0  # after refusing a body unread: time for the client to read the answer
LINGER_BYTES = 1024 * 1024
MAX_METRICS = 32
METRIC_LIMIT = 1e12


@dataclass
class _Round:
    round_id: int
    job_id: str
    key: str
    spec: JobSpec
    max_norm: float
    # the round's model part: fetched for the first member whose token is good
    reference: dict[str, Tensor] | None = None
    max_bytes: int = MAX_BODY  # the longest update of this round's model (once known)
    held: dict[str, tuple[dict[str, Tensor], Member]] = field(default_factory=dict)
    # task -> hash, in a partial the coordinator took (202 received or 200 accepted)
    done: dict[str, str] = field(default_factory=dict)
    since: float | None = None  # when the oldest held update came
    zone: str = ""


class Refused(Exception):
    def __init__(self, status: int, code: str, detail: str, retry_after: int | None = None) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail
        self.retry_after = retry_after


class ZoneAggregator:
    """The zone's buffer of member updates, and the flushes to the coordinator."""

    def __init__(
        self,
        client: MarketplaceClient,
        zone: str,
        *,
        max_hold_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        lookups_per_minute: int = LOOKUPS_PER_MINUTE,
        spool_dir: Path | None = None,
        max_decodes: int = MAX_DECODES,
    ) -> None:
        self.client = client
        self.zone = zone
        self.max_hold_s = max_hold_s
        self.clock = clock
        self.rounds: dict[int, _Round] = {}
        self.partials_sent = 0
        self.lookups = 0  # coordinator calls made for rounds not known here yet
        self.lookups_per_minute = lookups_per_minute
        # where bodies are spooled (the agent's cache folder: /tmp may be memory)
        self.spool_dir = spool_dir
        self._lock = threading.Lock()
        self._lookup_lock = threading.Lock()  # one coordinator lookup at a time
        self._model_lock = threading.Lock()
        self._recent_lookups: deque[float] = deque()
        self._unknown: OrderedDict[int, float] = OrderedDict()  # round -> unknown until
        self._decodes = threading.BoundedSemaphore(max_decodes)

    # ----------------------------------------------------------------- rounds

    def _round(self, round_id: int) -> _Round:
        """The round's key and spec: held here, or asked of the coordinator once."""
        known = self._known(round_id)
        if known is not None:
            return known
        with self._lookup_lock:
            known = self._known(round_id)  # another request may have looked it up meanwhile
            if known is not None:
                return known
            self._spend_lookup()
            try:
                info = self.client.zone_round(round_id)
            except Unavailable:
                raise Refused(503, "unavailable", "the coordinator cannot be reached",
                              retry_after=10) from None  # fmt: skip
            except ApiError as exc:
                with self._lock:
                    self._unknown[round_id] = self.clock() + UNKNOWN_ROUND_S
                    while len(self._unknown) > UNKNOWN_ROUNDS_KEPT:
                        self._unknown.popitem(last=False)
                raise Refused(404, "not_found", f"no such round here ({exc.detail})") from None
            spec = parse_spec(info["spec"])
            made = _Round(
                round_id, str(info["job_id"]), str(info["key"]), spec,
                spec.aggregation.max_update_norm, zone=self.zone,
            )  # fmt: skip
            with self._lock:
                return self.rounds.setdefault(round_id, made)

    def _known(self, round_id: int) -> _Round | None:
        with self._lock:
            known = self.rounds.get(round_id)
            if known is not None:
                return known
            until = self._unknown.get(round_id)
            if until is not None:
                if self.clock() < until:
                    raise Refused(404, "not_found", "no such round here")
                del self._unknown[round_id]
        return None

    def _spend_lookup(self) -> None:
        """A budget for rounds asked of the coordinator: a stream of made-up round numbers
        must not turn into a stream of calls under this node's key."""
        now = self.clock()
        recent = self._recent_lookups
        while recent and now - recent[0] >= 60.0:
            recent.popleft()
        if len(recent) >= self.lookups_per_minute:
            raise Refused(503, "busy", "too many unknown rounds asked about; try again shortly",
                          retry_after=int(60.0 - (now - recent[0])) + 1)  # fmt: skip
        recent.append(now)
        self.lookups += 1

    def reference(self, rnd: _Round) -> dict[str, Tensor]:
        """The round's model part (fetched once); ask only for a member proven by its token."""
        if rnd.reference is None:
            with self._model_lock:
                if rnd.reference is None:
                    try:
                        model, _ = decode_state(self.client.zone_model(rnd.round_id))
                    except Unavailable:
                        raise Refused(503, "unavailable", "the coordinator cannot be reached",
                                      retry_after=10) from None  # fmt: skip
                    except ApiError as exc:
                        raise Refused(404, "not_found",
                                      f"no such round here ({exc.detail})") from None  # fmt: skip
                    reference = update_part(rnd.spec.model, model)
                    rnd.max_bytes = min(MAX_BODY, max_payload_bytes(reference))
                    rnd.reference = reference
        return rnd.reference

    # ----------------------------------------------------------------- members

    def authenticate(
        self, round_id: int, task_id: str, node_id: str, samples: int, token: str
    ) -> _Round:
        """The member's token against the round's key, from the headers alone: 401 without
        a well-formed token (no coordinator call), 403 when it does not match."""
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            raise Refused(401, "no_token", f"{TOKEN_HEADER} is missing, or is not the 64 hex "
                          "digits the coordinator gave with the task")  # fmt: skip
        rnd = self._round(round_id)
        if not token_ok(rnd.key, token, task_id, node_id, samples):
            raise Refused(403, "bad_token", "the zone token does not match this task and node")
        return rnd

    def receive(
        self, round_id: int, task_id: str, node_id: str, samples: int, token: str,
        metrics: dict[str, float], body: bytes,
    ) -> int:  # fmt: skip
        """Check and hold one member's update; 202 held, 200 the same bytes again."""
        rnd = self.authenticate(round_id, task_id, node_id, samples, token)
        digest = hashlib.sha256(body).hexdigest()
        return self._take(rnd, task_id, node_id, samples, metrics, digest, lambda: body)

    def receive_spooled(
        self, rnd: _Round, task_id: str, node_id: str, samples: int,
        metrics: dict[str, float], digest: str, spool: IO[bytes],
    ) -> int:  # fmt: skip
        """`receive` for a body the endpoint spooled (and hashed) after `authenticate`."""

        def read() -> bytes:
            spool.seek(0)
            return spool.read()

        return self._take(rnd, task_id, node_id, samples, metrics, digest, read)

    def _take(
        self, rnd: _Round, task_id: str, node_id: str, samples: int,
        metrics: dict[str, float], digest: str, read: Callable[[], bytes],
    ) -> int:  # fmt: skip
        seen = self._seen(rnd, task_id, digest)
        if seen is not None:
            return seen
        reference = self.reference(rnd)
        with self._decodes:  # a body in memory only while it is decoded, a few at a time
            try:
                delta, _ = decode_any(read(), reference, max_norm=rnd.max_norm)
            except UpdateRejected as exc:
                raise Refused(422, "update_rejected", f"the update was rejected: {exc}") from None
        member = Member(task_id, node_id, digest, samples, metrics)
        with self._lock:
            seen = self._seen_locked(rnd, task_id, digest)  # a twin upload decoded meanwhile
            if seen is not None:
                return seen
            rnd.held[task_id] = (delta, member)
            rnd.since = rnd.since if rnd.since is not None else self.clock()
        self.maybe_flush(rnd.round_id)
        return 202

    def _seen(self, rnd: _Round, task_id: str, digest: str) -> int | None:
        with self._lock:
            return self._seen_locked(rnd, task_id, digest)

    @staticmethod
    def _seen_locked(rnd: _Round, task_id: str, digest: str) -> int | None:
        held = rnd.held.get(task_id)
        previous = held[1].update_hash if held else rnd.done.get(task_id)
        if previous is None:
            return None
        if previous == digest:
            return 200
        raise Refused(409, "conflict", "a different update was already taken for this task")

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
            # 202 is success too: the coordinator holds the partial, and its worker's check
            # releases the members itself should it refuse the sum
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


# ---------------------------------------------------------------------- the endpoint


class _DeadlineSocket(io.RawIOBase):
    """The connection's reads, each bounded by the request's deadline and by `timeout_s`:
    a client that sends its request a byte at a time still runs out of time."""

    def __init__(self, sock: socket.socket, handler: _Handler) -> None:
        self._sock = sock
        self._handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._handler.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request was not sent in time")
        self._sock.settimeout(min(left, self._handler.server.timeout_s))
        return self._sock.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    server: ZoneHTTPServer
    deadline: float
    _unread: int  # body bytes the client announced and this request has not read

    def setup(self) -> None:
        super().setup()
        self.deadline = time.monotonic() + self.server.timeout_s
        self._unread = 0
        self.rfile.close()  # replaced: the same socket, read under the deadline
        self.rfile = io.BufferedReader(_DeadlineSocket(self.connection, self), CHUNK)

    def handle_one_request(self) -> None:
        self.deadline = time.monotonic() + self.server.timeout_s  # the headers' deadline
        self._unread = 0
        super().handle_one_request()

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("zone endpoint: " + fmt, *args)

    def _answer(self, status: int, body: dict[str, Any], retry_after: int | None = None) -> None:
        data = json.dumps(body).encode()
        self.connection.settimeout(self.server.timeout_s)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def do_PUT(self) -> None:
        try:
            status = self._put()
            self._answer(status, {"accepted": True})
        except Refused as exc:
            self._answer(exc.status, {"error": exc.code, "detail": exc.detail}, exc.retry_after)
            self._linger()
        except OSError:
            raise  # the connection failed or ran out of time: closed, nothing to answer
        except Exception:  # a bug must still get an answer, and never end the server
            log.exception("zone endpoint: a PUT failed")
            self._answer(500, {"error": "internal", "detail": "the aggregator failed"})
            self._linger()

    def _linger(self) -> None:
        """After refusing a body unread: the answer goes out first, then a little of the body
        is read and dropped, so the client is not reset before it reads the answer."""
        if self._unread <= 0:
            return
        with contextlib.suppress(OSError):
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.deadline = min(self.deadline, time.monotonic() + LINGER_S)
            left = min(self._unread, LINGER_BYTES)
            while left > 0:
                chunk = self.rfile.read1(min(CHUNK, left))
                if not chunk:
                    break
                left -= len(chunk)

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
        self._unread = max(length, 0)
        if not 0 < length <= MAX_BODY:
            raise Refused(413, "too_large", f"an update is 1 to {MAX_BODY} bytes")
        if not 0 < samples <= 10**12:
            raise Refused(400, "bad_request", "X-GPUFlex-Samples must be 1 or more")
        round_id, task_id = int(match.group(1)), match.group(2)
        aggregator = self.server.aggregator
        # the token before anything else, from the headers: nothing of the body read yet
        rnd = aggregator.authenticate(
            round_id, task_id, node_id, samples, self.headers.get(TOKEN_HEADER, "")
        )
        metrics = _metrics(self.headers.get("X-GPUFlex-Metrics"))
        aggregator.reference(rnd)  # the round's size bound
        if length > rnd.max_bytes:
            raise Refused(413, "too_large", f"an update of this round's model is at most "
                          f"{rnd.max_bytes} bytes")  # fmt: skip
        # proven: the body may take its time, at the least rate a member's link should keep
        self.deadline = time.monotonic() + self.server.timeout_s + length / self.server.min_rate
        try:
            spool = tempfile.TemporaryFile(dir=aggregator.spool_dir)  # noqa: SIM115 - `with` below
        except OSError as exc:
            raise _cannot_spool(exc) from None
        with spool:
            digest = self._spool(length, spool)
            return aggregator.receive_spooled(rnd, task_id, node_id, samples, metrics, digest,
                                              spool)  # fmt: skip

    def _spool(self, length: int, spool: IO[bytes]) -> str:
        """The body into `spool` in chunks of at most CHUNK, hashed on the way."""
        digest = hashlib.sha256()
        while self._unread > 0:
            chunk = self.rfile.read1(min(CHUNK, self._unread))
            if not chunk:
                raise ConnectionError(f"the client sent {length - self._unread} of {length} bytes")
            digest.update(chunk)
            self._unread -= len(chunk)
            try:
                spool.write(chunk)
            except OSError as exc:  # the disk, not the client: say so
                raise _cannot_spool(exc) from None
        try:
            spool.flush()
        except OSError as exc:
            raise _cannot_spool(exc) from None
        return digest.hexdigest()


def _cannot_spool(exc: OSError) -> Refused:
    log.error("zone endpoint: cannot spool an upload: %s", exc)
    return Refused(503, "unavailable", "the aggregator cannot store the upload now",
                   retry_after=60)  # fmt: skip


def _metrics(header: str | None) -> dict[str, float]:
    """X-GPUFlex-Metrics: a JSON object of at most MAX_METRICS names to finite numbers;
    anything else is a 400 that names what is wrong."""
    if not header:
        return {}
    try:
        # an integer too long to convert reads as infinite: refused below, with its name
        raw = loads_json(header, parse_int=lambda s: int(s) if len(s) <= 30 else math.inf)
    except TooDeep as exc:
        raise Refused(400, "bad_request", f"X-GPUFlex-Metrics is {exc}") from None
    except ValueError:
        raise Refused(400, "bad_request", "X-GPUFlex-Metrics is not valid JSON") from None
    if not isinstance(raw, dict):
        raise Refused(400, "bad_request", "X-GPUFlex-Metrics is not a JSON object")
    if len(raw) > MAX_METRICS:
        raise Refused(400, "bad_request", f"X-GPUFlex-Metrics has over {MAX_METRICS} metrics")
    metrics: dict[str, float] = {}
    for name, value in raw.items():
        if len(name) > 64:
            raise Refused(400, "bad_request", "X-GPUFlex-Metrics has a name over 64 characters")
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or abs(value) > METRIC_LIMIT
        ):
            raise Refused(400, "bad_request", f"X-GPUFlex-Metrics field {name!r} must be a "
                          f"finite number from -{METRIC_LIMIT:g} to {METRIC_LIMIT:g}")  # fmt: skip
        metrics[name] = float(value)
    return metrics


_BUSY = json.dumps({"error": "busy", "detail": "the aggregator is serving as many members as it "
                    "can; try again shortly"}).encode()  # fmt: skip
_BUSY_ANSWER = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nRetry-After: 5\r\nConnection: close\r\n\r\n%s" % (len(_BUSY), _BUSY)
)


class ZoneHTTPServer(HTTPServer):
    """A thread per connection, at most `max_connections` of them; each with a deadline."""

    request_queue_size = 128  # the listen backlog: a burst of members waits to be accepted

    def __init__(
        self,
        address: tuple[str, int],
        aggregator: ZoneAggregator,
        *,
        timeout_s: float = TIMEOUT_S,
        min_rate: float = MIN_BODY_RATE,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        super().__init__(address, _Handler)
        self.aggregator = aggregator
        self.timeout_s = timeout_s
        self.min_rate = min_rate
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self._count_lock = threading.Lock()
        self.active = 0  # connections being served now
        self.refused = 0  # connections answered 503 at once: every slot was taken

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            with self._count_lock:
                self.refused += 1
            with contextlib.suppress(OSError):
                request.setblocking(False)  # never wait on this client in the accept loop
                request.send(_BUSY_ANSWER)
            self.shutdown_request(request)
            return
        with self._count_lock:
            self.active += 1
        try:
            threading.Thread(target=self._serve, args=(request, client_address),
                             name="gpuflex-zone-conn", daemon=True).start()  # fmt: skip
        except BaseException:
            self._done(request)
            raise

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self._done(request)

    def _done(self, request: Any) -> None:
        self.shutdown_request(request)
        with self._count_lock:
            self.active -= 1
        self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("zone endpoint: connection from %s ended", client_address, exc_info=True)


class ZoneService:
    """The endpoint and the flush ticker, in daemon threads, for the agent's lifetime."""

    def __init__(
        self, aggregator: ZoneAggregator, listen: str, tick_s: float = 1.0, **server: Any
    ) -> None:
        host, _, port = listen.rpartition(":")
        self.aggregator = aggregator
        self.server = ZoneHTTPServer((host or "0.0.0.0", int(port)), aggregator, **server)
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
