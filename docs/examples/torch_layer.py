# docs-example: not-executed (needs PyTorch and a CUDA GPU)

import torch

from wtconv_cuda.bindings.torch import WTConv2d

# The published layer's constructor (depthwise: in_channels == out_channels).
layer = WTConv2d(96, 96, kernel_size=5, stride=1, bias=True, wt_levels=3,
                 wt_type="db1").cuda()

x = torch.randn(8, 96, 56, 56, device="cuda", requires_grad=True)
y = layer(x)  # (8, 96, 56, 56): the fused forward
y.square().mean().backward()  # x.grad and every parameter's .grad

# A checkpoint of the published layer loads under its own parameter names.
checkpoint = torch.load("checkpoint.pth", map_location="cuda")  # your file
prefix = "stages.0.blocks.1.dwconv."  # the layer's name in that checkpoint
layer.load_state_dict({k[len(prefix):]: v for k, v in checkpoint.items()
                       if k.startswith(prefix)})
