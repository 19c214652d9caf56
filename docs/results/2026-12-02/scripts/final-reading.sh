#!/usr/bin/env bash
# After the final reading of the change (library checks folded into one ensure(), plot helpers,
# a kernel comment): every GPU test with both oracles, then memcheck over the FP8 kernels' test.
export OUT=${OUT:-/tmp/o}; R=/tmp/r-rm3; rm -rf $R; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb6 && tar -C /tmp/gb6 -xzf .gpu/payload.tgz
timeout 90 python3 .gpu/torch_oracle.py /tmp/oracle_shared6 > $R/oracle.txt 2>&1; echo "oracle rc $?" >> $R/oracle.txt
timeout 90 python3 bench/train_oracle.py /tmp/oracle_train6 >> $R/oracle.txt 2>&1; echo "train oracle rc $?" >> $R/oracle.txt
GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared6 GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train6 timeout 240 bash .gpu/run > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
grep -E "^== |^test result|FAILED|panicked|crash reporter|Segmentation|tests rc" $R/tests.txt
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $(ls /tmp/gb6/tests/fp8_gpu-*) --include-ignored --test-threads 1 quantisation_kernels > $R/sanitize.txt 2>&1; echo "sanitize rc $?" >> $R/sanitize.txt
grep -E "ERROR SUMMARY|sanitize rc|^test .*(ok|FAILED)" $R/sanitize.txt
cp $R/*.txt $OUT/
