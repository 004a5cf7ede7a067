// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";

/// @title GPUFlex node registry
/// @notice A node registers its own address with a hash of its capabilities (GPU, memory,
/// benchmark), or the operator registers it for a provider linking its wallet. The operator
/// can deactivate a misbehaving node; only the operator can bring it back, so a deactivated
/// node cannot simply re-register.
contract NodeRegistry is AccessControl {
    bytes32 public constant OPERATOR_ROLE = keccak256("OPERATOR_ROLE");

    struct Node {
        bytes32 capabilityHash;
        uint64 registeredAt; // block number of the first registration; 0 means never registered
        bool active;
    }

    mapping(address node => Node) private _nodes;

    event NodeRegistered(address indexed node, bytes32 capabilityHash);
    event NodeUpdated(address indexed node, bytes32 capabilityHash);
    event NodeDeactivated(address indexed node);
    event NodeReactivated(address indexed node);

    error ZeroCapability();
    error NodeInactive(address node);
    error UnknownNode(address node);

    constructor(address admin, address operator) {
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(OPERATOR_ROLE, operator);
    }

    /// @notice Register the calling address, or update its capability hash.
    function register(bytes32 capabilityHash) external {
        _register(msg.sender, capabilityHash);
    }

    /// @notice The operator registers a provider's address for it, as the provider links that
    /// wallet on the marketplace (which holds no provider key). The same rules as `register`:
    /// a deactivated node stays deactivated.
    function registerFor(address nodeAddress, bytes32 capabilityHash) external onlyRole(OPERATOR_ROLE) {
        if (nodeAddress == address(0)) revert UnknownNode(nodeAddress);
        _register(nodeAddress, capabilityHash);
    }

    function _register(address nodeAddress, bytes32 capabilityHash) private {
        if (capabilityHash == bytes32(0)) revert ZeroCapability();
        Node storage node = _nodes[nodeAddress];
        if (node.registeredAt == 0) {
            node.registeredAt = uint64(block.number);
            node.active = true;
            node.capabilityHash = capabilityHash;
            emit NodeRegistered(nodeAddress, capabilityHash);
        } else {
            if (!node.active) revert NodeInactive(nodeAddress);
            node.capabilityHash = capabilityHash;
            emit NodeUpdated(nodeAddress, capabilityHash);
        }
    }

    function deactivate(address nodeAddress) external onlyRole(OPERATOR_ROLE) {
        Node storage node = _nodes[nodeAddress];
        if (node.registeredAt == 0) revert UnknownNode(nodeAddress);
        if (!node.active) revert NodeInactive(nodeAddress);
        node.active = false;
        emit NodeDeactivated(nodeAddress);
    }

    function reactivate(address nodeAddress) external onlyRole(OPERATOR_ROLE) {
        Node storage node = _nodes[nodeAddress];
        if (node.registeredAt == 0) revert UnknownNode(nodeAddress);
        node.active = true;
        emit NodeReactivated(nodeAddress);
    }

    function nodeOf(address nodeAddress) external view returns (Node memory) {
        return _nodes[nodeAddress];
    }

    function isActive(address nodeAddress) external view returns (bool) {
        return _nodes[nodeAddress].active;
    }
}
