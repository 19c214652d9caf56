# the burn adapter at the final code (the review's fixes: set_enabled keeps the ordering, train's
# checks): its GPU tests, and a short digits training in both orderings
set -x
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CUDA_PATH=/usr/local/cuda
date +%T
timeout 150 bash .gpu/run tests --test-threads 1 stress_chain orderings_agree operand_from_another forward_ gradients_ linear_ unusual_views switch_off > /tmp/t.log 2>&1; echo "tests rc $?"
grep -E '^test .*(ok|FAILED)$|panicked|hung' /tmp/t.log; grep -A5 panicked /tmp/t.log | head -20
rm -f $OUT/tests.log
date +%T
timeout 90 bash .gpu/run bin gemmbridge-burn train --data crates/gemmbridge/examples/data/digits.csv.gz --batch 4096 --steps 60 --modes on-tf32,on-tf32-host-wait > /tmp/tr.log 2>&1; echo "train rc $?"; tail -4 /tmp/tr.log
rm -f $OUT/gemmbridge-burn.log
date +%T
