"""The PyTorch runtime shared by the contributor app and the marketplace.

Imports neither Django nor Qt: job specs, datasets, sharding, the model zoo, local training,
update encoding, aggregation, checkpoints, provenance and the network simulator.
"""

__version__ = "0.1.0"
