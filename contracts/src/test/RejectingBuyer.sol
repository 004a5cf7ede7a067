// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @notice Test-only buyer: a contract wallet that deposits native currency into the escrow but
/// refuses any sent back to it (no receive or fallback). A push refund to it would revert and
/// strand the money; a pull withdrawal only fails its own claim, and `claimTo` sends the money
/// to an address that can take it.
contract RejectingBuyer {
    address public immutable escrow;

    constructor(address escrow_) {
        escrow = escrow_;
    }

    function depositNative(bytes32 fundingId) external payable {
        _call(abi.encodeWithSignature("deposit(bytes32)", fundingId), msg.value);
    }

    function claim(bytes32 batchId, uint256 amount, bytes32[] calldata proof) external {
        _call(
            abi.encodeWithSignature(
                "claim(bytes32,address,uint256,bytes32[])", batchId, address(this), amount, proof
            ),
            0
        );
    }

    function claimTo(bytes32 batchId, uint256 amount, bytes32[] calldata proof, address to) external {
        _call(
            abi.encodeWithSignature("claimTo(bytes32,uint256,bytes32[],address)", batchId, amount, proof, to),
            0
        );
    }

    function _call(bytes memory data, uint256 value) private {
        (bool ok, bytes memory out) = escrow.call{value: value}(data);
        if (!ok) {
            assembly {
                revert(add(out, 32), mload(out))
            }
        }
    }
}
