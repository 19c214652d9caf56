#!/usr/bin/env bash
# The default suite (every dtype, the four dense ops) against the binary before the
# misaligned-operand path (f66092c with only the gap option added to its benchmark:
# old66-gap.patch beside this script), five alternated pairs, gap protocol (200 ms), both on
# the repository's cuBLASLt entries (the older binary does not read cuDNN entries).
set -x
export OUT=${OUT:-/tmp/o}; R=/tmp/oldnew; rm -rf $R; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz && B=/tmp/gb/bin/gemmbridge
mkdir -p /tmp/gold && tar -C /tmp/gold -xzf .gpu/old66-gap.tgz && OLD=/tmp/gold/gemmbridge
G="--gap-ms 200"
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; tar czf $OUT/oldnew.tgz -C /tmp oldnew; }
j() { local a=(); for i in "$@"; do a+=("$R/$i.jsonl"); done; (IFS=,; echo "${a[*]}"); }
python3 - <<'PY'
import json
d = json.load(open("tactics/h200.json"))
d["entries"] = {k: v for k, v in d["entries"].items() if v.get("library") == "cublaslt" and v.get("kind") == "gemm"}
json.dump(d, open("/tmp/h200-lt.json", "w"))
PY
D="--suite default --dtypes f32,tf32,f16,bf16 --ops matmul,linear,linear_bias,linear_bias_gelu --db /tmp/h200-lt.json $G"
dflt() { timeout 80 $2 bench $D --out $R/d$1.jsonl > $R/d$1.txt 2>&1; mark d$1; }
dflt old1 $OLD; dflt new1 $B; dflt new2 $B; dflt old2 $OLD; dflt old3 $OLD; dflt new3 $B; dflt new4 $B; dflt old4 $OLD; dflt old5 $OLD; dflt new5 $B
$B compare --ours $(j dnew1 dnew2 dnew3 dnew4 dnew5) --peer $(j dold1 dold2 dold3 dold4 dold5) --bound 0.98 > $R/compare-new-vs-old.txt 2>&1
# each binary against itself (two pairs): the noise of the measurement
$B compare --ours $(j dnew1 dnew3) --peer $(j dnew2 dnew4) --bound 0.98 > $R/aa-new.txt 2>&1
$B compare --ours $(j dold1 dold3) --peer $(j dold2 dold4) --bound 0.98 > $R/aa-old.txt 2>&1
grep -E "◂" $R/compare-new-vs-old.txt; tail -14 $R/compare-new-vs-old.txt
# cuBLASLt's trace of the tf32 matmul rows on both binaries: which algorithm each runs
for b in new old; do
  X=$B; [ $b = old ] && X=$OLD
  CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE=$R/lt-tf32-$b.log timeout 60 $X bench --suite default --dtypes tf32 --ops matmul --reps 1 --db /tmp/h200-lt.json > /dev/null 2>&1
done
grep -c cublasLtMatmul $R/lt-tf32-*.log
mark end
