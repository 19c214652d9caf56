#!/usr/bin/env bash
# Device call 43: why PyTorch's matmul is faster at 3537x12288x2048 — the same rows through
# cuBLAS (cublasGemmEx, --backend blas) beside the default (cuBLASLt, tuned) and PyTorch,
# f16/bf16 matmul on square + llm, alternated twice.
set -x
export OUT=${OUT:-/tmp/o}; R=$OUT/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz bin/gemmbridge && B=/tmp/gb/bin/gemmbridge
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; }
for s in square llm; do
  for i in 1 2; do
    timeout 60 python3 bench/peer.py --suite $s --dtypes f16,bf16 --ops matmul --out $R/peer$i-$s.jsonl > /dev/null 2>&1; mark peer$i-$s
    timeout 60 $B bench --suite $s --dtypes f16,bf16 --ops matmul --db tactics/h200.json --out $R/lt$i-$s.jsonl > /dev/null 2>&1; mark lt$i-$s
    timeout 60 $B bench --suite $s --dtypes f16,bf16 --ops matmul --backend blas --out $R/blas$i-$s.jsonl > /dev/null 2>&1; mark blas$i-$s
  done
done
tar czf $OUT/call43.tgz -C $OUT r
