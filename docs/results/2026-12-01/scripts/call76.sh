# conv tactics with knobs (the fix after run 74): the round-trip GPU test and memcheck over it,
# then forward and fused forward (NHWC, batch 32, four precisions) tuned again into a copy of
# tactics/h200.json, and benched from it and with the measured search, back to back; all on
# PyTorch's cuDNN 9.19
set -x
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
TC=$(python3 -c "import nvidia.cudnn as c; print(list(c.__path__)[0] + '/lib')"); mkdir -p /tmp/tc; ln -sf $TC/libcudnn.so.9 /tmp/tc/libcudnn.so
export LD_LIBRARY_PATH=/tmp/tc:$TC:$LD_LIBRARY_PATH
date +%T
timeout 60 bash .gpu/run tests measured_plans_round_trip > /tmp/c.log 2>&1; echo "conv tactic test rc $?"; grep -E '^test .*(ok|FAILED)$|panicked' /tmp/c.log; grep -A4 panicked /tmp/c.log | head; grep -E "^conv2d .*CudnnEngine" /tmp/c.log | head -3; cp /tmp/c.log $OUT/conv-tactic-test.log
timeout 90 bash .gpu/run sanitize measured_plans_round_trip > /tmp/s.log 2>&1; grep -E 'ERROR SUMMARY' /tmp/s.log | sort | uniq -c; rm -f $OUT/sanitize.log; grep -E 'ERROR SUMMARY|^test .*(ok|FAILED)$' /tmp/s.log > $OUT/sanitize-summary.txt
date +%T
cp tactics/h200.json $OUT/h200.json
timeout 200 bash .gpu/run bin gemmbridge tune --ops conv_fwd,conv_bias_relu --dtypes f32,tf32,f16,bf16 --conv-layouts nhwc --conv-batches 32 --conv-api graph --db $OUT/h200.json > /tmp/tu.log 2>&1; echo "tune rc $?"; tail -3 /tmp/tu.log; cp /tmp/tu.log $OUT/tune.txt
date +%T
i=0
for v in db search db search; do
  i=$((i+1))
  extra=""; [ $v = db ] && extra="--db $OUT/h200.json"
  timeout 60 bash .gpu/run bin gemmbridge bench --ops conv_fwd,conv_bias_relu --dtypes f32,tf32,f16,bf16 --conv-layouts nhwc --conv-batches 32 $extra --out $OUT/conv-$i-$v.jsonl > /tmp/bc.log 2>&1; echo "bench $v rc $?"
done
rm -f $OUT/gemmbridge.log
date +%T
