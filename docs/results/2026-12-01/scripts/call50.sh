#!/usr/bin/env bash
# Device call 50: the FP8 GPU tests after the kernels' rewrite (bit-exactness), the kernels'
# bandwidth, accuracy beside PyTorch on the same inputs (bench/peer.py --accuracy), and the
# FP8 default suite beside PyTorch's _scaled_mm, three alternated pairs, with the tactic db.
set -x
export OUT=${OUT:-/tmp/o}; R=$OUT/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz bin/gemmbridge && NEW=/tmp/gb/bin/gemmbridge
DB=tactics/h200.json
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; }
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
timeout 90 bash .gpu/run tests --nocapture --test-threads 1 > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt; mark tests
timeout 60 $NEW fp8 quantize > $R/quantize.txt 2>&1; echo "quantize rc $?" >> $R/quantize.txt; mark quantize
timeout 40 $NEW fp8 accuracy --dir /tmp/acc --seed 50 > $R/accuracy.txt 2>&1; echo "accuracy rc $?" >> $R/accuracy.txt
timeout 60 python3 bench/peer.py --accuracy /tmp/acc --out $R/accuracy_peer.jsonl > $R/accuracy_peer.txt 2>&1; echo "peer accuracy rc $?" >> $R/accuracy_peer.txt; mark accuracy
F="--suite default --dtypes fp8_e4m3 --scalings tensorwise,rowwise,block"
fpeer() { timeout 90 python3 bench/peer.py $F --out $R/fpeer$1.jsonl > $R/fpeer$1.txt 2>&1; mark fpeer$1; }
fours() { timeout 90 $NEW bench $F --db $DB --out $R/fours$1.jsonl > $R/fours$1.txt 2>&1; mark fours$1; }
fpeer 1; fours 1; fours 2; fpeer 2; fpeer 3; fours 3
$NEW compare --ours $R/fours1.jsonl,$R/fours2.jsonl,$R/fours3.jsonl --peer $R/fpeer1.jsonl,$R/fpeer2.jsonl,$R/fpeer3.jsonl --bound 0.98 > $R/compare.txt 2>&1
nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1
tar czf $OUT/call50.tgz -C $OUT r
