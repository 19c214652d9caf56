#!/usr/bin/env bash
# After the review mends (a placement change keeps the forward unless a saved stride changes,
# and says so when it drops it; the 8-wide test's seed): the library's unit tests, the
# training and placement tests with both oracles, and memcheck over the 8-wide kernels' test
# (the library's own executable, found by its test list) and the placement test.
export OUT=${OUT:-/tmp/o}; R=/tmp/ft; rm -rf $R; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz
timeout 60 python3 .gpu/torch_oracle.py /tmp/oracle_shared > $R/oracle.txt 2>&1; echo "oracle rc $?" >> $R/oracle.txt
timeout 60 python3 bench/train_oracle.py /tmp/oracle_train >> $R/oracle.txt 2>&1; echo "train oracle rc $?" >> $R/oracle.txt
LIB=""; for t in /tmp/gb/tests/gemmbridge-*; do "$t" --list 2>/dev/null | grep -q the_8_wide && LIB=$t; done
export GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train
for t in $LIB /tmp/gb/tests/train_gpu-* /tmp/gb/tests/train_placement_gpu-*; do
  echo "== $(basename $t)" >> $R/tests.txt; timeout 60 $t --include-ignored >> $R/tests.txt 2>&1; echo "rc $?" >> $R/tests.txt
done
grep -E "^== |^test result|FAILED|panicked|crash reporter|^rc " $R/tests.txt
tar czf $OUT/ft.tgz -C /tmp ft
timeout 40 compute-sanitizer --tool memcheck --error-exitcode 9 $LIB --include-ignored --test-threads 1 the_8_wide > $R/sanitize.txt 2>&1; echo "sanitize 8-wide rc $?" >> $R/sanitize.txt
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $(ls /tmp/gb/tests/train_placement_gpu-*) --include-ignored --test-threads 1 >> $R/sanitize.txt 2>&1; echo "sanitize placement rc $?" >> $R/sanitize.txt
grep -E "ERROR SUMMARY|sanitize.* rc|^test .*(ok|FAILED)" $R/sanitize.txt
tar czf $OUT/ft.tgz -C /tmp ft
