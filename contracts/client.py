"""``ChainClient``: the one object the rest of GPUFlex talks to the contracts through.

With the chain disabled there is no client at all: the caller keeps ``ChainClient | None`` and
skips every on-chain step when it is ``None`` (the ledger works on its own). This module needs
the ``chain`` extra (web3, eth-tester), so import it only when the chain is enabled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from eth_typing import ChecksumAddress
from eth_utils import to_checksum_address
from hexbytes import HexBytes
from web3 import Web3
from web3.contract import Contract
from web3.contract.contract import ContractFunction
from web3.logs import DISCARD
from web3.types import Nonce, TxParams, TxReceipt, Wei

from contracts.artifacts import ESCROW, NODE_REGISTRY, PROVENANCE, load_artifact
from contracts.connection import add_signer, embedded_web3, rpc_web3
from contracts.contributions import ContributionProof
from contracts.deploy import Deployment, deploy, deploy_contract
from contracts.errors import REVERTS, ChainError, from_web3_error
from contracts.ids import Bytes32Like, to_bytes32
from contracts.records import (
    NATIVE,
    AnchorRecord,
    BatchState,
    ClaimRecord,
    ContributionAnchor,
    DepositRecord,
    EventRef,
    JobEscrow,
    NodeInfo,
    PostedBatch,
    RefundRecord,
)
from contracts.settlement import ClaimProof, SettlementBatch

OPERATOR_ROLE = Web3.keccak(text="OPERATOR_ROLE")
DEFAULT_ADMIN_ROLE = b"\x00" * 32

NonceState = Literal["mined", "pending", "unsent"]

# eth_getLogs ranges are capped by most providers; scan in windows this size.
LOG_WINDOW = 5_000


def _ref(event: Any) -> EventRef:
    return EventRef(
        block_number=int(event["blockNumber"]),
        tx_hash=bytes(event["transactionHash"]),
        log_index=int(event["logIndex"]),
    )


class ChainClient:
    """Operator-side access to a deployed set of GPUFlex contracts.

    ``operator`` signs settlement, refunds, anchoring and node deactivation; ``admin`` (when
    known) manages roles and the ERC-20 allow-list. Buyer and provider actions (deposit, claim,
    register) take an explicit ``sender``; on the embedded chain every test account is unlocked,
    on a real endpoint those parties sign with their own wallets.
    """

    def __init__(
        self,
        w3: Web3,
        deployment: Deployment,
        operator: str,
        admin: str | None = None,
    ) -> None:
        self.w3 = w3
        self.deployment = deployment
        self.operator: ChecksumAddress = to_checksum_address(operator)
        self.admin: ChecksumAddress | None = to_checksum_address(admin) if admin else None
        self.escrow: Contract = self._contract(ESCROW, deployment.escrow)
        self.nodes: Contract = self._contract(NODE_REGISTRY, deployment.node_registry)
        self.provenance: Contract = self._contract(PROVENANCE, deployment.provenance)

    # ------------------------------------------------------------ construction

    @classmethod
    def embedded(cls) -> ChainClient:
        """A fresh in-process chain with the contracts deployed: account 0 is the admin,
        account 1 the operator, the others are free for buyers and providers."""
        w3 = embedded_web3()
        admin, operator = w3.eth.accounts[0], w3.eth.accounts[1]
        return cls(w3, deploy(w3, admin, admin, operator), operator=operator, admin=admin)

    @classmethod
    def from_url(
        cls, url: str, deployment: Deployment, operator_key: str, admin: str | None = None
    ) -> ChainClient:
        """Production: a JSON-RPC endpoint, contracts already deployed, the operator's key.
        ``admin`` is only for a development node that signs for its own unlocked accounts."""
        w3, _ = rpc_web3(url)
        return cls(w3, deployment, operator=add_signer(w3, operator_key), admin=admin)

    def _contract(self, name: str, address: str) -> Contract:
        return self.w3.eth.contract(address=address, abi=load_artifact(name).abi)

    def contract_at(self, name: str, address: str) -> Contract:
        """Any compiled contract (tests use it for the mock token and the attacker)."""
        return self._contract(name, address)

    def deploy_contract(self, name: str, *args: Any, sender: str | None = None) -> Contract:
        address = deploy_contract(self.w3, name, sender or self.operator, *args)
        return self._contract(name, address)

    # ------------------------------------------------------------ plumbing

    def transact(
        self, fn: ContractFunction, sender: str, value: int = 0, nonce: int | None = None
    ) -> TxReceipt:
        """Send ``fn`` from ``sender`` (with ``nonce`` when given: see ``nonce_state``); a
        revert (at estimation or mined) raises ChainError. Anything else (a node that cannot be
        reached, say) propagates as it is: unlike a revert, it may be worth retrying."""
        params: TxParams = {"from": to_checksum_address(sender), "value": Wei(value)}
        if nonce is not None:
            params["nonce"] = Nonce(nonce)
        try:
            tx_hash = fn.transact(params)
        except REVERTS as exc:
            raise from_web3_error(exc) from exc
        receipt = self.w3.eth.wait_for_transaction_receipt(tx_hash)
        if receipt["status"] != 1:
            raise ChainError("Reverted", (), f"transaction {HexBytes(tx_hash).hex()}")
        return receipt

    def call(self, fn: ContractFunction) -> Any:
        try:
            return fn.call()
        except REVERTS as exc:
            raise from_web3_error(exc) from exc

    @property
    def block_number(self) -> int:
        return int(self.w3.eth.block_number)

    def next_nonce(self, sender: str | None = None) -> int:
        """The nonce the next transaction from ``sender`` (the operator) would get. A caller
        that must never send one thing twice stores it before sending, then passes it in."""
        address = to_checksum_address(sender or self.operator)
        return int(self.w3.eth.get_transaction_count(address, "pending"))

    def nonce_state(self, nonce: int, sender: str | None = None) -> NonceState:
        """What became of ``sender``'s transaction with ``nonce``: ``mined`` (that nonce is
        spent, by whichever transaction: nothing else with it can ever run), ``pending`` (the
        node holds it and may still mine it) or ``unsent`` (the node never got it, or dropped
        it: sending it again with the same nonce is safe, at most one can run)."""
        address = to_checksum_address(sender or self.operator)
        if nonce < int(self.w3.eth.get_transaction_count(address, "latest")):
            return "mined"
        if nonce < int(self.w3.eth.get_transaction_count(address, "pending")):
            return "pending"
        return "unsent"

    def _scan(
        self,
        event: Any,
        from_block: int,
        to_block: int | None,
        make: Callable[[Any], Any],
        argument_filters: dict[str, Any] | None = None,
    ) -> list[Any]:
        last = self.block_number if to_block is None else to_block
        found: list[Any] = []
        start = from_block
        while start <= last:
            end = min(start + LOG_WINDOW - 1, last)
            logs = event.get_logs(from_block=start, to_block=end, argument_filters=argument_filters)
            found.extend(make(e) for e in logs)
            start = end + 1
        return found

    # ------------------------------------------------------------ admin

    def allow_token(self, token: str, allowed: bool = True) -> TxReceipt:
        if self.admin is None:
            raise ChainError("NoAdmin", (), "this client was built without the admin account")
        return self.transact(
            self.escrow.functions.setTokenAllowed(to_checksum_address(token), allowed), self.admin
        )

    # ------------------------------------------------------------ buyers

    def deposit(
        self, job_id: Bytes32Like, amount: int, sender: str, token: str = NATIVE
    ) -> TxReceipt:
        """Deposit for a job from ``sender`` (approving the escrow first for an ERC-20)."""
        job = to_bytes32(job_id)
        if to_checksum_address(token) == NATIVE:
            return self.transact(self.escrow.functions.deposit(job), sender, value=amount)
        erc20 = self.w3.eth.contract(address=to_checksum_address(token), abi=_ERC20_ABI)
        self.transact(erc20.functions.approve(self.escrow.address, amount), sender)
        return self.transact(
            self.escrow.functions.depositToken(job, to_checksum_address(token), amount), sender
        )

    def deposits(
        self, from_block: int | None = None, to_block: int | None = None
    ) -> list[DepositRecord]:
        """Deposited events in ``[from_block, to_block]`` (default: deployment .. latest), in
        chain order. Credit each once, keyed by ``record.ref.key``; to follow the chain, keep
        the last block scanned and ask again from the next one (mind reorgs on a real chain:
        only credit deposits some confirmations deep)."""
        start = self.deployment.from_block if from_block is None else from_block
        return self._scan(
            self.escrow.events.Deposited(),
            start,
            to_block,
            lambda e: DepositRecord(
                job_id=bytes(e["args"]["jobId"]),
                buyer=to_checksum_address(e["args"]["buyer"]),
                token=to_checksum_address(e["args"]["token"]),
                amount=int(e["args"]["amount"]),
                ref=_ref(e),
            ),
        )

    # ------------------------------------------------------------ operator: money

    def job(self, job_id: Bytes32Like) -> JobEscrow:
        key = to_bytes32(job_id)
        j = self.call(self.escrow.functions.jobOf(key))
        return JobEscrow(
            job_id=key,
            buyer=to_checksum_address(j[0]),
            closed=bool(j[1]),
            token=to_checksum_address(j[2]),
            deposited=int(j[3]),
            settled=int(j[4]),
            refunded=int(j[5]),
        )

    def post_batch(self, batch: SettlementBatch, nonce: int | None = None) -> PostedBatch:
        """Post the batch's root and debit its jobs. Reposting the same ``batch_id`` reverts
        with ``BatchExists``. A post whose answer was lost may still be mined: store ``nonce``
        (``next_nonce``) before posting, and after a failure ask ``batch_state`` and
        ``nonce_state`` before posting again (marketplace/ledger/chain.py does)."""
        receipt = self.transact(
            self.escrow.functions.postBatch(
                batch.batch_id,
                batch.root,
                batch.token,
                [job for job, _ in batch.debits],
                [amount for _, amount in batch.debits],
            ),
            self.operator,
            nonce=nonce,
        )
        (event,) = self.escrow.events.BatchPosted().process_receipt(receipt, errors=DISCARD)
        return _posted_batch(event, int(receipt["gasUsed"]))

    def batch_posted(self, batch_id: Bytes32Like) -> PostedBatch | None:
        """The transaction that posted ``batch_id``, found by its event: what a client that
        lost the receipt learns after the fact (its hash and gas)."""
        events = self._scan(
            self.escrow.events.BatchPosted(),
            self.deployment.from_block,
            None,
            lambda e: e,
            argument_filters={"batchId": to_bytes32(batch_id)},
        )
        if not events:
            return None
        receipt = self.w3.eth.get_transaction_receipt(events[0]["transactionHash"])
        return _posted_batch(events[0], int(receipt["gasUsed"]))

    def batch_state(self, batch_id: Bytes32Like) -> BatchState | None:
        key = to_bytes32(batch_id)
        b = self.call(self.escrow.functions.batchOf(key))
        if bytes(b[0]) == b"\x00" * 32:
            return None
        return BatchState(key, bytes(b[0]), to_checksum_address(b[1]), int(b[2]), int(b[3]))

    def refund(self, job_id: Bytes32Like) -> RefundRecord:
        """Return the job's unspent escrow to its depositor and close it (once only)."""
        receipt = self.transact(self.escrow.functions.refund(to_bytes32(job_id)), self.operator)
        (event,) = self.escrow.events.Refunded().process_receipt(receipt, errors=DISCARD)
        return RefundRecord(
            job_id=bytes(event["args"]["jobId"]),
            buyer=to_checksum_address(event["args"]["buyer"]),
            token=to_checksum_address(event["args"]["token"]),
            amount=int(event["args"]["amount"]),
            ref=_ref(event),
        )

    def refunds(
        self, from_block: int | None = None, to_block: int | None = None
    ) -> list[RefundRecord]:
        start = self.deployment.from_block if from_block is None else from_block
        return self._scan(
            self.escrow.events.Refunded(),
            start,
            to_block,
            lambda e: RefundRecord(
                job_id=bytes(e["args"]["jobId"]),
                buyer=to_checksum_address(e["args"]["buyer"]),
                token=to_checksum_address(e["args"]["token"]),
                amount=int(e["args"]["amount"]),
                ref=_ref(e),
            ),
        )

    # ------------------------------------------------------------ providers

    def claim(self, proof: ClaimProof, sender: str | None = None) -> ClaimRecord:
        """Submit a claim (from the provider by default; anyone may relay it)."""
        receipt = self.transact(
            self.escrow.functions.claim(
                proof.batch_id, proof.provider, proof.amount, list(proof.proof)
            ),
            sender or proof.provider,
        )
        (event,) = self.escrow.events.Claimed().process_receipt(receipt, errors=DISCARD)
        return _claim_record(event)

    def claim_to(self, proof: ClaimProof, to: str) -> ClaimRecord:
        """The provider itself claims its leaf to another address (``claimTo``)."""
        receipt = self.transact(
            self.escrow.functions.claimTo(
                proof.batch_id, proof.amount, list(proof.proof), to_checksum_address(to)
            ),
            proof.provider,
        )
        (event,) = self.escrow.events.Claimed().process_receipt(receipt, errors=DISCARD)
        return _claim_record(event)

    def is_claimed(self, proof: ClaimProof) -> bool:
        return bool(
            self.call(self.escrow.functions.isClaimed(proof.batch_id, proof.provider, proof.amount))
        )

    def claims(
        self, from_block: int | None = None, to_block: int | None = None
    ) -> list[ClaimRecord]:
        start = self.deployment.from_block if from_block is None else from_block
        return self._scan(self.escrow.events.Claimed(), start, to_block, _claim_record)

    # ------------------------------------------------------------ nodes

    def register_node(self, capability_hash: Bytes32Like, sender: str) -> TxReceipt:
        return self.transact(self.nodes.functions.register(to_bytes32(capability_hash)), sender)

    def register_node_for(
        self, node: str, capability_hash: Bytes32Like, nonce: int | None = None
    ) -> TxReceipt:
        """The operator registers ``node`` (a provider's wallet) with its capability hash."""
        return self.transact(
            self.nodes.functions.registerFor(
                to_checksum_address(node), to_bytes32(capability_hash)
            ),
            self.operator,
            nonce=nonce,
        )

    def deactivate_node(self, node: str) -> TxReceipt:
        return self.transact(
            self.nodes.functions.deactivate(to_checksum_address(node)), self.operator
        )

    def reactivate_node(self, node: str) -> TxReceipt:
        return self.transact(
            self.nodes.functions.reactivate(to_checksum_address(node)), self.operator
        )

    def node(self, node: str) -> NodeInfo:
        address = to_checksum_address(node)
        n = self.call(self.nodes.functions.nodeOf(address))
        return NodeInfo(address, bytes(n[0]), int(n[1]), bool(n[2]))

    # ------------------------------------------------------------ provenance

    def anchor(
        self,
        job_id: Bytes32Like,
        round_: int,
        record_hash: Bytes32Like,
        nonce: int | None = None,
    ) -> AnchorRecord:
        """Anchor a round's provenance record hash; a second anchor for the same (job, round)
        reverts with ``AlreadyAnchored``, whatever the hash."""
        job, digest = to_bytes32(job_id), to_bytes32(record_hash)
        self.transact(
            self.provenance.functions.anchor(job, round_, digest), self.operator, nonce=nonce
        )
        anchored = self.anchored(job, round_)
        assert anchored is not None
        return anchored

    def anchor_transaction(self, job_id: Bytes32Like, round_: int) -> bytes | None:
        """The hash of the transaction that anchored (job, round), found by its event."""
        events = self._scan(
            self.provenance.events.ProvenanceAnchored(),
            self.deployment.from_block,
            None,
            lambda e: e,
            argument_filters={"jobId": to_bytes32(job_id), "round": round_},
        )
        return bytes(events[0]["transactionHash"]) if events else None

    def anchor_contributions(
        self, batch_id: Bytes32Like, root: Bytes32Like, leaves: int, nonce: int | None = None
    ) -> TxReceipt:
        """Anchor a settlement batch's contribution root; a second anchor for the same batch
        reverts with ``ContributionsAlreadyAnchored``, whatever the root."""
        return self.transact(
            self.provenance.functions.anchorContributions(
                to_bytes32(batch_id), to_bytes32(root), leaves
            ),
            self.operator,
            nonce=nonce,
        )

    def contributions_of(self, batch_id: Bytes32Like) -> ContributionAnchor | None:
        key = to_bytes32(batch_id)
        c = self.call(self.provenance.functions.contributionsOf(key))
        if bytes(c[0]) == b"\x00" * 32:
            return None
        return ContributionAnchor(key, bytes(c[0]), int(c[1]), int(c[2]), int(c[3]))

    def verify_contribution(self, proof: ContributionProof) -> bool:
        """Read-only, for anyone: is this node's leaf in the batch's anchored root?"""
        return bool(self.call(self.provenance.functions.verifyContribution(*proof.call_args())))

    def anchored(self, job_id: Bytes32Like, round_: int) -> AnchorRecord | None:
        job = to_bytes32(job_id)
        a = self.call(self.provenance.functions.anchorOf(job, round_))
        if bytes(a[0]) == b"\x00" * 32:
            return None
        return AnchorRecord(job, round_, bytes(a[0]), int(a[1]), int(a[2]))

    def verify_anchor(self, job_id: Bytes32Like, round_: int, record_hash: Bytes32Like) -> bool:
        """Read-only, for anyone: is this exactly the hash anchored for (job, round)?"""
        return bool(
            self.call(
                self.provenance.functions.verify(
                    to_bytes32(job_id), round_, to_bytes32(record_hash)
                )
            )
        )

    def verify_history(self, job_id: Bytes32Like, records: Mapping[int, Bytes32Like]) -> bool:
        """True when every given round of the job has exactly the given hash anchored (a buyer
        checks a model's whole history this way: one rewritten record makes it False)."""
        return all(self.verify_anchor(job_id, r, h) for r, h in records.items())

    # ------------------------------------------------------------ roles

    def has_role(self, contract: Contract, role: bytes, account: str) -> bool:
        return bool(self.call(contract.functions.hasRole(role, to_checksum_address(account))))


def _posted_batch(event: Any, gas_used: int) -> PostedBatch:
    return PostedBatch(
        batch_id=bytes(event["args"]["batchId"]),
        root=bytes(event["args"]["root"]),
        token=to_checksum_address(event["args"]["token"]),
        total=int(event["args"]["total"]),
        gas_used=gas_used,
        ref=_ref(event),
    )


def _claim_record(e: Any) -> ClaimRecord:
    return ClaimRecord(
        batch_id=bytes(e["args"]["batchId"]),
        provider=to_checksum_address(e["args"]["provider"]),
        token=to_checksum_address(e["args"]["token"]),
        amount=int(e["args"]["amount"]),
        ref=_ref(e),
    )


_ERC20_ABI: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "approve",
        "stateMutability": "nonpayable",
        "inputs": [
            {"name": "spender", "type": "address"},
            {"name": "value", "type": "uint256"},
        ],
        "outputs": [{"name": "", "type": "bool"}],
    },
]
