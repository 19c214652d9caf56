#!/usr/bin/env bash
# The training tests' SIGSEGV with the crash reporter compiled in (test executables of the
# commit before the library-loading and NVRTC-thread changes): the whole GPU suite as
# `.gpu/run` runs it, then the training executable alone 15 times, then the whole suite again;
# every crash report collected.
export OUT=${OUT:-/tmp/o}; R=/tmp/r-segv; rm -rf $R; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ cat /proc/sys/kernel/core_pattern; ulimit -s; nproc; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $R/env.txt 2>&1
timeout 90 python3 .gpu/torch_oracle.py /tmp/oracle_shared > $R/oracle.txt 2>&1; echo "oracle rc $?" >> $R/oracle.txt
timeout 90 python3 bench/train_oracle.py /tmp/oracle_train >> $R/oracle.txt 2>&1; echo "train oracle rc $?" >> $R/oracle.txt
export GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train
full() { timeout 200 bash .gpu/run > $R/full-$1.txt 2>&1; echo "full $1 rc $? at $SECONDS s" | tee -a $R/summary.txt; }
full 1
T=$(ls /tmp/gpu-payload/tests/train_gpu-*)
for i in $(seq 15); do
  timeout 60 $T --include-ignored 2>&1 | tee $R/train-$i.txt > /dev/null
  echo "train $i rc ${PIPESTATUS[0]}" >> $R/summary.txt
done
full 2
cat $R/summary.txt
grep -l "crash reporter" $R/*.txt
for f in $(grep -l "crash reporter" $R/*.txt); do sed -n '/=== crash reporter/,/--- \/proc/p' $f | head -60; done
cp $R/*.txt $OUT/
