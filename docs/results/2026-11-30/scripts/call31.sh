#!/usr/bin/env bash
# Device call 31: every GPU test after the session's library changes; first call with and
# without prewarm; small suite + launch rows (with the new `fresh` column) vs PyTorch; then
# f16/bf16 square + llm in alternated pairs ordered ABBA (peer, ours, ours, peer, ...), all with
# call 27's merged database, for `gemmbridge compare`.
set -x
export OUT=/tmp/o; rm -rf $OUT; mkdir -p $OUT; R=$OUT/r; mkdir -p $R
B="bash .gpu/run bin gemmbridge"
DB=docs/results/2026-11-30/call27-tactics-merged-h200.json
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
timeout 170 bash .gpu/run tests > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
for i in 1 2; do
  timeout 20 $B firstcall >> $R/firstcall.txt 2>&1
  timeout 20 $B firstcall --prewarm >> $R/firstcall.txt 2>&1
done
timeout 60 bash .gpu/run peer --suite small --dtypes f32,tf32,f16,bf16 --out $R/peer-small.jsonl > /dev/null 2>&1
timeout 60 $B bench --suite small --db $DB --peer $R/peer-small.jsonl --out $R/ours-small.jsonl > $R/ours-small.txt 2>&1
peer() { for s in square llm; do timeout 60 bash .gpu/run peer --suite $s --dtypes f16,bf16 --out $R/peer$1-$s.jsonl > /dev/null 2>&1; done; cat $R/peer$1-square.jsonl $R/peer$1-llm.jsonl > $R/peer$1.jsonl; }
ours() { for s in square llm; do timeout 60 $B bench --suite $s --dtypes f16,bf16 --ops matmul,linear,linear_bias,linear_bias_gelu --db $DB --out $R/ours$1-$s.jsonl > /dev/null 2>&1; done; cat $R/ours$1-square.jsonl $R/ours$1-llm.jsonl > $R/ours$1.jsonl; }
echo "start pairs at $SECONDS s" >> $R/smi.txt
peer 1; ours 1
[ $SECONDS -lt 420 ] && { ours 2; peer 2; }
[ $SECONDS -lt 480 ] && { peer 3; ours 3; }
[ $SECONDS -lt 520 ] && { ours 4; peer 4; }
echo "end at $SECONDS s" >> $R/smi.txt
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv >> $R/smi.txt 2>&1
tar czf $OUT/call31.tgz -C $OUT r
