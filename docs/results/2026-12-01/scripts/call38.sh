#!/usr/bin/env bash
# Device call 38: every GPU test with the misaligned-operand path (every case padded, offset
# base addresses, every epilogue padded, a padded call captured after prewarm); the misaligned
# suite with padding off and always beside PyTorch (bench/peer.py), alternated, to place the
# thresholds; f16/bf16 matmul tuned into the repository's database; the soak (8 threads, 180 s).
set -x
export OUT=${OUT:-/tmp/o}; R=$OUT/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz bin/gemmbridge && B=/tmp/gb/bin/gemmbridge
DB=tactics/h200.json
smi() { nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; }
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
timeout 200 bash .gpu/run tests > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
echo "tests done at $SECONDS s" >> $R/smi.txt; smi
S="--suite misaligned --dtypes f32,tf32,f16,bf16 --ops matmul,linear"
peer() { timeout 100 python3 bench/peer.py $S --out $R/peer$1.jsonl > $R/peer$1.txt 2>&1; echo "peer$1 done at $SECONDS s" >> $R/smi.txt; }
ours() { timeout 100 $B bench $S --db $DB --padding $2 --out $R/$2$1.jsonl > $R/$2$1.txt 2>&1; echo "$2$1 done at $SECONDS s" >> $R/smi.txt; }
peer 1; ours 1 off; ours 1 always
ours 2 always; ours 2 off; peer 2
smi
cp $DB /tmp/db.json
[ $SECONDS -lt 330 ] && { timeout 150 $B tune --suite default --ops matmul --dtypes f16,bf16 --db /tmp/db.json > $R/tune.txt 2>&1; echo "tune rc $? at $SECONDS s" >> $R/smi.txt; cp /tmp/db.json $R/tactics-h200.json; }
timeout 270 $B soak --threads 8 --seconds 180 --seed 38 --json $R/soak.json > $R/soak.txt 2>&1; echo "soak rc $? at $SECONDS s" >> $R/soak.txt
smi
tar czf $OUT/call38.tgz -C $OUT r
