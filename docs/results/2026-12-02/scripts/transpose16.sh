#!/usr/bin/env bash
# After the 16-bit FP8 transpose moved to the 64x128 tiles: the FP8 kernels' bit-exactness
# test under memcheck, the FP8 GPU tests, and the FP8 kernels one by one (twice at 8192^2,
# once at 16384^2).
export OUT=${OUT:-/tmp/o}; R=/tmp/r-t16; rm -rf $R; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb5 && tar -C /tmp/gb5 -xzf .gpu/payload.tgz && B=/tmp/gb5/bin/gemmbridge
T=$(ls /tmp/gb5/tests/fp8_gpu-*)
timeout 120 $T --include-ignored > $R/fp8-tests.txt 2>&1; echo "fp8 tests rc $?" >> $R/fp8-tests.txt
grep -E "^test |test result|rc " $R/fp8-tests.txt
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $T --include-ignored --test-threads 1 quantisation_kernels > $R/sanitize.txt 2>&1; echo "sanitize rc $?" >> $R/sanitize.txt
grep -E "ERROR SUMMARY|sanitize rc|^test .*(ok|FAILED)" $R/sanitize.txt
for i in 1 2; do timeout 60 $B fp8 quantize --rows 8192 --cols 8192 --reps 20 > $R/quantize-8k-$i.txt 2>&1; done
timeout 60 $B fp8 quantize --rows 16384 --cols 16384 --reps 10 > $R/quantize-16k.txt 2>&1
grep -h "transpose" $R/quantize-*.txt
cp $R/*.txt $OUT/
