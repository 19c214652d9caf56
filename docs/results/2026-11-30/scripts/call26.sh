#!/usr/bin/env bash
# Device call 26: re-tune the f16/bf16 fused ops of square+llm with the current tuner (fresh database),
# then two comparisons with PyTorch (run 1 PyTorch first, run 2 ours first): linear with the call-19
# database, linear_bias and linear_bias_gelu with the fresh one.
set -x
export OUT=/tmp/o; rm -rf $OUT; mkdir -p $OUT; R=$OUT/r; mkdir -p $R
B="bash .gpu/run bin gemmbridge"
DB=docs/results/2026-11-30/call19-tactics-h200.json
for suite in square llm; do
  timeout 170 $B tune --suite $suite --dtypes f16,bf16 --ops linear_bias,linear_bias_gelu --db $R/fused.json > $R/tune-$suite.txt 2>&1; echo "rc $?" >> $R/tune-$suite.txt
done
ours() { for suite in square llm; do
  timeout 60 $B bench --suite $suite --dtypes f16,bf16 --ops linear --db $DB --out $R/ours$1-linear-$suite.jsonl > /dev/null 2>&1
  timeout 60 $B bench --suite $suite --dtypes f16,bf16 --ops linear_bias,linear_bias_gelu --db $R/fused.json --out $R/ours$1-fused-$suite.jsonl > /dev/null 2>&1
done; }
peer() { for suite in square llm; do timeout 60 bash .gpu/run peer --suite $suite --dtypes f16,bf16 --out $R/peer$1-$suite.jsonl > /dev/null 2>&1; done; }
peer 1; ours 1
[ $SECONDS -lt 500 ] && { ours 2; peer 2; }
tar czf $OUT/call26.tgz -C $OUT r
