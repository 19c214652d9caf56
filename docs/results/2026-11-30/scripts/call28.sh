#!/usr/bin/env bash
# Device call 28: every GPU test at the final library code; tiny-problem tuning with the search
# shared among algorithm ids; small suite + launch rows vs PyTorch.
set -x
export OUT=/tmp/o; rm -rf $OUT; mkdir -p $OUT; R=$OUT/r; mkdir -p $R
B="bash .gpu/run bin gemmbridge"
timeout 170 bash .gpu/run tests > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
timeout 120 $B tune --suite small --dtypes f32,f16 --ops matmul,linear --db $R/tactics-tiny.json > $R/tune-tiny.txt 2>&1; echo "tune rc $?" >> $R/tune-tiny.txt
timeout 60 bash .gpu/run peer --suite small --dtypes f32,tf32,f16,bf16 --out $R/peer-small.jsonl > /dev/null 2>&1
timeout 60 $B bench --suite small --db .gpu/merged.json --peer $R/peer-small.jsonl --out $R/ours-small.jsonl > $R/ours-small.txt 2>&1
tar czf $OUT/call28.tgz -C $OUT r
