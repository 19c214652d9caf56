#!/usr/bin/env bash
# compute-sanitizer memcheck over the FP8 kernels' bit-exactness test (every kernel, both
# source layouts, both formats, every scaling, odd shapes and one larger than a grid pass).
export OUT=${OUT:-/tmp/o}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz tests && T=$(ls /tmp/gb/tests/fp8_gpu-* | head -1)
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $T --include-ignored quantisation_kernels_match --test-threads 1 > $OUT/sanitize-fp8.txt 2>&1
echo "rc $?" >> $OUT/sanitize-fp8.txt
tail -6 $OUT/sanitize-fp8.txt
