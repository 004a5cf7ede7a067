"""Secure aggregation (SecAgg, Bonawitz et al. CCS 2017, in its SecAgg+ form: docs/privacy.md).

Each node adds two kinds of masks to its update, quantized into a prime field: pairwise masks
from X25519 key agreement, which cancel in the sum, and a self mask from a seed of its own. It
hands Shamir shares of its self-mask seed and of its pairwise secret key to the others,
encrypted for each. Once the masked inputs are in, the survivors reveal shares of the
survivors' self-mask seeds and of the dropped nodes' pairwise keys, never both for one node:
the server removes the masks from the sum and learns that sum only.

Pure functions and values, no I/O: the marketplace (marketplace/secagg) and the agent
(desktop/secagg_client.py) drive the same protocol, and the bench simulates it in process.
"""
