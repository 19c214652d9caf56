#!/usr/bin/env bash
# Device call 22: GPU tests, small-suite tuning with the exhaustive search, small suite + launch vs PyTorch (twice, alternated).
set -x
export OUT=/tmp/o; mkdir -p $OUT; R=$OUT/r; mkdir -p $R
B="bash .gpu/run bin gemmbridge"
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
timeout 260 bash .gpu/run tests > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
timeout 200 $B tune --suite small --dtypes f32,tf32,f16,bf16 --db $R/tactics-small.json > $R/tune-small.txt 2>&1; echo "tune rc $?" >> $R/tune-small.txt
for i in 1 2; do
  timeout 60 bash .gpu/run peer --suite small --dtypes f32,tf32,f16,bf16 --out $R/peer-small$i.jsonl > $R/peer-small$i.txt 2>&1
  timeout 60 $B bench --suite small --db $R/tactics-small.json --peer $R/peer-small$i.jsonl --out $R/ours-small$i.jsonl > $R/ours-small$i.txt 2>&1
done
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv >> $R/smi.txt 2>&1
tar czf $OUT/call22.tgz -C $OUT r
