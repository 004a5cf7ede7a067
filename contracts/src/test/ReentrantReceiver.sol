// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

/// @notice Test-only attacker: a buyer or provider whose receive() calls straight back into the
/// escrow (a second claim, a second refund) while the first payment is still in flight. It
/// records how the re-entry ended instead of reverting, so a test can tell that the guard, and
/// nothing else, stopped it; with `bubble` set it reverts too, failing the whole payment.
contract ReentrantReceiver {
    address public immutable target;
    bytes public reentryCall;
    bool public bubble;

    uint256 public received;
    uint256 public attempts;
    bool public reentrySucceeded;
    bytes public reentryRevertData;

    constructor(address target_) {
        target = target_;
    }

    /// @notice What to send back into `target` on the next payment (empty: do nothing).
    function arm(bytes calldata call_, bool bubble_) external {
        reentryCall = call_;
        bubble = bubble_;
    }

    /// @notice Deposit native currency as this contract, so refunds come back here.
    function depositNative(bytes32 jobId) external payable {
        (bool ok, bytes memory data) = target.call{value: msg.value}(
            abi.encodeWithSignature("deposit(bytes32)", jobId)
        );
        if (!ok) {
            assembly {
                revert(add(data, 32), mload(data))
            }
        }
    }

    receive() external payable {
        received += msg.value;
        if (reentryCall.length == 0) return;
        attempts += 1;
        bytes memory call_ = reentryCall;
        delete reentryCall; // one attempt per arm, so a successful re-entry cannot loop forever
        (bool ok, bytes memory data) = target.call(call_);
        reentrySucceeded = ok;
        reentryRevertData = data;
        if (!ok && bubble) {
            assembly {
                revert(add(data, 32), mload(data))
            }
        }
    }
}
