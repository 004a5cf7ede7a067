"""Node failures as a bench injects them into the real system: exactly `per_round` nodes of
a round fail once they hold its tasks, rather than each node dropping out with a chance
(`NodeProfile.disconnect_p`, which loses three or more of ten nodes in some rounds and none
in others).

What follows a failure is what the marketplace and the agent do:

- `back_after_s` set: the machine restarts at once and its agent is back after that long; the
  agent's journal resumes the task it held (desktop.agent: "a crash anywhere resumes where it
  was"), so the node downloads and trains the task again and its update arrives late.
- `back_after_s` None: the node is gone; the marketplace notices from missed heartbeats after
  `detect_s` (GPUFLEX_NODE_TIMEOUT_S, then the next tick: trainer.round_lifecycle) and gives
  the lease back. Nothing here takes it up again (as the simulator's disconnects).

A round closing on its quorum does not wait for either.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from trainer.round_lifecycle import FAILURE_DETECT_S


@dataclass(frozen=True)
class Failures:
    per_round: int
    back_after_s: float | None = None
    detect_s: float = FAILURE_DETECT_S
    at: float = 0.0  # the share of its compute a failed node had done (0: at the opening)

    def __post_init__(self) -> None:
        if self.per_round < 0:
            raise ValueError(f"failures per round must be >= 0, got {self.per_round}")
        if self.back_after_s is not None and not 0 <= self.back_after_s < math.inf:
            raise ValueError(f"back_after_s must be finite and >= 0, got {self.back_after_s}")
        if not 0 <= self.detect_s < math.inf:
            raise ValueError(f"detect_s must be finite and >= 0, got {self.detect_s}")
        if not 0 <= self.at <= 1:
            raise ValueError(f"at must be a share of the compute in [0, 1], got {self.at}")

    def victims(self, nodes: int, seed: int, round_: int) -> frozenset[int]:
        """The nodes that fail in `round_`: exactly min(per_round, nodes), a pure function
        of (seed, round) so a resumed run fails the same nodes."""
        rng = random.Random(f"fail:{seed}:{round_}")
        return frozenset(rng.sample(range(nodes), min(self.per_round, nodes)))
