#!/usr/bin/env bash
# After the review mends (grid limits shared, one kernel-copy builder, quantize's shared set-up):
# every GPU test of the gemmbridge crate (packed with -p gemmbridge), then memcheck over the
# copy kernel's and the FP8 kernels' bit-exactness tests.
export OUT=${OUT:-/tmp/o}; R=/tmp/r-review; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
timeout 30 python3 .gpu/torch_oracle.py /tmp/oracle_shared > /dev/null 2>&1
timeout 30 python3 bench/train_oracle.py /tmp/oracle_train > /dev/null 2>&1
GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train timeout 240 bash .gpu/run > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
grep -E "^test result|FAILED|panicked|tests rc" $R/tests.txt | sort | uniq -c
timeout 100 bash .gpu/run sanitize copy_kernel quantisation_kernels > $R/sanitize.txt 2>&1; echo "sanitize rc $?" >> $R/sanitize.txt
grep -E "ERROR SUMMARY|sanitize rc|^test .*(ok|FAILED)" $R/sanitize.txt
cp $R/*.txt $OUT/
