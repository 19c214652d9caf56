#!/usr/bin/env bash
# Device call 41: every GPU test after padding learned to extend K and N (final library code);
# compute-sanitizer memcheck over the padded-path tests; the misaligned suite with the default
# settings beside PyTorch (bench/peer.py), three alternated pairs, and once with padding always.
set -x
export OUT=${OUT:-/tmp/o}; R=$OUT/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz bin/gemmbridge && NEW=/tmp/gb/bin/gemmbridge
DB=tactics/h200.json
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; }
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
timeout 150 bash .gpu/run tests > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt; mark tests
timeout 100 bash .gpu/run sanitize misaligned_base_addresses padded_call_captures > $R/sanitize.txt 2>&1; echo "sanitize rc $?" >> $R/sanitize.txt; mark sanitize
M="--suite misaligned --dtypes f32,tf32,f16,bf16 --ops matmul,linear"
mpeer() { timeout 60 python3 bench/peer.py $M --out $R/mpeer$1.jsonl > $R/mpeer$1.txt 2>&1; mark mpeer$1; }
mours() { timeout 60 $NEW bench $M --db $DB --padding $2 --out $R/m$2$1.jsonl > $R/m$2$1.txt 2>&1; mark m$2$1; }
mpeer 1; mours 1 on; mours 2 on; mpeer 2; mpeer 3; mours 3 on; mours 1 always
nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1
tar czf $OUT/call41.tgz -C $OUT r
