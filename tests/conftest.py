import os

import torch

# pytest-xdist runs one worker per core; torch's own intra-op threads on top of that
# oversubscribe the cores and make small-tensor training many times slower.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
