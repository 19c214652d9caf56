#!/usr/bin/env bash
# The idle-gap protocol (`--gap-ms 200` on both sides), continued: (1) the training step
# (MLP blocks and single Linear layers, bf16 and f16) beside bench/train_peer.py, three
# alternated pairs; (2) the default suite, every dtype and the four dense ops, against the
# binary before the misaligned-operand path (f66092c, with only the gap option added to its
# benchmark), three alternated pairs, the same cuBLASLt-only database; (3) the peer's own
# tests.
set -x
export OUT=${OUT:-/tmp/o}; R=/tmp/gap2; mkdir -p $R $OUT
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz && B=/tmp/gb/bin/gemmbridge
mkdir -p /tmp/gold && tar -C /tmp/gold -xzf .gpu/old66-gap.tgz && OLD=/tmp/gold/gemmbridge
G="--gap-ms 200"
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi2.txt 2>&1
mark() { echo "$1 at $SECONDS s" >> $R/smi2.txt; nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi2.txt 2>&1; tar czf $OUT/gap2.tgz -C /tmp gap2; }
j() { local a=(); for i in "$@"; do a+=("$R/$i.jsonl"); done; (IFS=,; echo "${a[*]}"); }
tpeer() { timeout 100 python3 bench/train_peer.py $G --out $R/tpeer$1.jsonl > /tmp/tpeer$1.txt 2>&1; mark tpeer$1; }
tours() { timeout 100 $B train-bench $G --out $R/tours$1.jsonl > /tmp/tours$1.txt 2>&1; mark tours$1; }
tpeer 1; tours 1; tours 2; tpeer 2; tpeer 3; tours 3
$B compare --ours $(j tours1 tours2 tours3) --peer $(j tpeer1 tpeer2 tpeer3) --bound 1.0 > $R/compare-train-gap.txt 2>&1
cat $R/compare-train-gap.txt
python3 - <<'PY'
import json, sys
# the cuBLASLt entries alone: the older binary does not read cuDNN entries
d = json.load(open("tactics/h200.json"))
d["entries"] = {k: v for k, v in d["entries"].items() if v.get("library") == "cublaslt" and v.get("kind") == "gemm"}
json.dump(d, open("/tmp/h200-lt.json", "w"))
PY
D="--suite default --dtypes f32,tf32,f16,bf16 --ops matmul,linear,linear_bias,linear_bias_gelu --db /tmp/h200-lt.json $G"
dflt() { timeout 100 $2 bench $D --out $R/d$1.jsonl > /tmp/d$1.txt 2>&1; mark d$1; }
dflt old1 $OLD; dflt new1 $B; dflt new2 $B; dflt old2 $OLD; dflt old3 $OLD; dflt new3 $B
$B compare --ours $(j dnew1 dnew2 dnew3) --peer $(j dold1 dold2 dold3) --bound 0.98 > $R/compare-new-vs-old-gap.txt 2>&1
grep -E "◂" $R/compare-new-vs-old-gap.txt; tail -12 $R/compare-new-vs-old-gap.txt
timeout 120 python3 bench/test_peer.py > $R/test_peer.txt 2>&1; echo "rc $?" >> $R/test_peer.txt; tail -3 $R/test_peer.txt
tar czf $OUT/gap2.tgz -C /tmp gap2
