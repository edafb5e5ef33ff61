R=$OUT; mkdir -p $OUT/ab
export WTCONV_CUDA_CACHE=/tmp/wtconv_cache
for round in 1 2 3; do
  for side in base patched; do
    dir=$PWD; [ $side = patched ] && dir=/tmp/p
    (cd $dir/benchmarks && PYTHONPATH=$dir timeout 60 python3 cupy_host_profile.py --calls 2000 --top 5) > $OUT/ab/${side}_$round.txt 2>&1
    echo "$side $round: $(grep -E '^training step|^gpu.backward|^Tape.backward|gradient_arrays' $OUT/ab/${side}_$round.txt | awk '{print $(NF-1)}' | tr '\n' ' ')"
  done
done
