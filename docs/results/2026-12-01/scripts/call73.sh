# gemmbridge-burn device ordering with the spin kernel on gemmbridge's stream (stream memory ops refused on cubecl's memory, run 72): the burn crate's GPU tests (device ordering is the
# default; the stress chain, the orderings' agreement, the cross-stream fallback), the bench's
# three issue shapes in four precisions (device / host-wait / raw / raw+spin / host floor), the
# digits training in the three orderings, memcheck over a short stress chain
set -x
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CUDA_PATH=/usr/local/cuda
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv > $OUT/smi.txt
date +%T
timeout 240 bash .gpu/run tests --test-threads 1 stress_chain orderings_agree operand_from_another forward_ gradients_ linear_ unusual_views switch_off > /tmp/t.log 2>&1; echo "tests rc $?"
grep -E '^test result|panicked|hung' /tmp/t.log | grep -v 'ok. 0 passed'; grep -A5 panicked /tmp/t.log | head -30
cp /tmp/t.log $OUT/tests.log; rm -f $OUT/tests.log.tmp
date +%T
timeout 150 bash .gpu/run bin gemmbridge-burn bench --suite "" --shapes 5120x2048x768,4096x4096x4096,8192x8192x8192 --dtypes f16,bf16,f32,tf32 --reps 5 --out $OUT/burn_bench.jsonl > /tmp/b.log 2>&1; echo "bench rc $?"; tail -16 /tmp/b.log
date +%T
D=crates/gemmbridge/examples/data/digits.csv.gz
timeout 120 bash .gpu/run bin gemmbridge-burn train --data $D --batch 4096 --modes off,on-tf32,on-tf32-host-wait --out $OUT/burn_train.jsonl > /tmp/tr.log 2>&1; echo "train rc $?"; tail -6 /tmp/tr.log
date +%T
GEMMBRIDGE_STRESS_STEPS=200 timeout 100 bash .gpu/run sanitize stress_chain > /tmp/s.log 2>&1; echo "sanitize rc $?"; grep -E 'ERROR SUMMARY' /tmp/s.log | sort | uniq -c; tail -5 /tmp/s.log; rm -f $OUT/sanitize.log; cp /tmp/s.log $OUT/sanitize.log
date +%T
