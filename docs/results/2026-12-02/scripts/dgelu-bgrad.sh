#!/usr/bin/env bash
# The first layer's bias gradient in the second layer's data-gradient GEMM (DGELU_BGRAD,
# `train-bench --gelu-bias-grad data-grad`) against the layer's own weight-gradient GEMM
# (BGRADB, the default) beside bench/train_peer.py: four alternated rounds, gap protocol
# (200 ms); cuBLASLt's trace of one step of each; then every GPU test with both oracles (the
# new epilogue in every epilogue test) and memcheck over the placement test.
set -x
export OUT=${OUT:-/tmp/o}; R=/tmp/dbg; rm -rf $R; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz && B=/tmp/gb/bin/gemmbridge
G="--gap-ms 200"
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; tar czf $OUT/dbg.tgz -C /tmp dbg; }
j() { local a=(); for i in "$@"; do a+=("$R/$i.jsonl"); done; (IFS=,; echo "${a[*]}"); }
peer() { timeout 60 python3 bench/train_peer.py --ops mlp_train $G --out $R/peer$1.jsonl > $R/peer$1.txt 2>&1; mark peer$1; }
ours() { timeout 60 $B train-bench --ops mlp_train $G --gelu-bias-grad $2 --breakdown --out $R/$1.jsonl > $R/$1.txt 2>&1; mark $1; }
peer 1; ours wg1 weight-grad; ours dg1 data-grad
ours dg2 data-grad; ours wg2 weight-grad; peer 2
peer 3; ours wg3 weight-grad; ours dg3 data-grad
ours dg4 data-grad; ours wg4 weight-grad; peer 4
for v in wg dg; do
  echo "== $v" >> $R/compare.txt
  $B compare --ours $(j ${v}1 ${v}2 ${v}3 ${v}4) --peer $(j peer1 peer2 peer3 peer4) --bound 1.03 >> $R/compare.txt 2>&1
done
$B compare --ours $(j dg1 dg2 dg3 dg4) --peer $(j wg1 wg2 wg3 wg4) --bound 1.0 > $R/compare-dg-vs-wg.txt 2>&1
cat $R/compare.txt $R/compare-dg-vs-wg.txt
for v in weight-grad data-grad; do
  CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE=$R/lt-$v.log timeout 60 $B train-bench --ops mlp_train --dtypes bf16 --reps 1 --gelu-bias-grad $v > /dev/null 2>&1
done
grep -o "epilogue=EPILOGUE_[A-Z_]*.*algo=\[algoId=[0-9]* tile=[A-Z_0-9x]*" $R/lt-*.log | sed 's/epilogueAux.*algo=/algo=/' | sort | uniq -c
mark traces
timeout 90 python3 .gpu/torch_oracle.py /tmp/oracle_shared > $R/oracle.txt 2>&1; echo "oracle rc $?" >> $R/oracle.txt
timeout 90 python3 bench/train_oracle.py /tmp/oracle_train >> $R/oracle.txt 2>&1; echo "train oracle rc $?" >> $R/oracle.txt
GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train timeout 260 bash .gpu/run > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
grep -E "^== |^test result|FAILED|panicked|crash reporter|Segmentation|tests rc|epilogue cases" $R/tests.txt
mark tests
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $(ls /tmp/gb/tests/train_placement_gpu-*) --include-ignored --test-threads 1 > $R/sanitize.txt 2>&1; echo "sanitize placement rc $?" >> $R/sanitize.txt
grep -E "ERROR SUMMARY|sanitize.* rc|^test .*(ok|FAILED)" $R/sanitize.txt
mark end
