#!/usr/bin/env bash
# Device call 33: the benchmark now makes each op's rotation just before timing it, as
# torch_peer.py does (no heat). f16/bf16 square + llm in three alternated pairs ordered ABBA;
# then two pairs with --reps 300 on both sides (longer bursts, same protocol); then one f32/tf32
# pair. All with call 27's merged database.
set -x
export OUT=/tmp/o; rm -rf $OUT; mkdir -p $OUT; R=$OUT/r; mkdir -p $R
B="bash .gpu/run bin gemmbridge"
DB=docs/results/2026-11-30/call27-tactics-merged-h200.json
smi() { nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; }
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
peer() { for s in square llm; do timeout 120 bash .gpu/run peer --suite $s --dtypes $2 --reps $3 --out $R/peer$1-$s.jsonl > /dev/null 2>&1; done; cat $R/peer$1-square.jsonl $R/peer$1-llm.jsonl > $R/peer$1.jsonl; echo "peer$1 done at $SECONDS s" >> $R/smi.txt; smi; }
ours() { for s in square llm; do timeout 120 $B bench --suite $s --dtypes $2 --reps $3 --ops matmul,linear,linear_bias,linear_bias_gelu --db $DB --out $R/ours$1-$s.jsonl > $R/ours$1-$s.txt 2>&1; done; cat $R/ours$1-square.jsonl $R/ours$1-llm.jsonl > $R/ours$1.jsonl; echo "ours$1 done at $SECONDS s" >> $R/smi.txt; smi; }
H=f16,bf16
peer 1 $H 30; ours 1 $H 30
ours 2 $H 30; peer 2 $H 30
peer 3 $H 30; ours 3 $H 30
[ $SECONDS -lt 330 ] && { peer 4 $H 300; ours 4 $H 300; }
[ $SECONDS -lt 400 ] && { ours 5 $H 300; peer 5 $H 300; }
[ $SECONDS -lt 480 ] && { peer 6 f32,tf32 30; ours 6 f32,tf32 30; }
tar czf $OUT/call33.tgz -C $OUT r
