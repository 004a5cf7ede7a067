"""Training runtimes as packs (docs/runtime-packs.md): the Python packages a task imports
(torch built for one platform, numpy, safetensors), one content-addressed archive per plan
class, published as TUF targets beside the app's own updates.

plan.py picks the plan class for this machine, pack.py builds and reads a pack, store.py
keeps the unpacked ones (the last good one stays in use), fetch.py downloads one through The
Update Framework, active.py says which runtime a task runs with. None of them imports torch.
"""
