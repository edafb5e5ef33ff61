# The 14 x 14 stage's forward with its coarse levels in the tile's block (TileSpec.inner_levels
# at split level 1, new in this tree) against the current split (pre-pass, coarse problem on
# the register kernel, tiles), and the inner levels at split level 2, alternately in one
# process through wtconv_cuda.forward and a Tape's backward on CuPy arrays
# (benchmarks/split_threshold.py --rule). K 5, L 3. The script first prints each setting's
# y and dx against the current rule's. Then: can CuPy hold bfloat16 (from_dlpack of a torch
# bf16 tensor)?
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONUNBUFFERED=1
mkdir -p "$WTCONV_CUDA_CACHE"
PYTHONPATH=$PWD timeout 480 python3 benchmarks/split_threshold.py \
  --rule inner=1,min_pixels=0 --rule level=2,inner=1,min_pixels=0 \
  --shapes 64x384x14x14:3 32x384x14x14:3 64x192x14x14:3 16x384x14x14:3 \
  --dtypes fp32 fp16 --rounds 2 --jobs 15 --json "$OUT/inner.json" 2>&1 \
  | grep -v "^Compil" | tee "$OUT/inner.log"
timeout 60 python3 - <<'PY' 2>&1 | tee "$OUT/cupy_bf16.log"
import cupy, torch
t = torch.randn(4, 4, device="cuda").to(torch.bfloat16)
try:
    a = cupy.from_dlpack(t)
    print("cupy.from_dlpack(bf16):", a.dtype, repr(a.dtype), a.dtype.itemsize, a.dtype.kind)
except Exception as exc:
    print("cupy.from_dlpack(bf16) failed:", type(exc).__name__, exc)
try:
    import ml_dtypes
    print("ml_dtypes", ml_dtypes.__version__)
    b = cupy.zeros(3, dtype=ml_dtypes.bfloat16)
    print("cupy.zeros(bfloat16):", b.dtype)
except Exception as exc:
    print("cupy.zeros(ml_dtypes.bfloat16) failed:", type(exc).__name__, exc)
print("cupy", cupy.__version__, "has cupy.bfloat16:", hasattr(cupy, "bfloat16"))
PY
