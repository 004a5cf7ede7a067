"""The marketplace's agent API (docs/agent-api.md) over httpx, and nothing else of the server.

Every call retries 429, 5xx and connection errors with exponential backoff and full jitter
(honouring Retry-After), so a marketplace outage costs waiting, not tasks. A simulated-network
transport (`--network-profile`) can stand in for the real one: it adds the trainer
simulator's latency, bandwidth, loss and disconnects to the agent's own requests.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from trainer.sim.network import NodeProfile, disconnects, get_profile

API = "/api/v1/"
# A node that drops out of a round loses its network this long (wall seconds at time_scale 1).
OUTAGE_S = 10.0


class ApiError(Exception):
    """A 4xx answer (not retried) or retries exhausted; `code` is the API's error code."""

    def __init__(self, status: int | None, code: str, detail: str) -> None:
        self.status = status
        self.code = code
        self.detail = detail
        super().__init__(f"{status or 'network'} {code}: {detail}")


class Unavailable(ApiError):
    """The marketplace could not be reached or kept failing; worth trying again later."""


class Stopped(Exception):
    """The agent is shutting down; raised out of a backoff wait."""


@dataclass(frozen=True)
class Backoff:
    base_s: float = 0.5
    cap_s: float = 60.0
    attempts: int = 8  # per call; the agent loop itself keeps going after that

    def delay(self, attempt: int, rng: random.Random) -> float:
        # "full jitter" (AWS architecture blog): spreads a crowd of nodes coming back at once
        return rng.uniform(self.base_s / 2, min(self.cap_s, self.base_s * 2**attempt))


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


class MarketplaceClient:
    def __init__(
        self,
        server_url: str,
        node_key: str | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        backoff: Backoff | None = None,
        timeout_s: float = 30.0,
        stop: threading.Event | None = None,
        on_retry: Callable[[str], None] | None = None,
        seed: int | None = None,
    ) -> None:
        self.base = server_url.rstrip("/") + API
        self.node_key = node_key
        self.backoff = backoff or Backoff()
        self.stop = stop or threading.Event()
        self.on_retry = on_retry
        self._rng = random.Random(seed)
        self._claims = threading.local()  # a claim's Idempotency-Key until it is answered
        # claims long-poll up to 30 s: the read timeout must outlast them
        self._http = httpx.Client(
            transport=transport, timeout=httpx.Timeout(timeout_s, read=timeout_s + 35)
        )

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ plumbing

    def _request(
        self,
        method: str,
        path: str,
        *,
        key: str | None = None,
        json_body: Any = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
        attempts: int | None = None,
    ) -> httpx.Response:
        key = key or self.node_key
        hdrs = dict(headers or {})
        if key:
            hdrs["Authorization"] = f"Bearer {key}"
        attempts = attempts or self.backoff.attempts
        last = "no attempt made"
        for attempt in range(attempts):
            if self.stop.is_set():
                raise Stopped()
            wait: float | None = None
            try:
                r = self._http.request(
                    method, self.base + path, json=json_body, content=content,
                    headers=hdrs, params=params,
                )  # fmt: skip
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if r.status_code < 400:
                    return r
                if r.status_code == 429 or r.status_code >= 500:
                    last = f"HTTP {r.status_code}"
                    wait = _retry_after(r) if r.status_code == 429 else None
                else:
                    raise _api_error(r)
            if attempt + 1 < attempts:
                delay = wait if wait is not None else self.backoff.delay(attempt, self._rng)
                if self.on_retry:
                    self.on_retry(f"{method} {path}: {last}; retrying in {delay:.1f} s")
                if self.stop.wait(delay):
                    raise Stopped()
        raise Unavailable(None, "unavailable", f"{method} {path} failed {attempts} times: {last}")

    # ------------------------------------------------------------------ endpoints

    def register(self, provider_key: str, body: dict[str, Any]) -> dict[str, Any]:
        r = self._request("POST", "nodes/", key=provider_key, json_body=body)
        return dict(r.json())

    def heartbeat(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self._request("POST", "agent/heartbeat", json_body=body, attempts=2).json())

    def claim(self, wait_s: int = 20) -> dict[str, Any] | None:
        """One claim (long poll). Its Idempotency-Key is kept until an answer comes: re-sent
        after a lost answer (a server that died as it answered, a dropped connection), here
        or on the loop's next claim, the claim is answered with the tasks it leased rather
        than leaving them leased to nobody until their lease runs out. Per thread: two
        threads' claims never share a key (each would be answered the other's tasks)."""
        key = getattr(self._claims, "key", None) or uuid.uuid4().hex
        self._claims.key = key
        try:
            r = self._request(
                "POST", "agent/claim", params={"wait": min(max(wait_s, 0), 30)},
                headers={"Idempotency-Key": key},
            )  # fmt: skip
        except Unavailable:
            raise  # no answer: the key stays for the claim's next try
        except ApiError:
            self._claims.key = None  # answered (a refusal): nothing was leased under it
            raise
        self._claims.key = None
        if r.status_code == 204 or not r.content:
            return None
        return dict(r.json()["task"])

    def get_model(self, task_id: str, base: str | None = None) -> Download:
        """The task's model; with `base` (a model hash this node holds) the one delta that
        leads from it one round on (docs/agent-api.md, "Model delivery")."""
        params = {"base": base} if base else None
        return Download.of(self._request("GET", f"agent/tasks/{task_id}/model", params=params))

    def get_shard(self, task_id: str) -> Download:
        return Download.of(self._request("GET", f"agent/tasks/{task_id}/shard"))

    def get_program(self, task_id: str) -> Download:
        """An exported model's program (.pt2), for the sandboxed runner to read."""
        return Download.of(self._request("GET", f"agent/tasks/{task_id}/program"))

    def probe_down(self, nbytes: int) -> Download:
        """`nbytes` random bytes from the server: the link test (docs/agent-api.md)."""
        r = self._request("GET", "agent/probe", params={"bytes": nbytes}, attempts=2)
        return Download.of(r)

    def probe_up(self, data: bytes) -> None:
        self._request(
            "POST", "agent/probe", content=data, attempts=2,
            headers={"Content-Type": "application/octet-stream"},
        )  # fmt: skip

    def put_update(self, task_id: str, data: bytes, metrics: dict[str, float]) -> int:
        """202 when received (the server's worker checks it; a refusal releases the task, as
        a lost lease), 200 when these bytes were already accepted (a retry); 201 from servers
        that checked in the request. Any of them: uploaded."""
        r = self._request(
            "PUT",
            f"agent/tasks/{task_id}/update",
            content=data,
            headers={
                "Content-Type": "application/octet-stream",
                "X-GPUFlex-Metrics": json.dumps(metrics),
            },
        )
        return r.status_code

    def upload_outcome(self, task_id: str) -> dict[str, Any]:
        """What became of an upload answered 202: `{status: checking | accepted | refused,
        update_hash, reason}` (desktop.upload_outcomes); 404 when the server knows of none."""
        return dict(self._request("GET", f"agent/tasks/{task_id}/update", attempts=2).json())

    def proof_requests(self) -> list[dict[str, Any]]:
        """The segment checks asking this node for checkpoints (desktop.proof_keeper)."""
        return list(self._request("GET", "agent/proofs", attempts=2).json()["requests"])

    def put_checkpoint(self, check_id: int, step: int, data: bytes) -> str:
        """One revealed checkpoint; the check's status after it."""
        r = self._request(
            "PUT", f"agent/proofs/{int(check_id)}/checkpoints/{int(step)}", content=data,
            headers={"Content-Type": "application/octet-stream"},
        )  # fmt: skip
        return str(r.json().get("status", ""))

    def fail(self, task_id: str, reason: str, detail: str) -> None:
        self._request(
            "POST", f"agent/tasks/{task_id}/fail", json_body={"reason": reason, "detail": detail}
        )

    # ------------------------------------------------------------- zones (rounds.zones)

    def hand_off(self, task_id: str, aggregator_id: int, update_hash: str) -> None:
        """Tell the coordinator this update goes to the zone's aggregator (before it goes)."""
        self._request(
            "POST", f"agent/tasks/{task_id}/handoff",
            json_body={"aggregator_id": aggregator_id, "update_hash": update_hash},
        )  # fmt: skip

    def zone_upload(
        self, zone: dict[str, Any], task_id: str, node_id: str, data: bytes,
        metrics: dict[str, float],
    ) -> int:  # fmt: skip
        """The update to the zone's aggregator (`zone` is the task's), never with the node's
        marketplace key: the member token proves the task. 202 held, 200 a retry."""
        url = f"{str(zone['url']).rstrip('/')}/zone/v1/rounds/{zone['round_id']}/tasks/{task_id}"
        headers = {
            "Content-Type": "application/octet-stream",
            "X-GPUFlex-Metrics": json.dumps(metrics),
            "X-GPUFlex-Node": str(node_id),
            "X-GPUFlex-Samples": str(zone["samples"]),
            "X-GPUFlex-Zone-Token": str(zone["token"]),
        }
        try:
            r = self._http.put(url, content=data, headers=headers)
        except httpx.TransportError as exc:
            raise Unavailable(None, "unavailable", f"zone aggregator: {exc}") from None
        if r.status_code >= 400:
            raise _api_error(r)
        return r.status_code

    def zone_round(self, round_id: int) -> dict[str, Any]:
        return dict(self._request("GET", f"agent/zone/rounds/{round_id}", attempts=2).json())

    def zone_model(self, round_id: int) -> Download:
        return Download.of(self._request("GET", f"agent/zone/rounds/{round_id}/model"))

    def put_partial(self, data: bytes) -> int:
        """The zone's partial sum to the coordinator: 202 received (its worker checks the sum
        and, refusing it, releases the members with the reason in their tasks' last_error),
        200 the same bytes already accepted; both are success. A 4xx raises ApiError."""
        r = self._request(
            "PUT", "agent/zone/partial", content=data,
            headers={"Content-Type": "application/octet-stream"},
        )  # fmt: skip
        return r.status_code

    def put_datasets(self, datasets: list[dict[str, Any]]) -> None:
        """Every local dataset this node holds: name, schema, rows, hash; never a row."""
        self._request("PUT", "agent/datasets", json_body={"local_datasets": datasets})

    # ------------------------------------------- secure aggregation (desktop.secagg_client)

    def secagg_status(self, task_id: str) -> dict[str, Any]:
        return dict(self._request("GET", f"agent/tasks/{task_id}/secagg").json())

    def secagg_keys(self, task_id: str, c_key: str, s_key: str) -> dict[str, Any]:
        body = {"c_key": c_key, "s_key": s_key}
        return dict(self._request("POST", f"agent/tasks/{task_id}/secagg", json_body=body).json())

    def secagg_post_shares(self, task_id: str, shares: dict[str, Any]) -> dict[str, Any]:
        path = f"agent/tasks/{task_id}/secagg/shares"
        return dict(self._request("POST", path, json_body={"shares": shares}).json())

    def secagg_shares(self, task_id: str) -> dict[str, str]:
        r = self._request("GET", f"agent/tasks/{task_id}/secagg/shares")
        return dict(r.json()["shares"])

    def secagg_unmask(self, task_id: str, shares: dict[str, Any]) -> dict[str, Any]:
        path = f"agent/tasks/{task_id}/secagg/unmask"
        return dict(self._request("POST", path, json_body={"shares": shares}).json())

    def me(self) -> dict[str, Any]:
        return dict(self._request("GET", "agent/me", attempts=2).json())


class Download(bytes):
    """A download's body, decoded, and `wire_bytes`: what crossed the network (less, when
    the server sent it gzip-encoded), which is what a link's rate is timed on."""

    wire_bytes: int

    @classmethod
    def of(cls, r: httpx.Response) -> Download:
        body = cls(r.content)
        body.wire_bytes = r.num_bytes_downloaded or len(body)
        return body


def _api_error(r: httpx.Response) -> ApiError:
    try:
        body = r.json()
        code, detail = str(body.get("error", "error")), str(body.get("detail", ""))
        if body.get("reason"):
            detail = f"{body['reason']}: {detail}"
    except (ValueError, AttributeError):
        code, detail = "error", r.text[:300]
    return ApiError(r.status_code, code, detail)


# ------------------------------------------------------------------ simulated network


def simulated_link(name: str, nodes: int = 8) -> int:
    """Which of a profile's `nodes` simulated links an agent named `name` gets: stable per
    name, so a rerun (and the live bench's simulator prediction) sees the same link."""
    return int(hashlib.sha256(name.encode()).hexdigest(), 16) % nodes


class SimulatedNetwork(httpx.BaseTransport):
    """The trainer simulator's network model applied to real requests.

    Each request waits one RTT plus its bytes over the link (capped by TCP's loss-limited
    rate: `NodeProfile.transfer_s`), fails outright with the profile's packet-loss
    probability (a dropped connection), and in a round where `disconnects` says this node
    drops out, the network goes dark for a while, as a laptop losing Wi-Fi would.
    """

    def __init__(
        self,
        profile: str,
        node: int = 0,
        nodes: int = 8,
        seed: int = 0,
        inner: httpx.BaseTransport | None = None,
        time_scale: float = 1.0,
        outage_s: float = OUTAGE_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.name = profile
        self.node: NodeProfile = get_profile(profile).node(node, nodes, seed)
        self.seed = seed
        self.inner = inner or httpx.HTTPTransport()
        self.time_scale = time_scale
        self.outage_s = outage_s
        self.sleep = sleep
        self._rng = random.Random(f"agent-net:{profile}:{seed}:{node}")
        self._dark_until = 0.0
        self._lock = threading.Lock()
        self.injected = {"delay_s": 0.0, "lost": 0, "dark": 0}

    def begin_round(self, round_: int) -> float | None:
        """Called as a task starts; returns when (fraction of the work) the node drops out."""
        return disconnects(self.node, self.seed, round_)

    def go_dark(self) -> None:
        with self._lock:
            self._dark_until = time.monotonic() + self.outage_s * self.time_scale

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            dark = time.monotonic() < self._dark_until
            lost = self._rng.random() < self.node.loss
        if dark or lost:
            self.injected["dark" if dark else "lost"] += 1
            self.sleep(self.node.rtt_s * self.time_scale)
            raise httpx.ConnectError(
                f"simulated {'disconnect' if dark else 'packet loss'} ({self.name})",
                request=request,
            )
        up = len(request.content) + sum(len(k) + len(v) for k, v in request.headers.raw)
        delay = self.node.transfer_s(up, upload=True)
        response = self.inner.handle_request(request)
        try:  # the bytes as sent (gzip-encoded, say): what the link carries
            body = b"".join(response.iter_raw())
        finally:
            response.close()
        # the RTT is paid once per request, not again for the answer
        delay += self.node.transfer_s(len(body), upload=False) - self.node.rtt_s
        self.injected["delay_s"] += delay
        self.sleep(delay * self.time_scale)
        # as a stream, not content: the client decodes it once and counts the raw bytes
        return httpx.Response(
            response.status_code, headers=response.headers, stream=httpx.ByteStream(body),
            request=request,
        )  # fmt: skip

    def close(self) -> None:
        self.inner.close()
