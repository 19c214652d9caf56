#!/usr/bin/env bash
# Device call 39 (gemmbridge and CLI only, after the CUDA_MEMCPY3D fix): the library's GPU
# tests (every case padded, offset bases, every epilogue padded, a padded capture); the
# misaligned suite with padding always and off, alternated (PyTorch's rows are call 38's).
set -x
export OUT=${OUT:-/tmp/o}; R=$OUT/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz bin/gemmbridge && B=/tmp/gb/bin/gemmbridge
DB=tactics/h200.json
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
timeout 150 bash .gpu/run tests > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
S="--suite misaligned --dtypes f32,tf32,f16,bf16 --ops matmul,linear --db $DB"
ours() { timeout 100 $B bench $S --padding $2 --out $R/$2$1.jsonl > $R/$2$1.txt 2>&1; echo "$2$1 rc $? at $SECONDS s" >> $R/smi.txt; }
ours 1 always; ours 1 off; ours 2 off; ours 2 always; ours 3 always
tar czf $OUT/call39.tgz -C $OUT r
