"""Time the plane backward at 56 and 28 under codegen/layout variants (temporary)."""
import json, os, sys, multiprocessing as mp
import numpy as np
import cupy
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
from kernel_bench import cuda_time, device_weights
import wtconv_cuda as wt
from wtconv_cuda.kernels import codegen, layout, launch, compiler
from wtconv_cuda.kernels.warmup import compile_all

SHAPES = [(64, 96, 56, 56, 5), (64, 192, 28, 28, 4)]
ident = lambda size: size
VARIANTS = {"u13_spread": (13, None), "u13_nospread": (13, ident), "u8_spread": (8, None),
            "u20_spread": (20, None)}
if not hasattr(codegen, "PAIR_LOAD_UNROLL"):
    VARIANTS = {"base": (None, None)}
ORIG = getattr(layout, "_row_spread_phase", None)

def apply(v):
    unroll, spread = VARIANTS[v]
    if unroll is not None:
        codegen.PAIR_LOAD_UNROLL = unroll
        layout._row_spread_phase = spread or ORIG
    layout.plane_layout.cache_clear()
    for f in (launch.plan_plane, launch.plan_tiles, launch.plan_split, launch.plan_registers):
        if hasattr(f, "cache_clear"):
            f.cache_clear()

def specs():
    out = []
    for b, c, h, w, L in SHAPES:
        p = launch.Problem(b, c, h, w, 5, L, 1, "float32", True)
        out += launch.planned_specs(p, True, 232448 - 1024, 1 << 30)
    return out

def compile_variant(v):
    apply(v)
    compile_all(specs(), (9, 0), 4)

if __name__ == "__main__":
    procs = [mp.get_context("fork").Process(target=compile_variant, args=(v,)) for v in VARIANTS]
    for p in procs: p.start()
    for p in procs: p.join()
    if os.environ.get("COMPILE_ONLY"):
        sys.exit(0)
    rows = {}
    for rnd in range(2):
        for v in VARIANTS:
            apply(v)
            for b, c, h, w, L in SHAPES:
                rng = np.random.default_rng(0)
                weights = device_weights(c, 5, L, np.float32, rng)
                xs = [cupy.asarray(rng.standard_normal((b, c, h, w)).astype(np.float32)) for _ in range(3)]
                dys = [cupy.asarray(rng.standard_normal((b, c, h, w)).astype(np.float32)) for _ in range(3)]
                saved = [wt.Saved(x, weights, L, 1) for x in xs]
                ms = cuda_time(lambda s, dy: wt.backward(s, dy), list(zip(saved, dys)))
                rows.setdefault(f"{v} {h}", []).append(ms)
                print(f"round {rnd} {v:14s} {h}: backward {ms:.4f} ms", flush=True)
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), f"wo_variants_{list(VARIANTS)[0]}.json"), "w"))
