#!/usr/bin/env bash
# Device call 60: after the review's refactors (one cublasLtMatmul call for both plan kinds,
# one tuning verdict, scales allocated without zeroing): the FP8, cuBLASLt and GPU tests.
set -x
export OUT=${OUT:-/tmp/o}; R=$OUT/r; mkdir -p $R
timeout 170 bash .gpu/run tests > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
tar czf $OUT/call60.tgz -C $OUT r
