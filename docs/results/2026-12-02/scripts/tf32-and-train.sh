#!/usr/bin/env bash
# (1) The one GPU-bound row left below 0.98 in old-new-5.sh's five pairs (tf32 matmul 8192³;
# both binaries make the same cuBLASLt call there, lt-tf32-*.log): the default suite's tf32
# matmul rows alone, seven more alternated pairs, the same database and gap. (2) The training
# tests' executable alone, ten times, with both oracles (its full-suite run crashed in
# Device::drop's context synchronisation, gelu-place.sh's tests.txt).
set -x
export OUT=${OUT:-/tmp/o}; R=/tmp/tf32t; rm -rf $R; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz && B=/tmp/gb/bin/gemmbridge
mkdir -p /tmp/gold && tar -C /tmp/gold -xzf .gpu/old66-gap.tgz && OLD=/tmp/gold/gemmbridge
G="--gap-ms 200"
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; tar czf $OUT/tf32t.tgz -C /tmp tf32t; }
j() { local a=(); for i in "$@"; do a+=("$R/$i.jsonl"); done; (IFS=,; echo "${a[*]}"); }
python3 - <<'PY'
import json
d = json.load(open("tactics/h200.json"))
d["entries"] = {k: v for k, v in d["entries"].items() if v.get("library") == "cublaslt" and v.get("kind") == "gemm"}
json.dump(d, open("/tmp/h200-lt.json", "w"))
PY
D="--suite default --dtypes tf32 --ops matmul --db /tmp/h200-lt.json $G"
t() { timeout 60 $2 bench $D --out $R/t$1.jsonl > $R/t$1.txt 2>&1; mark t$1; }
t old1 $OLD; t new1 $B; t new2 $B; t old2 $OLD; t old3 $OLD; t new3 $B; t new4 $B; t old4 $OLD
t old5 $OLD; t new5 $B; t new6 $B; t old6 $OLD; t old7 $OLD; t new7 $B
$B compare --ours $(j tnew1 tnew2 tnew3 tnew4 tnew5 tnew6 tnew7) --peer $(j told1 told2 told3 told4 told5 told6 told7) --bound 0.98 > $R/compare-tf32-matmul.txt 2>&1
cat $R/compare-tf32-matmul.txt
timeout 90 python3 .gpu/torch_oracle.py /tmp/oracle_shared > $R/oracle.txt 2>&1; echo "oracle rc $?" >> $R/oracle.txt
timeout 90 python3 bench/train_oracle.py /tmp/oracle_train >> $R/oracle.txt 2>&1; echo "train oracle rc $?" >> $R/oracle.txt
for i in $(seq 1 10); do
  GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train timeout 120 $(ls /tmp/gb/tests/train_gpu-*) --include-ignored > $R/train$i.txt 2>&1; echo "rc $?" >> $R/train$i.txt
  grep -E "^test |test result|crash reporter|rc " $R/train$i.txt; mark train$i
done
