# As run from the repository root in the device tool (OUT set); see ../README.md.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONPATH=$PWD PYTHONUNBUFFERED=1
M=gpu__time_duration.sum,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,smsp__thread_inst_executed_per_inst_executed.ratio
for v in 56:64:128:4 56:56:128:4 28:32:64:4 28:28:64:2; do
  echo "== $v"
  ncu --clock-control none -k regex:wtconv_tile --launch-skip 1 --launch-count 1 --metrics $M python3 benchmarks/results/h200-2026-12-01g/ncu_fit/ncu_fit.py $v 2>&1 | grep -E "^\s+(gpu__|smsp__|l1tex|sm__|launch__)"
done > $OUT/ncu_fit.log 2>&1
cat $OUT/ncu_fit.log
