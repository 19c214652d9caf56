#!/usr/bin/env bash
# Device call 56: the FP8 tests (the capture test with cudarc's event tracking off), FP8
# re-tuning of square, llm and deepgemm with the configuration search (row-wise and block: the
# heuristic offers one algorithm), then the FP8 default suite beside _scaled_mm, three pairs.
set -x
export OUT=${OUT:-/tmp/o}; R=$OUT/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz bin/gemmbridge && NEW=/tmp/gb/bin/gemmbridge
cp tactics/h200.json $R/h200.json; DB=$R/h200.json
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; }
timeout 60 bash .gpu/run tests --test-threads 1 > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt; mark tests
for s in square llm deepgemm; do
  timeout 90 $NEW tune --suite $s --dtypes fp8_e4m3 --db $DB > $R/tune_$s.txt 2>&1; echo "tune rc $?" >> $R/tune_$s.txt; mark tune_$s
done
F="--suite default --dtypes fp8_e4m3 --scalings tensorwise,rowwise,block"
fpeer() { timeout 40 python3 bench/peer.py $F --out $R/fpeer$1.jsonl > $R/fpeer$1.txt 2>&1; mark fpeer$1; }
fours() { timeout 40 $NEW bench $F --db $DB --out $R/fours$1.jsonl > $R/fours$1.txt 2>&1; mark fours$1; }
fpeer 1; fours 1; fours 2; fpeer 2; fpeer 3; fours 3
$NEW compare --ours $R/fours1.jsonl,$R/fours2.jsonl,$R/fours3.jsonl --peer $R/fpeer1.jsonl,$R/fpeer2.jsonl,$R/fpeer3.jsonl --bound 0.98 > $R/compare.txt 2>&1
tar czf $OUT/call56.tgz -C $OUT r
