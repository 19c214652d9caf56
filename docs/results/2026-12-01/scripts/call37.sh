#!/usr/bin/env bash
# Device call 37: every GPU test after the engine layout change (device layer, one room per
# library, tactic database format 2); then the new `gemmbridge` against the binary of the commit
# before the change (815bfde, carried in .base/), back to back on this machine: the launch rows
# and f16/bf16 square + llm (four ops) in alternated order old, new, new, old, old, new, new, old.
# The old binary reads the format-1 database, the new one its format-2 conversion (same entries).
set -x
export OUT=${OUT:-/tmp/o}; R=$OUT/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
NEW=".gpu/bin-gemmbridge"; OLD=".base/gemmbridge-815bfde"
DBN=tactics/h200.json; DBO=docs/results/2026-11-30/call27-tactics-merged-h200.json
smi() { nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; }
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
timeout 300 bash .gpu/run tests > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
echo "tests done at $SECONDS s" >> $R/smi.txt; smi
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz bin/gemmbridge && cp /tmp/gb/bin/gemmbridge $NEW
run() { # run NAME BIN DB TAG
  for s in square llm; do
    timeout 60 $2 bench --suite $s --dtypes f16,bf16 --ops matmul,linear,linear_bias,linear_bias_gelu --db $3 --out $R/$1-$s.jsonl > $R/$1-$s.txt 2>&1
  done
  cat $R/$1-square.jsonl $R/$1-llm.jsonl > $R/$1.jsonl
  timeout 60 $2 bench --suite small --dtypes f32,tf32,f16,bf16 --ops launch --db $3 --out $R/$1-launch.jsonl > $R/$1-launch.txt 2>&1
  echo "$1 done at $SECONDS s" >> $R/smi.txt; smi
}
run old1 $OLD $DBO; run new1 $NEW $DBN
run new2 $NEW $DBN; run old2 $OLD $DBO
run old3 $OLD $DBO; run new3 $NEW $DBN
[ $SECONDS -lt 480 ] && { run new4 $NEW $DBN; run old4 $OLD $DBO; }
tar czf $OUT/call37.tgz -C $OUT r
