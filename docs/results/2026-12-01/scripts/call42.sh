#!/usr/bin/env bash
# Device call 42: every GPU test at the final code (tf32 padded from 2^31 multiply-adds; the
# tactic database's path checks and bad-time filter); the misaligned suite with the default
# settings beside PyTorch once more (tf32 1024^3 now direct).
set -x
export OUT=${OUT:-/tmp/o}; R=$OUT/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz bin/gemmbridge && NEW=/tmp/gb/bin/gemmbridge
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; }
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
timeout 150 bash .gpu/run tests > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt; mark tests
M="--suite misaligned --dtypes f32,tf32,f16,bf16 --ops matmul,linear"
timeout 60 python3 bench/peer.py $M --out $R/mpeer1.jsonl > $R/mpeer1.txt 2>&1; mark mpeer1
timeout 60 $NEW bench $M --db tactics/h200.json --out $R/mon1.jsonl > $R/mon1.txt 2>&1; mark mon1
tar czf $OUT/call42.tgz -C $OUT r
