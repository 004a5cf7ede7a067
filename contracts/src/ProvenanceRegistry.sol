// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";

/// @title GPUFlex provenance anchors
/// @notice The operator anchors the hash of each training round's provenance record. Anchors
/// are append-only: once (job, round) has a hash it can never change, so anyone holding a
/// model's provenance records can check that its history was not rewritten afterwards.
contract ProvenanceRegistry is AccessControl {
    bytes32 public constant OPERATOR_ROLE = keccak256("OPERATOR_ROLE");

    struct Anchor {
        bytes32 recordHash;
        uint64 blockNumber;
        uint64 timestamp;
    }

    mapping(bytes32 jobId => mapping(uint256 round => Anchor)) private _anchors;
    mapping(bytes32 jobId => uint256) public anchorCount;

    event ProvenanceAnchored(bytes32 indexed jobId, uint256 indexed round, bytes32 recordHash);

    error ZeroRecordHash();
    error AlreadyAnchored(bytes32 jobId, uint256 round, bytes32 recordHash);

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

    function anchorOf(bytes32 jobId, uint256 round) external view returns (Anchor memory) {
        return _anchors[jobId][round];
    }

    /// @notice True when `recordHash` is exactly what was anchored for (job, round).
    function verify(bytes32 jobId, uint256 round, bytes32 recordHash) external view returns (bool) {
        return recordHash != bytes32(0) && _anchors[jobId][round].recordHash == recordHash;
    }
}
