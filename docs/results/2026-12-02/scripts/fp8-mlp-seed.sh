#!/usr/bin/env bash
# The FP8 MLP emulation test's failing seed on the code before this change (HEAD's test
# binary, .base/) and on this change's, twice each: is the miss new, and is it reproducible?
export OUT=${OUT:-/tmp/o}; R=/tmp/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz tests && NEW=$(ls /tmp/gb/tests/train_gpu-* | head -1)
for b in .base/train_gpu-head $NEW .base/train_gpu-head $NEW; do
  echo "== $b"
  GEMMBRIDGE_TEST_SEED=8801841979584304481 timeout 60 $b --include-ignored fp8_mlps_match_the_cpu_emulation 2>&1 | grep -E "test seed|rel error|test result"
done | tee $R/seed.txt
cp $R/seed.txt $OUT/
