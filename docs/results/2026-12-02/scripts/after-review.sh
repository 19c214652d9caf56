#!/usr/bin/env bash
# After the review fixes: the SM count target and FP8 GPU tests, the FP8 kernels one by one on
# 8192², and the burn adapter's GPU tests (device ordering with one SM reserved, stress chain).
export OUT=${OUT:-/tmp/o}; R=/tmp/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CUDA_PATH=/usr/local/cuda
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz && B=/tmp/gb/bin/gemmbridge
for t in sm_target_gpu fp8_gpu; do T=$(ls /tmp/gb/tests/$t-* | head -1); timeout 60 $T --include-ignored --nocapture > $R/tests-$t.txt 2>&1; echo "$t rc $?" | tee -a $R/summary.txt; grep "test result" $R/tests-$t.txt | tee -a $R/summary.txt; done
timeout 40 $B fp8 quantize --rows 8192 --cols 8192 --reps 10 > $R/quantize-8k.txt 2>&1; echo "quantize rc $?" | tee -a $R/summary.txt
timeout 170 bash .gpu/run tests --test-threads 1 stress_chain orderings_agree operand_from_another forward_ gradients_ linear_ unusual_views switch_off > $R/burn-tests.txt 2>&1; echo "burn tests rc $?" | tee -a $R/summary.txt
grep -E '^test .*(ok|FAILED)$|panicked' $R/burn-tests.txt | grep -v " ok$" | tee -a $R/summary.txt
grep -cE '^test .* ok$' $R/burn-tests.txt | tee -a $R/summary.txt
rm -f $OUT/*.log; cp $R/summary.txt $R/quantize-8k.txt $R/tests-sm_target_gpu.txt $OUT/
