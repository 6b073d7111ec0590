import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
torch_threads = int(os.environ.get("TEST_THREADS", "2"))

import torch  # noqa: E402

torch.set_num_threads(torch_threads)
