#!/usr/bin/env bash
# Device call 23: GPU tests; small-suite tuning (exhaustive search + prefilter); small suite + launch
# vs PyTorch twice; then square+llm f16/bf16 with the call-19 database, the order of PyTorch and
# gemmbridge swapped between the two runs (ours first in run A, PyTorch first in run B).
set -x
export OUT=/tmp/o; mkdir -p $OUT; R=$OUT/r; mkdir -p $R
B="bash .gpu/run bin gemmbridge"
smi() { nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; echo "t=$SECONDS $1" >> $R/smi.txt; }
smi start
timeout 150 bash .gpu/run tests > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
smi tests
timeout 170 $B tune --suite small --dtypes f32,tf32,f16,bf16 --db $R/tactics-small.json > $R/tune-small.txt 2>&1; echo "tune rc $?" >> $R/tune-small.txt
smi tune
for i in 1 2; do
  timeout 60 bash .gpu/run peer --suite small --dtypes f32,tf32,f16,bf16 --out $R/peer-small$i.jsonl > $R/peer-small$i.txt 2>&1
  timeout 60 $B bench --suite small --db $R/tactics-small.json --peer $R/peer-small$i.jsonl --out $R/ours-small$i.jsonl > $R/ours-small$i.txt 2>&1
done
smi small
DB=docs/results/2026-11-30/call19-tactics-h200.json
for suite in square llm; do
  [ $SECONDS -lt 470 ] || break
  timeout 90 $B bench --suite $suite --dtypes f16,bf16 --ops linear,linear_bias,linear_bias_gelu --db $DB --out $R/oursA-$suite.jsonl > $R/oursA-$suite.txt 2>&1
  timeout 90 bash .gpu/run peer --suite $suite --dtypes f16,bf16 --out $R/peerA-$suite.jsonl > $R/peerA-$suite.txt 2>&1
  smi A-$suite
done
tar czf $OUT/call23.tgz -C $OUT r
