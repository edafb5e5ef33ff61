# WTConv2d's small step before (6ad8bf6, `git archive 6ad8bf6 wtconv_cuda | tar -x -C ab_base`,
# carried) and after the host trims (this tree, 2e66dac), alternating, twice each.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 WTCONV_CUDA_CACHE=/tmp/wtconv_cache; cd benchmarks; for r in 1 2; do for t in ab_base .; do timeout 60 python3 module_step_probe.py --tree ../$t --calls 200 --rounds 2 --profiled-steps 0 2>&1 | grep -E "from|step  |thread|7x7|no grad" ; done; done 2>&1 | tee $OUT/ab.log
