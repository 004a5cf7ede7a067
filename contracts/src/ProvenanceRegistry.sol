// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";

/// @title GPUFlex provenance anchors
/// @notice The operator anchors the hash of each training round's provenance record. Anchors
/// are append-only: once (job, round) has a hash it can never change, so anyone holding a
/// model's provenance records can check that its history was not rewritten afterwards.
/// Each settlement batch's contribution root is anchored the same way, once per batch: a
/// Merkle root over one (node, contributions, samples, earnings) leaf per node, so a provider
/// can prove what the batch credited it with, against the chain, without trusting the operator.
contract ProvenanceRegistry is AccessControl {
    bytes32 public constant OPERATOR_ROLE = keccak256("OPERATOR_ROLE");

    struct Anchor {
        bytes32 recordHash;
        uint64 blockNumber;
        uint64 timestamp;
    }

    mapping(bytes32 jobId => mapping(uint256 round => Anchor)) private _anchors;
    mapping(bytes32 jobId => uint256) public anchorCount;

    struct ContributionRoot {
        bytes32 root;
        uint32 leaves; // nodes in the batch
        uint64 blockNumber;
        uint64 timestamp;
    }

    mapping(bytes32 batchId => ContributionRoot) private _contributions;

    event ProvenanceAnchored(bytes32 indexed jobId, uint256 indexed round, bytes32 recordHash);
    event ContributionsAnchored(bytes32 indexed batchId, bytes32 root, uint32 leaves);

    error ZeroRecordHash();
    error AlreadyAnchored(bytes32 jobId, uint256 round, bytes32 recordHash);
    error ContributionsAlreadyAnchored(bytes32 batchId, bytes32 root);

    constructor(address admin, address operator) {
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(OPERATOR_ROLE, operator);
    }

    function anchor(bytes32 jobId, uint256 round, bytes32 recordHash) external onlyRole(OPERATOR_ROLE) {
        if (recordHash == bytes32(0)) revert ZeroRecordHash();
        Anchor storage existing = _anchors[jobId][round];
        if (existing.recordHash != bytes32(0)) revert AlreadyAnchored(jobId, round, existing.recordHash);
        _anchors[jobId][round] =
            Anchor({recordHash: recordHash, blockNumber: uint64(block.number), timestamp: uint64(block.timestamp)});
        anchorCount[jobId] += 1;
        emit ProvenanceAnchored(jobId, round, recordHash);
    }

    /// @notice Anchor a settlement batch's contribution root, once: a second call for the same
    /// batch reverts whatever the root, so a retried anchor can never rewrite it.
    function anchorContributions(bytes32 batchId, bytes32 root, uint32 leaves)
        external
        onlyRole(OPERATOR_ROLE)
    {
        if (root == bytes32(0)) revert ZeroRecordHash();
        ContributionRoot storage existing = _contributions[batchId];
        if (existing.root != bytes32(0)) revert ContributionsAlreadyAnchored(batchId, existing.root);
        _contributions[batchId] = ContributionRoot({
            root: root,
            leaves: leaves,
            blockNumber: uint64(block.number),
            timestamp: uint64(block.timestamp)
        });
        emit ContributionsAnchored(batchId, root, leaves);
    }

    function contributionsOf(bytes32 batchId) external view returns (ContributionRoot memory) {
        return _contributions[batchId];
    }

    /// @notice The leaf encoding of OpenZeppelin's StandardMerkleTree for
    /// (bytes32 node, uint256 contributions, uint256 samples, uint256 earnings).
    function contributionLeaf(bytes32 node, uint256 contributions, uint256 samples, uint256 earnings)
        public
        pure
        returns (bytes32)
    {
        return keccak256(bytes.concat(keccak256(abi.encode(node, contributions, samples, earnings))));
    }

    /// @notice True when the batch's anchored root contains exactly this node's leaf.
    function verifyContribution(
        bytes32 batchId,
        bytes32 node,
        uint256 contributions,
        uint256 samples,
        uint256 earnings,
        bytes32[] calldata proof
    ) external view returns (bool) {
        bytes32 root = _contributions[batchId].root;
        if (root == bytes32(0)) return false;
        return MerkleProof.verifyCalldata(proof, root, contributionLeaf(node, contributions, samples, earnings));
    }

    function anchorOf(bytes32 jobId, uint256 round) external view returns (Anchor memory) {
        return _anchors[jobId][round];
    }

    /// @notice True when `recordHash` is exactly what was anchored for (job, round).
    function verify(bytes32 jobId, uint256 round, bytes32 recordHash) external view returns (bool) {
        return recordHash != bytes32(0) && _anchors[jobId][round].recordHash == recordHash;
    }
}
