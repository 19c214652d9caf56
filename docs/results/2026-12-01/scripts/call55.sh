#!/usr/bin/env bash
# Device call 55: every GPU test of the workspace at the final code (the FP8 capture test
# included), compute-sanitizer memcheck over the FP8 tests, and which kernels
# torch._scaled_mm launches per recipe at 4096^3.
set -x
export OUT=${OUT:-/tmp/o}; R=$OUT/r; mkdir -p $R
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; }
timeout 260 bash .gpu/run tests > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt; mark tests
timeout 150 bash .gpu/run sanitize quantis every_recipe a_weight an_fp8 broken_rules > $R/sanitize.txt 2>&1; echo "sanitize rc $?" >> $R/sanitize.txt; mark sanitize
timeout 40 python3 bench/probes/torch_fp8_kernels.py > $R/torch_fp8_kernels.txt 2>&1; echo "rc $?" >> $R/torch_fp8_kernels.txt; mark kernels
tar czf $OUT/call55.tgz -C $OUT r
