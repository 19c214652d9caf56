#!/usr/bin/env bash
# Device call 57: f16 sources widened by the conversion instruction only (as in call 51):
# the FP8 tests (bit-exactness) and the kernels' bandwidth.
set -x
export OUT=${OUT:-/tmp/o}; R=$OUT/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz bin/gemmbridge && NEW=/tmp/gb/bin/gemmbridge
timeout 60 bash .gpu/run tests --test-threads 1 > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
timeout 60 $NEW fp8 quantize > $R/quantize.txt 2>&1; echo "quantize rc $?" >> $R/quantize.txt
tar czf $OUT/call57.tgz -C $OUT r
