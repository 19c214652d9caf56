#!/usr/bin/env bash
# Where the MLP block's GELU-tanh runs (Mlp::set_gelu_placement): the four placements of its
# forward and backward (cuBLASLt epilogue or gemmbridge's 8-wide kernel) beside
# bench/train_peer.py, three alternated rounds, gap protocol (200 ms); then every GPU test with
# both oracles, memcheck over the new kernels' test, and the peers' changes of the previous
# stop (argument checks, lazy import) on a real PyTorch.
set -x
export OUT=${OUT:-/tmp/o}; R=/tmp/gelu; rm -rf $R; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz && B=/tmp/gb/bin/gemmbridge
G="--gap-ms 200"
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; tar czf $OUT/gelu.tgz -C /tmp gelu; }
j() { local a=(); for i in "$@"; do a+=("$R/$i.jsonl"); done; (IFS=,; echo "${a[*]}"); }
peer() { timeout 60 python3 bench/train_peer.py --ops mlp_train $G --out $R/peer$1.jsonl > $R/peer$1.txt 2>&1; mark peer$1; }
ours() { timeout 60 $B train-bench --ops mlp_train $G --gelu-forward $2 --gelu-backward $3 --breakdown --out $R/$1.jsonl > $R/$1.txt 2>&1; mark $1; }
round() { peer $1; ours ee$1 epilogue epilogue; ours ke$1 kernel epilogue; ours ek$1 epilogue kernel; ours kk$1 kernel kernel; }
rround() { ours kk$1 kernel kernel; ours ek$1 epilogue kernel; ours ke$1 kernel epilogue; ours ee$1 epilogue epilogue; peer $1; }
round 1; rround 2; round 3
for v in ee ke ek kk; do
  echo "== $v" >> $R/compare.txt
  $B compare --ours $(j ${v}1 ${v}2 ${v}3) --peer $(j peer1 peer2 peer3) --bound 1.03 >> $R/compare.txt 2>&1
  echo "== $v against ee" >> $R/compare-vs-ee.txt
  $B compare --ours $(j ${v}1 ${v}2 ${v}3) --peer $(j ee1 ee2 ee3) --bound 1.0 >> $R/compare-vs-ee.txt 2>&1
done
cat $R/compare.txt; cat $R/compare-vs-ee.txt
mark compare
timeout 90 python3 .gpu/torch_oracle.py /tmp/oracle_shared > $R/oracle.txt 2>&1; echo "oracle rc $?" >> $R/oracle.txt
timeout 90 python3 bench/train_oracle.py /tmp/oracle_train >> $R/oracle.txt 2>&1; echo "train oracle rc $?" >> $R/oracle.txt
GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train timeout 260 bash .gpu/run > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
grep -E "^== |^test result|FAILED|panicked|crash reporter|Segmentation|tests rc" $R/tests.txt
mark tests
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $(ls /tmp/gb/tests/gemmbridge-* | head -1) --include-ignored --test-threads 1 the_8_wide > $R/sanitize.txt 2>&1; echo "sanitize rc $?" >> $R/sanitize.txt
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $(ls /tmp/gb/tests/train_placement_gpu-*) --include-ignored --test-threads 1 >> $R/sanitize.txt 2>&1; echo "sanitize placement rc $?" >> $R/sanitize.txt
grep -E "ERROR SUMMARY|sanitize.* rc|^test .*(ok|FAILED)" $R/sanitize.txt
mark sanitize
timeout 60 python3 bench/train_peer.py --ops linear_train --dtypes bf16,fp8 --reps 3 --gap-ms 50 --out $R/peer-fp8.jsonl > $R/peer-fp8.txt 2>&1; echo "rc $?" >> $R/peer-fp8.txt
timeout 60 python3 bench/conv_peer.py --dtypes bf16 --ops conv_fwd --layouts nhwc --batches 1 --reps 3 --gap-ms 50 --out $R/conv-peer.jsonl > $R/conv-peer.txt 2>&1; echo "rc $?" >> $R/conv-peer.txt
timeout 60 python3 bench/train_peer.py --gap-ms -1 > $R/peer-usage.txt 2>&1; echo "rc $?" >> $R/peer-usage.txt
timeout 120 python3 bench/test_peer.py > $R/test_peer.txt 2>&1; echo "rc $?" >> $R/test_peer.txt
tail -3 $R/peer-fp8.txt $R/conv-peer.txt $R/peer-usage.txt $R/test_peer.txt
mark end
