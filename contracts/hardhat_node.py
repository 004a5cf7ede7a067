"""A real JSON-RPC chain for the tests and `gpuflex demo --chain`: Hardhat's node from
contracts/node_modules (installed by ``npm ci --prefix contracts``), started on a free loopback
port with the contracts deployed by ``contracts.deploy`` exactly as an operator would, and
stopped at the end of the session (or of the demo).

Nothing is downloaded at run time: ``hardhat node`` compiles nothing (``contracts/compile.js``
builds the artifacts with solc-js), and Hardhat's telemetry, banners and prompts stay off.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CONTRACTS = Path(__file__).resolve().parent
HARDHAT = CONTRACTS / "node_modules" / "hardhat" / "internal" / "cli" / "bootstrap.js"
START_DEADLINE_S = 90.0  # a cold start on a busy two-core machine takes a few seconds
# The operator signs locally with this key (the node never holds it), as in production; a
# throwaway key for a local development chain only.
OPERATOR_KEY = "0x" + "6f" * 32


@dataclass(frozen=True)
class RpcChain:
    """A running node with the contracts deployed: what production reads from
    GPUFLEX_CHAIN_URL, GPUFLEX_CHAIN_DEPLOYMENT and GPUFLEX_CHAIN_OPERATOR_KEY."""

    url: str
    deployment_json: str
    operator_key: str
    admin: str  # the node's unlocked account 0: deployed the contracts, manages roles


def missing_reason() -> str | None:
    """Why the node cannot be started here, or None."""
    if shutil.which("node") is None:
        return "node is not installed: a Hardhat chain needs Node.js and `make dev`"
    if not HARDHAT.exists():
        return "contracts/node_modules lacks hardhat: run `npm ci --prefix contracts`"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rpc(url: str, method: str, params: list[object]) -> object:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())["result"]


def _quiet_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        # Hardhat treats CI as non-interactive: no telemetry prompt, no banner fetched from
        # GitHub, no analytics; its own data dirs point at an empty folder so a consent given
        # elsewhere on this machine is never read.
        CI="true",
        HARDHAT_DISABLE_TELEMETRY_PROMPT="true",
        HARDHAT_HIDE_SOLIDITY_SURVEY_MESSAGE="true",
        XDG_CONFIG_HOME=str(home),
        XDG_DATA_HOME=str(home),
        XDG_CACHE_HOME=str(home),
    )
    return env


def _start(workdir: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    """Start the node; a port taken in the meantime by someone else is retried."""
    last_error = ""
    for attempt in range(3):
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        log_path = workdir / f"hardhat-{attempt}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                ["node", str(HARDHAT), "node", "--hostname", "127.0.0.1", "--port", str(port)],
                cwd=CONTRACTS,
                env=_quiet_env(workdir),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if _rpc(url, "eth_chainId", []) == hex(31337):
                    return process, url, log_path
            except (OSError, urllib.error.URLError, ValueError, KeyError):
                pass
            time.sleep(0.1)  # polling the condition above, not a synchronisation by time
        _stop(process)
        last_error = log_path.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"hardhat node did not answer eth_chainId:\n{last_error}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def hardhat_chain(workdir: Path) -> Iterator[RpcChain]:
    """A node with the three contracts deployed; the operator is a fresh key, funded by the
    node's account 0, which is the admin."""
    from eth_account import Account

    from contracts.connection import rpc_web3
    from contracts.deploy import deploy

    process, url, _ = _start(workdir)
    try:
        w3, _ = rpc_web3(url)
        admin = w3.eth.accounts[0]
        operator = Account.from_key(OPERATOR_KEY).address
        w3.eth.wait_for_transaction_receipt(
            w3.eth.send_transaction({"from": admin, "to": operator, "value": 100 * 10**18})
        )
        deployment = deploy(w3, admin, admin, operator)
        yield RpcChain(url, deployment.to_json(), OPERATOR_KEY, admin)
    finally:
        _stop(process)
