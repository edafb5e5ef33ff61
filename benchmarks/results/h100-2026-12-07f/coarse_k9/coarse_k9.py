"""Time and hash the CuPy backward (Tape.backward) of one configuration on the tree in PYTHONPATH."""
import hashlib, json, sys
import cupy as cp, numpy as np, torch
import wtconv_cuda as wt

B, C, H, W, L, K, dtype, mode = sys.argv[1:9]
B, C, H, W, L, K = map(int, (B, C, H, W, L, K))
tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
g = torch.Generator(device="cuda").manual_seed(1)
def rand(*shape):
    return cp.from_dlpack(torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(tdt))
w32 = wt.init_weights(channels=C, kernel_size=K, levels=L, seed=0)
w = wt.WTConvWeights(*[None if a is None else cp.from_dlpack(torch.from_numpy(np.ascontiguousarray(a)).cuda().to(tdt)) for a in w32])
xs = [rand(B, C, H, W) for _ in range(3)]
dys = [rand(B, C, H, W) for _ in range(3)]
tapes = []
for x in xs:
    t = wt.Tape(); wt.forward(x, w, tape=t); tapes.append(t)
dx, dw = tapes[0].backward(dys[0])
cp.cuda.Device().synchronize()
h = hashlib.sha256()
for a in (dx, *[a for a in dw if a is not None]):
    h.update(cp.asnumpy(a.view(cp.uint16) if dtype == "bfloat16" else a).tobytes())
if mode == "warm":
    print(json.dumps({"hash": h.hexdigest()[:16]})); sys.exit()
times = []
s, e = cp.cuda.Event(), cp.cuda.Event()
for i in range(33):
    s.record(); tapes[i % 3].backward(dys[i % 3]); e.record(); e.synchronize()
    times.append(cp.cuda.get_elapsed_time(s, e))
print(json.dumps({"config": f"{B}x{C}x{H}x{W}:L{L}:K{K}:{dtype}", "hash": h.hexdigest()[:16],
                  "median_ms": float(np.median(times[3:])), "min_ms": float(np.min(times[3:]))}))
