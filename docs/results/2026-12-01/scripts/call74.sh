# the final code (conv plans in the tactic database, burn device ordering): every GPU test of the
# workspace with both oracles; the conv tactic round trip under memcheck (PyTorch's cuDNN 9.19);
# conv forward and fused forward (NHWC, batch 32, four precisions) tuned into a copy of
# tactics/h200.json on cuDNN 9.19, then benched from it
set -x
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CUDA_PATH=/usr/local/cuda
TC=$(python3 -c "import nvidia.cudnn as c; print(list(c.__path__)[0] + '/lib')"); mkdir -p /tmp/tc; ln -sf $TC/libcudnn.so.9 /tmp/tc/libcudnn.so
date +%T
python3 .gpu/torch_oracle.py /tmp/oracle_shared > /tmp/o1.log 2>&1
python3 bench/train_oracle.py /tmp/oracle_train > /tmp/o2.log 2>&1
GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train timeout 240 bash .gpu/run tests --test-threads 1 > /tmp/t.log 2>&1; echo "tests rc $?"
grep -E '^test result|panicked' /tmp/t.log | grep -v 'ok. 0 passed'; grep -A5 panicked /tmp/t.log | head -30
cp /tmp/t.log $OUT/tests.log
date +%T
LD_LIBRARY_PATH=/tmp/tc:$TC:$LD_LIBRARY_PATH timeout 60 bash .gpu/run tests measured_plans_round_trip > /tmp/c.log 2>&1; echo "conv tactic test on 9.19 rc $?"; grep -E '^test .*(ok|FAILED)$|panicked' /tmp/c.log
LD_LIBRARY_PATH=/tmp/tc:$TC:$LD_LIBRARY_PATH timeout 90 bash .gpu/run sanitize measured_plans_round_trip > /tmp/s.log 2>&1; grep -E 'ERROR SUMMARY' /tmp/s.log | sort | uniq -c; rm -f $OUT/sanitize.log; grep -E 'ERROR SUMMARY|^test .*(ok|FAILED)$' /tmp/s.log > $OUT/sanitize-summary.txt
date +%T
cp tactics/h200.json $OUT/h200.json
LD_LIBRARY_PATH=/tmp/tc:$TC:$LD_LIBRARY_PATH timeout 200 bash .gpu/run bin gemmbridge tune --ops conv_fwd,conv_bias_relu --dtypes f32,tf32,f16,bf16 --conv-layouts nhwc --conv-batches 32 --conv-api graph --db $OUT/h200.json > /tmp/tu.log 2>&1; echo "tune rc $?"; tail -5 /tmp/tu.log; cp /tmp/tu.log $OUT/tune.txt
date +%T
LD_LIBRARY_PATH=/tmp/tc:$TC:$LD_LIBRARY_PATH timeout 100 bash .gpu/run bin gemmbridge bench --ops conv_fwd,conv_bias_relu --dtypes f16,bf16 --conv-layouts nhwc --conv-batches 32 --db $OUT/h200.json --out $OUT/conv-db.jsonl > /tmp/bc.log 2>&1; echo "bench rc $?"; tail -4 /tmp/bc.log; cp /tmp/bc.log $OUT/conv-db.txt
date +%T
