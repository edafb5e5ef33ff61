# docs-example: not-executed (needs PyTorch, a CUDA GPU and CuPy)

import cupy as cp
import torch

import wtconv_cuda as wt

# A published WTConvNeXt checkpoint; read one layer of it (torch tensors).
checkpoint = torch.load("checkpoint.pth", map_location="cuda")
w = wt.weights_from_state_dict(checkpoint, prefix="stages.0.blocks.1.dwconv")
# Hand the tensors to CuPy without a copy.
w = wt.WTConvWeights(*(None if t is None else cp.from_dlpack(t.detach())
                       for t in w))

x = cp.random.standard_normal((8, w.channels, 56, 56), dtype=cp.float32)
y = wt.forward(x, w)  # levels=None: the checkpoint's number of levels
