#!/usr/bin/env bash
# Device call 35: every GPU test after the last library change (the capture check behind the
# replay counter, postponed captures); small suite + launch rows (fresh column) vs PyTorch.
set -x
export OUT=/tmp/o; rm -rf $OUT; mkdir -p $OUT; R=$OUT/r; mkdir -p $R
B="bash .gpu/run bin gemmbridge"
DB=docs/results/2026-11-30/call27-tactics-merged-h200.json
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
timeout 200 bash .gpu/run tests > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
for i in 1 2; do
  timeout 60 bash .gpu/run peer --suite small --dtypes f32,tf32,f16,bf16 --out $R/peer-small$i.jsonl > /dev/null 2>&1
  timeout 90 $B bench --suite small --db $DB --peer $R/peer-small$i.jsonl --out $R/ours-small$i.jsonl > $R/ours-small$i.txt 2>&1
done
tar czf $OUT/call35.tgz -C $OUT r
