#!/usr/bin/env bash
# After the library-loading and NVRTC-thread hardening and the 16-bit cast-transpose on 64x128
# tiles: (1) every GPU test with both oracles, twice (the crash reporter is in every GPU test
# executable); (2) memcheck over the FP8 kernels' bit-exactness test; (3) the FP8 kernels one by
# one, three times at 8192^2 and once at 16384^2.
export OUT=${OUT:-/tmp/o}; R=/tmp/r-hk; rm -rf $R; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb2 && tar -C /tmp/gb2 -xzf .gpu/payload.tgz && B=/tmp/gb2/bin/gemmbridge
timeout 90 python3 .gpu/torch_oracle.py /tmp/oracle_shared2 > $R/oracle.txt 2>&1; echo "oracle rc $?" >> $R/oracle.txt
timeout 90 python3 bench/train_oracle.py /tmp/oracle_train2 >> $R/oracle.txt 2>&1; echo "train oracle rc $?" >> $R/oracle.txt
export GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared2 GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train2
full() { timeout 200 bash .gpu/run > $R/tests-$1.txt 2>&1; echo "full $1 rc $? at $SECONDS s" | tee -a $R/summary.txt; }
full 1
grep -E "^test result|FAILED|panicked|crash reporter" $R/tests-1.txt | sort | uniq -c
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $(ls /tmp/gb2/tests/fp8_gpu-*) --include-ignored --test-threads 1 quantisation_kernels > $R/sanitize.txt 2>&1; echo "sanitize rc $?" >> $R/sanitize.txt
grep -E "ERROR SUMMARY|sanitize rc|^test .*(ok|FAILED)" $R/sanitize.txt
for i in 1 2 3; do timeout 60 $B fp8 quantize --rows 8192 --cols 8192 --reps 20 > $R/quantize-8k-$i.txt 2>&1; done
timeout 60 $B fp8 quantize --rows 16384 --cols 16384 --reps 10 > $R/quantize-16k.txt 2>&1
grep -h "transpose" $R/quantize-*.txt
full 2
grep -E "crash reporter|rc " $R/summary.txt $R/tests-2.txt | head
cp $R/*.txt $OUT/
