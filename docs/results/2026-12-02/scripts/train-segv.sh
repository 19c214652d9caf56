#!/usr/bin/env bash
# The training layers' GPU test executable crashed (SIGSEGV) in the full run: each of its tests
# alone, with both oracles, and a backtrace of the one that crashes (gdb, where the machine has it).
export OUT=${OUT:-/tmp/o}; R=/tmp/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz
timeout 30 python3 .gpu/torch_oracle.py /tmp/oracle_shared > /dev/null 2>&1
timeout 30 python3 bench/train_oracle.py /tmp/oracle_train > /dev/null 2>&1
export GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train RUST_BACKTRACE=1
T=$(ls /tmp/gb/tests/train_gpu-*)
for name in $($T --include-ignored --list 2>/dev/null | grep ": test" | sed 's/: test//'); do
  timeout 120 $T --include-ignored --exact $name --nocapture > $R/train-$name.txt 2>&1; rc=$?
  echo "$name rc $rc" | tee -a $R/summary.txt
  if [ $rc -ne 0 ]; then tail -25 $R/train-$name.txt; fi
  if [ $rc -eq 139 ] && command -v gdb > /dev/null; then
    timeout 120 gdb -batch -ex run -ex bt -ex "info threads" --args $T --include-ignored --exact $name --nocapture > $R/gdb-$name.txt 2>&1
    grep -A30 "SIGSEGV" $R/gdb-$name.txt | head -40
  fi
done
command -v gdb || echo "no gdb"
tar czf $OUT/train-segv.tgz -C /tmp r
