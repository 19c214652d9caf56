#!/usr/bin/env bash
# Device call 58: the quantisation kernels' bandwidth at the final code, three runs back to
# back after a warm-up run (run-to-run spread of one row was up to ±15 % in calls 49-57).
set -x
export OUT=${OUT:-/tmp/o}; R=$OUT/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz bin/gemmbridge && NEW=/tmp/gb/bin/gemmbridge
for i in 0 1 2 3; do timeout 60 $NEW fp8 quantize --reps 50 > $R/quantize$i.txt 2>&1; echo "rc $?" >> $R/quantize$i.txt; done
tar czf $OUT/call58.tgz -C $OUT r
