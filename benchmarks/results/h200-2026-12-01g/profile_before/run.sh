# As run from the repository root in the device tool (OUT set); see ../README.md.
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache PYTHONPATH=$PWD PYTHONUNBUFFERED=1
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats --section ComputeWorkloadAnalysis --section SourceCounters"
ncu --clock-control none -k regex:wtconv_plane --launch-skip 3 --launch-count 1 $S -o $OUT/wo56 python3 benchmarks/results/h200-2026-12-01g/profile_before/wo_target.py 56 > $OUT/wo56.run.log 2>&1
ncu -i $OUT/wo56.ncu-rep --page details > $OUT/wo56.txt 2>&1
ncu -i $OUT/wo56.ncu-rep --page source --csv --print-source sass > $OUT/wo56_sass.csv 2>&1
ncu --clock-control none -k regex:wtconv_plane --launch-skip 1 --launch-count 1 $S -o $OUT/wo28 python3 benchmarks/results/h200-2026-12-01g/profile_before/wo_target.py 28 > $OUT/wo28.run.log 2>&1
ncu -i $OUT/wo28.ncu-rep --page details > $OUT/wo28.txt 2>&1
ncu -i $OUT/wo28.ncu-rep --page source --csv --print-source sass > $OUT/wo28_sass.csv 2>&1
rm -f $OUT/*.ncu-rep
gzip $OUT/*_sass.csv
ls -la $OUT; grep -E "Duration|Registers|Achieved Occupancy|Issue Slots Busy|Executed Ipc A|Theoretical Occ" $OUT/wo56.txt $OUT/wo28.txt
