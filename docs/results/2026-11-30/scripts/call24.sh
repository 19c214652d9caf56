#!/usr/bin/env bash
# Device call 24: GPU tests after the capture-fallback fixes; small suite + launch vs PyTorch with the
# call-23 small database; square+llm f16/bf16 with PyTorch first (run B; call 23's run A had ours first).
set -x
export OUT=/tmp/o; mkdir -p $OUT; R=$OUT/r; mkdir -p $R
B="bash .gpu/run bin gemmbridge"
smi() { nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; echo "t=$SECONDS $1" >> $R/smi.txt; }
smi start
timeout 170 bash .gpu/run tests > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
smi tests
DBS=.gpu/tactics-small.json
timeout 60 bash .gpu/run peer --suite small --dtypes f32,tf32,f16,bf16 --out $R/peer-small3.jsonl > $R/peer-small3.txt 2>&1
timeout 60 $B bench --suite small --db $DBS --peer $R/peer-small3.jsonl --out $R/ours-small3.jsonl > $R/ours-small3.txt 2>&1
smi small
DB=docs/results/2026-11-30/call19-tactics-h200.json
for suite in square llm; do
  timeout 90 bash .gpu/run peer --suite $suite --dtypes f16,bf16 --out $R/peerB-$suite.jsonl > $R/peerB-$suite.txt 2>&1
  timeout 90 $B bench --suite $suite --dtypes f16,bf16 --ops linear,linear_bias,linear_bias_gelu --db $DB --out $R/oursB-$suite.jsonl > $R/oursB-$suite.txt 2>&1
  smi B-$suite
done
tar czf $OUT/call24.tgz -C $OUT r
