#!/usr/bin/env bash
# Device call 32: the benchmark now heats each row for 200 ms before sampling (bench --heat-ms,
# default 200). f16/bf16 square + llm in four alternated pairs ordered ABBA (peer, ours, ours,
# peer, ...), then f32/tf32 square + llm in two, all with call 27's merged database, for
# `gemmbridge compare`.
set -x
export OUT=/tmp/o; rm -rf $OUT; mkdir -p $OUT; R=$OUT/r; mkdir -p $R
B="bash .gpu/run bin gemmbridge"
DB=docs/results/2026-11-30/call27-tactics-merged-h200.json
smi() { nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; }
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
peer() { for s in square llm; do timeout 90 bash .gpu/run peer --suite $s --dtypes $2 --out $R/peer$1-$s.jsonl > /dev/null 2>&1; done; cat $R/peer$1-square.jsonl $R/peer$1-llm.jsonl > $R/peer$1.jsonl; echo "peer$1 done at $SECONDS s" >> $R/smi.txt; smi; }
ours() { for s in square llm; do timeout 90 $B bench --suite $s --dtypes $2 --ops matmul,linear,linear_bias,linear_bias_gelu --db $DB --out $R/ours$1-$s.jsonl > $R/ours$1-$s.txt 2>&1; done; cat $R/ours$1-square.jsonl $R/ours$1-llm.jsonl > $R/ours$1.jsonl; echo "ours$1 done at $SECONDS s" >> $R/smi.txt; smi; }
H=f16,bf16
peer 1 $H; ours 1 $H
[ $SECONDS -lt 400 ] && { ours 2 $H; peer 2 $H; }
[ $SECONDS -lt 400 ] && { peer 3 $H; ours 3 $H; }
[ $SECONDS -lt 400 ] && { ours 4 $H; peer 4 $H; }
F=f32,tf32
[ $SECONDS -lt 440 ] && { peer 5 $F; ours 5 $F; }
[ $SECONDS -lt 500 ] && { ours 6 $F; peer 6 $F; }
tar czf $OUT/call32.tgz -C $OUT r
