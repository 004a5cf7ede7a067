"""Which codec carries a job's model deltas to its nodes: a rule on the spec alone, no torch,
so the marketplace's web process (which imports no torch, issue 36) answers a claim's model
source and the round planner its download size by the rule trainer.delivery encodes with."""

from __future__ import annotations

from trainer.spec import JobSpec


def delivery_codec_name(spec: JobSpec) -> str:
    """The codec of a job's model deltas, or "none": nodes download each round's model whole.

    `auto` sends deltas for network-aware jobs (`adaptation.enabled`): plain FedAvg stays the
    textbook baseline, full fp32 downloads."""
    name = spec.compression.download_codec
    if name == "auto":
        name = "int8" if spec.adaptation.enabled else "none"
    return name
