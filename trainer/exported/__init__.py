"""Buyers' own models as torch.export programs (`model.arch: exported`, docs/job-spec.md).

archive.py reads a `torch.export.save` archive (a zip) as JSON and raw bytes, never
unpickling; gate.py checks what it says (operators, sizes, inputs) without torch, so the web
request can refuse a hostile program; loader.py (torch) turns it into a trainable module,
and runtime.py runs it (loss, logits, train/eval modes).
"""
