#!/usr/bin/env bash
# The training layers' GPU tests in parallel (libtest's default threads), three times each, with
# this change's executable and the one before it (.base), both oracles.
export OUT=${OUT:-/tmp/o}; R=/tmp/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb /tmp/gbase && tar -C /tmp/gb -xzf .gpu/payload.tgz && tar -C /tmp/gbase -xzf .base/old-train.tgz
timeout 30 python3 .gpu/torch_oracle.py /tmp/oracle_shared > /dev/null 2>&1
timeout 30 python3 bench/train_oracle.py /tmp/oracle_train > /dev/null 2>&1
export GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train RUST_BACKTRACE=1
for i in 1 2 3; do
  for which in gb gbase; do
    T=$(ls /tmp/$which/tests/train_gpu-*)
    timeout 120 $T --include-ignored > $R/par-$which-$i.txt 2>&1; echo "$which run $i rc $?" | tee -a $R/summary.txt
  done
done
grep -h "panicked\|FAILED" $R/par-*.txt | head
tar czf $OUT/train-parallel.tgz -C /tmp r
