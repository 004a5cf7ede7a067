// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
// Transient storage (EIP-1153, cancun): the guard costs ~200 gas a call instead of ~5,000.
import {ReentrancyGuardTransient} from "@openzeppelin/contracts/utils/ReentrancyGuardTransient.sol";

/// @title GPUFlex job escrow and batched provider payouts
/// @notice Buyers deposit (native currency or an allowed ERC-20) into a job's escrow. The
/// operator settles work in batches: one Merkle root of (provider, token, amount) claims per
/// batch, whose total is debited from the escrows of the jobs it settles, so posting a batch
/// costs the same however many contributions it covers. Providers pull their payment with a
/// proof. Unspent escrow goes back to the job's depositor when the operator closes the job.
contract GPUFlexEscrow is AccessControl, ReentrancyGuardTransient {
    using SafeERC20 for IERC20;

    bytes32 public constant OPERATOR_ROLE = keccak256("OPERATOR_ROLE");

    /// @dev address(0) stands for the chain's native currency everywhere below.
    address public constant NATIVE = address(0);

    struct Job {
        address buyer; // bound by the first deposit; the only address a refund can go to
        bool closed; // refunded: no more deposits, settlements or refunds
        address token; // bound by the first deposit
        uint256 deposited;
        uint256 settled;
        uint256 refunded;
    }

    // total and claimed share a slot: every claim reads and writes both, and posting a batch
    // writes three slots instead of four. uint128 is far above any real batch total.
    struct Batch {
        bytes32 root;
        address token;
        uint128 total; // what was debited from escrow; claims can never exceed it
        uint128 claimed;
    }

    mapping(bytes32 jobId => Job) private _jobs;
    mapping(bytes32 batchId => Batch) private _batches;
    // Keyed by leaf hash: a leaf already binds provider, token and amount, and the settlement
    // side never puts two equal leaves in one batch (it aggregates per provider and token).
    mapping(bytes32 batchId => mapping(bytes32 leaf => bool)) private _claimed;
    mapping(address token => bool) public tokenAllowed;

    event TokenAllowed(address indexed token, bool allowed);
    event Deposited(bytes32 indexed jobId, address indexed buyer, address indexed token, uint256 amount);
    event BatchPosted(bytes32 indexed batchId, bytes32 root, address indexed token, uint256 total);
    event JobDebited(bytes32 indexed jobId, bytes32 indexed batchId, uint256 amount);
    event Claimed(bytes32 indexed batchId, address indexed provider, address indexed token, uint256 amount);
    event Refunded(bytes32 indexed jobId, address indexed buyer, address indexed token, uint256 amount);

    error ZeroAmount();
    error ZeroRoot();
    error TokenNotAllowed(address token);
    error JobClosed(bytes32 jobId);
    error UnknownJob(bytes32 jobId);
    error NotJobBuyer(bytes32 jobId, address buyer);
    error WrongJobToken(bytes32 jobId, address token);
    error InsufficientEscrow(bytes32 jobId, uint256 remaining, uint256 requested);
    error BatchExists(bytes32 batchId);
    error UnknownBatch(bytes32 batchId);
    error LengthMismatch();
    error EmptyBatch();
    error AlreadyClaimed(bytes32 batchId, address provider);
    error InvalidProof();
    error BatchOverdrawn(bytes32 batchId);
    error NativeTransferFailed(address to, uint256 amount);
    error ZeroRecipient();

    constructor(address admin, address operator) {
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(OPERATOR_ROLE, operator);
    }

    // ---------------------------------------------------------------- admin

    /// @notice Allow or forbid an ERC-20 for new deposits (the ledger only credits known coins).
    function setTokenAllowed(address token, bool allowed) external onlyRole(DEFAULT_ADMIN_ROLE) {
        tokenAllowed[token] = allowed;
        emit TokenAllowed(token, allowed);
    }

    // ---------------------------------------------------------------- buyers

    /// @notice Deposit native currency into a job's escrow.
    function deposit(bytes32 jobId) external payable nonReentrant {
        _credit(jobId, NATIVE, msg.value);
    }

    /// @notice Deposit an allowed ERC-20 into a job's escrow (approve this contract first).
    function depositToken(bytes32 jobId, address token, uint256 amount) external nonReentrant {
        if (token == NATIVE || !tokenAllowed[token]) revert TokenNotAllowed(token);
        // Credit what actually arrived, so a fee-on-transfer coin cannot inflate the escrow.
        uint256 before = IERC20(token).balanceOf(address(this));
        IERC20(token).safeTransferFrom(msg.sender, address(this), amount);
        _credit(jobId, token, IERC20(token).balanceOf(address(this)) - before);
    }

    function _credit(bytes32 jobId, address token, uint256 amount) private {
        if (amount == 0) revert ZeroAmount();
        Job storage job = _jobs[jobId];
        if (job.buyer == address(0)) {
            job.buyer = msg.sender;
            job.token = token;
        } else {
            if (job.closed) revert JobClosed(jobId);
            if (job.buyer != msg.sender) revert NotJobBuyer(jobId, msg.sender);
            if (job.token != token) revert WrongJobToken(jobId, token);
        }
        job.deposited += amount;
        emit Deposited(jobId, msg.sender, token, amount);
    }

    // ---------------------------------------------------------------- operator

    /// @notice Post one settlement batch: a Merkle root of (provider, token, amount) leaves and
    /// the per-job debits that fund it. The batch total is the sum of the debits.
    /// @dev batchId is chosen off-chain so that a retried post reverts instead of paying twice.
    function postBatch(
        bytes32 batchId,
        bytes32 root,
        address token,
        bytes32[] calldata jobIds,
        uint256[] calldata amounts
    ) external onlyRole(OPERATOR_ROLE) {
        if (root == bytes32(0)) revert ZeroRoot();
        if (jobIds.length != amounts.length) revert LengthMismatch();
        if (jobIds.length == 0) revert EmptyBatch();
        if (_batches[batchId].root != bytes32(0)) revert BatchExists(batchId);

        uint256 total;
        for (uint256 i = 0; i < jobIds.length; ++i) {
            bytes32 jobId = jobIds[i];
            uint256 amount = amounts[i];
            Job storage job = _jobs[jobId];
            if (job.buyer == address(0)) revert UnknownJob(jobId);
            if (job.closed) revert JobClosed(jobId);
            if (job.token != token) revert WrongJobToken(jobId, token);
            if (amount == 0) revert ZeroAmount();
            uint256 remaining = job.deposited - job.settled - job.refunded;
            if (amount > remaining) revert InsufficientEscrow(jobId, remaining, amount);
            job.settled += amount;
            total += amount;
            emit JobDebited(jobId, batchId, amount);
        }

        _batches[batchId] = Batch({root: root, token: token, total: SafeCast.toUint128(total), claimed: 0});
        emit BatchPosted(batchId, root, token, total);
    }

    /// @notice Return a job's unspent escrow to its depositor and close the job.
    function refund(bytes32 jobId) external onlyRole(OPERATOR_ROLE) nonReentrant returns (uint256) {
        Job storage job = _jobs[jobId];
        if (job.buyer == address(0)) revert UnknownJob(jobId);
        if (job.closed) revert JobClosed(jobId);
        uint256 amount = job.deposited - job.settled - job.refunded;
        // Effects before the transfer: a re-entering receiver finds the job already closed.
        job.closed = true;
        job.refunded += amount;
        emit Refunded(jobId, job.buyer, job.token, amount);
        if (amount > 0) _pay(job.token, job.buyer, amount);
        return amount;
    }

    // ---------------------------------------------------------------- providers

    /// @notice Pay `amount` of the batch's token to `provider`, proven by a Merkle proof. Anyone
    /// may submit it (a relayer, say); the money only ever goes to `provider`.
    function claim(bytes32 batchId, address provider, uint256 amount, bytes32[] calldata proof)
        external
        nonReentrant
    {
        _claim(batchId, provider, amount, proof, provider);
    }

    /// @notice The provider itself claims its leaf to another address: a contract that cannot
    /// take native currency (or a lost key's replacement) still gets its money, and nobody else
    /// can redirect it.
    function claimTo(bytes32 batchId, uint256 amount, bytes32[] calldata proof, address to)
        external
        nonReentrant
    {
        if (to == address(0)) revert ZeroRecipient();
        _claim(batchId, msg.sender, amount, proof, to);
    }

    function _claim(bytes32 batchId, address provider, uint256 amount, bytes32[] calldata proof, address to)
        private
    {
        Batch storage batch = _batches[batchId];
        if (batch.root == bytes32(0)) revert UnknownBatch(batchId);
        bytes32 leaf = leafHash(provider, batch.token, amount);
        if (_claimed[batchId][leaf]) revert AlreadyClaimed(batchId, provider);
        if (!MerkleProof.verifyCalldata(proof, batch.root, leaf)) revert InvalidProof();
        // A wrong root can never draw on escrow beyond what this batch debited.
        uint256 claimed = uint256(batch.claimed) + amount;
        if (claimed > batch.total) revert BatchOverdrawn(batchId);
        batch.claimed = uint128(claimed); // fits: it is at most total
        _claimed[batchId][leaf] = true;
        emit Claimed(batchId, provider, batch.token, amount);
        _pay(batch.token, to, amount);
    }

    // ---------------------------------------------------------------- views

    /// @notice The leaf encoding of OpenZeppelin's StandardMerkleTree for (address,address,uint256).
    function leafHash(address provider, address token, uint256 amount) public pure returns (bytes32) {
        return keccak256(bytes.concat(keccak256(abi.encode(provider, token, amount))));
    }

    function jobOf(bytes32 jobId) external view returns (Job memory) {
        return _jobs[jobId];
    }

    function remainingOf(bytes32 jobId) external view returns (uint256) {
        Job storage job = _jobs[jobId];
        return job.deposited - job.settled - job.refunded;
    }

    function batchOf(bytes32 batchId) external view returns (Batch memory) {
        return _batches[batchId];
    }

    function isClaimed(bytes32 batchId, address provider, uint256 amount) external view returns (bool) {
        Batch storage batch = _batches[batchId];
        return _claimed[batchId][leafHash(provider, batch.token, amount)];
    }

    // ---------------------------------------------------------------- internals

    function _pay(address token, address to, uint256 amount) private {
        if (token == NATIVE) {
            (bool ok,) = payable(to).call{value: amount}("");
            if (!ok) revert NativeTransferFailed(to, amount);
        } else {
            IERC20(token).safeTransfer(to, amount);
        }
    }
}
