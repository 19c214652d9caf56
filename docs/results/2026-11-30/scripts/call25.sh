#!/usr/bin/env bash
# Device call 25: why f16/bf16 linear_bias_gelu at 4096^3 and 4096x6144x4096 stay below PyTorch:
# cuBLASLt traces of both sides, then ours with the call-19 database vs the heuristic alone, alternated with PyTorch.
set -x
export OUT=/tmp/o; mkdir -p $OUT; R=$OUT/r; mkdir -p $R
B="bash .gpu/run bin gemmbridge"
DB=docs/results/2026-11-30/call19-tactics-h200.json
summ() { grep -o "Adesc=.*" "$1" | grep "GELU_BIAS" | sed -E 's/ (A|B|C|D|workSpace|biasPointer|stream)=[^ ]*//g; s/beta=[^ ]* //' | sort | uniq -c > "$2"; rm -f "$1"; }
for suite in square llm; do
  CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE=$R/t-$suite.log timeout 90 bash .gpu/run peer --suite $suite --dtypes f16,bf16 --reps 2 --out $R/trace-peer-$suite.jsonl > /dev/null 2>&1
  summ $R/t-$suite.log $R/trace-torch-$suite.txt
  CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE=$R/o-$suite.log timeout 90 $B bench --suite $suite --dtypes f16,bf16 --ops linear_bias_gelu --reps 2 --db $DB --out $R/trace-ours-$suite.jsonl > /dev/null 2>&1
  summ $R/o-$suite.log $R/trace-ours-$suite.txt
done
for i in 1 2; do
  for suite in square llm; do
    timeout 90 bash .gpu/run peer --suite $suite --dtypes f16,bf16 --out $R/peer$i-$suite.jsonl > /dev/null 2>&1
    timeout 90 $B bench --suite $suite --dtypes f16,bf16 --ops linear_bias,linear_bias_gelu --db $DB --out $R/db$i-$suite.jsonl > /dev/null 2>&1
    timeout 90 $B bench --suite $suite --dtypes f16,bf16 --ops linear_bias,linear_bias_gelu --out $R/heur$i-$suite.jsonl > /dev/null 2>&1
  done
done
tar czf $OUT/call25.tgz -C $OUT r
