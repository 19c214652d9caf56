#!/usr/bin/env bash
# After the second review's mends (crash reporter, library checks, an FP8 kernel test shape on
# the cast-transpose's 16-byte path of a partial tile): every GPU test of the gemmbridge crate
# with both oracles, then memcheck over the FP8 kernels' bit-exactness test.
export OUT=${OUT:-/tmp/o}; R=/tmp/r-rm2; rm -rf $R; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb4 && tar -C /tmp/gb4 -xzf .gpu/payload.tgz
timeout 90 python3 .gpu/torch_oracle.py /tmp/oracle_shared4 > $R/oracle.txt 2>&1; echo "oracle rc $?" >> $R/oracle.txt
timeout 90 python3 bench/train_oracle.py /tmp/oracle_train4 >> $R/oracle.txt 2>&1; echo "train oracle rc $?" >> $R/oracle.txt
GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared4 GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train4 timeout 240 bash .gpu/run > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
grep -E "^== |^test result|FAILED|panicked|crash reporter|Segmentation|tests rc" $R/tests.txt
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $(ls /tmp/gb4/tests/fp8_gpu-*) --include-ignored --test-threads 1 quantisation_kernels > $R/sanitize.txt 2>&1; echo "sanitize rc $?" >> $R/sanitize.txt
grep -E "ERROR SUMMARY|sanitize rc|^test .*(ok|FAILED)" $R/sanitize.txt
cp $R/*.txt $OUT/
