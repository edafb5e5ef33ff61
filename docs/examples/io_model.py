# docs-example: run

"""DRAM traffic of one WTConv call, in multiples of the bytes of ``x``.

Model: every operation reads each of its inputs once and writes its output
once; nothing stays in cache between operations. Batch and channels cancel in
the ratio, so one (H, W) plane is counted. Weights are ignored (a few KiB).
"""


def ceil_div(a, b):
    return -(-a // b)


def published_forward(h, w, levels):
    """(op, elements read, elements written) of the published PyTorch layer."""
    ops, grids = [], [(h, w)]
    for j in range(1, levels + 1):  # analysis, one level at a time
        hp, wp = grids[-1]
        if hp % 2 or wp % 2:
            ops.append((f"pad {j}", hp * wp, (hp + hp % 2) * (wp + wp % 2)))
        n = 4 * ceil_div(hp, 2) * ceil_div(wp, 2)  # four subbands of level j
        ops += [(f"haar {j}", n, n), (f"conv {j}", n, n), (f"scale {j}", n, n)]
        grids.append((ceil_div(hp, 2), ceil_div(wp, 2)))
    for j in range(levels, 0, -1):  # synthesis, from the deepest level
        q = grids[j][0] * grids[j][1]
        ops += [(f"add LL {j}", q if j == levels else 2 * q, q),
                (f"cat {j}", 4 * q, 4 * q),
                (f"inverse haar {j}", 4 * q, 4 * q)]
    n = h * w
    ops += [("base conv", n, n), ("base scale", n, n), ("add", 2 * n, n)]
    return ops


def fused_forward(h, w, stride=1):
    """One kernel: read x once, write y once."""
    return [("wtconv_plane", h * w, ceil_div(h, stride) * ceil_div(w, stride))]


def fused_backward(h, w, levels, kernel_size, stride=1):
    """Two kernels: dx and per-plane weight-gradient partials, then their sum.

    The partials are float32: this count is exact for float32 storage.
    """
    ntaps = kernel_size**2 * (1 + 4 * levels) + 1
    dy = ceil_div(h, stride) * ceil_div(w, stride)
    return [("wtconv_plane", h * w + dy, h * w + ntaps),
            ("wtconv_finalize", ntaps, 0)]


def ratio(ops, h, w):
    """(read, written) in multiples of one plane of x."""
    n = h * w
    return sum(op[1] for op in ops) / n, sum(op[2] for op in ops) / n


H, W, LEVELS, K = 56, 56, 5, 5  # first WTConvNeXt stage at 224 pixels
published = ratio(published_forward(H, W, LEVELS), H, W)
forward = ratio(fused_forward(H, W), H, W)
backward = ratio(fused_backward(H, W, LEVELS, K), H, W)

for name, (read, written) in [("published forward", published),
                              ("fused forward", forward),
                              ("fused backward", backward)]:
    print(f"{name:18s} read {read:5.2f}x  write {written:5.2f}x")

assert 21 < sum(published) < 22  # about 21x the input's bytes
assert forward == (1.0, 1.0)  # the floor: 2x
partials = round(backward[0] - 2, 3)  # 3x plus the partial sums, twice
assert partials == round(backward[1] - 1, 3) == 0.168
