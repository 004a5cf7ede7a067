"""Reverts turned into one exception type that names the contract's custom error."""

from __future__ import annotations

import ast
from functools import cache
from typing import Any

from eth_abi import decode
from eth_tester.exceptions import TransactionFailed
from eth_utils import function_signature_to_4byte_selector
from web3.exceptions import ContractLogicError

from contracts.artifacts import artifact_names, load_artifact

# What a revert looks like: from a JSON-RPC node (ContractLogicError and its ContractCustomError)
# or from the in-process provider, which lets eth-tester's TransactionFailed through.
REVERTS: tuple[type[Exception], ...] = (ContractLogicError, TransactionFailed)


class ChainError(Exception):
    """A transaction or call reverted (``name`` is the Solidity error, e.g. ``AlreadyClaimed``)
    or a transaction was mined with a failed status."""

    def __init__(self, name: str, args: tuple[Any, ...] = (), detail: str = "") -> None:
        self.name = name
        self.error_args = args
        text = f"{name}{args!r}" if args else name
        super().__init__(f"{text}: {detail}" if detail else text)


def _abi_type(param: dict[str, Any]) -> str:
    if param["type"].startswith("tuple"):
        inner = ",".join(_abi_type(c) for c in param["components"])
        return f"({inner}){param['type'][len('tuple') :]}"
    return str(param["type"])


@cache
def _errors() -> dict[bytes, tuple[str, list[str]]]:
    table: dict[bytes, tuple[str, list[str]]] = {}
    for name in artifact_names():
        for item in load_artifact(name).abi:
            if item["type"] != "error":
                continue
            types = [_abi_type(p) for p in item["inputs"]]
            selector = function_signature_to_4byte_selector(f"{item['name']}({','.join(types)})")
            table[selector] = (item["name"], types)
    return table


def decode_revert(data: bytes) -> ChainError:
    """Name a revert from its raw return data (custom errors of any of our contracts, OZ's
    included; ``Error(string)``; ``Panic(uint256)``; anything else is ``Unknown``)."""
    selector, body = data[:4], data[4:]
    if selector == function_signature_to_4byte_selector("Error(string)"):
        return ChainError("Error", tuple(decode(["string"], body)))
    if selector == function_signature_to_4byte_selector("Panic(uint256)"):
        return ChainError("Panic", tuple(decode(["uint256"], body)))
    known = _errors().get(selector)
    if known is None:
        return ChainError("Unknown", (), "0x" + data.hex())
    name, types = known
    try:
        return ChainError(name, tuple(decode(types, body)))
    except Exception:  # malformed arguments still name the error
        return ChainError(name)


_TESTER_PREFIX = "execution reverted: "


def from_web3_error(exc: Exception) -> ChainError:
    """Recover the revert data from what web3 raised: a JSON-RPC node gives hex in ``.data``;
    the in-process provider re-raises eth-tester's TransactionFailed with the raw bytes
    rendered into the message as a Python literal, which is parsed back here."""
    data = getattr(exc, "data", None)
    if isinstance(data, dict):
        data = data.get("data")
    if isinstance(data, str) and data.startswith("0x"):
        return decode_revert(bytes.fromhex(data[2:]))
    message = str(exc.args[0]) if exc.args else str(exc)
    if message.startswith(_TESTER_PREFIX):
        reason = message[len(_TESTER_PREFIX) :]
        if reason.startswith(("b'", 'b"')):
            try:
                raw = ast.literal_eval(reason)
            except (ValueError, SyntaxError):
                raw = None
            if isinstance(raw, bytes):
                return decode_revert(raw)
        return ChainError("Error", (reason,))
    return ChainError(type(exc).__name__, (), message)
