#!/usr/bin/env bash
# After the copy kernel, the short-row FP8 cast and the transposes' batched loads: (1) every GPU
# test with both oracles; (2) compute-sanitizer memcheck over the FP8 kernels' and the copy
# kernel's bit-exactness tests; (3) the FP8 kernels one by one at 8192² and 16384²; (4) the FP8
# default suite beside torch._scaled_mm, five alternated pairs; (5) the burn adapter bench with
# one SM reserved, three runs, and the digits training in both orderings.
set -x
export OUT=${OUT:-/tmp/o}; R=/tmp/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CUDA_PATH=/usr/local/cuda
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz && B=/tmp/gb/bin/gemmbridge
DB=tactics/h200.json
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; }
timeout 30 python3 .gpu/torch_oracle.py /tmp/oracle_shared > $R/oracle.txt 2>&1
timeout 30 python3 bench/train_oracle.py /tmp/oracle_train >> $R/oracle.txt 2>&1; mark oracles
GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train timeout 300 bash .gpu/run > $R/tests-all.txt 2>&1; echo "tests rc $?" >> $R/tests-all.txt; mark tests
grep -E "^test result|FAILED|panicked|tests rc" $R/tests-all.txt | sort | uniq -c | head -30
grep -E "^fp8 .* against the emulation" $R/tests-all.txt | sort -t: -k2 -g | tail -5
for t in /tmp/gb/tests/fp8_gpu-* /tmp/gb/tests/gemmbridge-*; do
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $t --include-ignored --test-threads 1 quantisation_kernels copy_kernel >> $R/sanitize.txt 2>&1; echo "sanitize $(basename $t) rc $?" >> $R/sanitize.txt
done; mark sanitize
grep -E "ERROR SUMMARY|rc [0-9]|^test .*(ok|FAILED)" $R/sanitize.txt
timeout 60 $B fp8 quantize --rows 8192 --cols 8192 --reps 20 > $R/quantize-8k.txt 2>&1; mark q8
timeout 60 $B fp8 quantize --rows 16384 --cols 16384 --reps 10 > $R/quantize-16k.txt 2>&1; mark q16
cat $R/quantize-8k.txt; grep -v "whole call" $R/quantize-16k.txt | awk '$NF+0<72'
F="--suite default --dtypes fp8_e4m3 --scalings tensorwise,rowwise,block"
fpeer() { timeout 90 python3 bench/peer.py $F --out $R/fpeer$1.jsonl > $R/fpeer$1.txt 2>&1; mark fpeer$1; }
fours() { timeout 90 $B bench $F --db $DB --out $R/fours$1.jsonl > $R/fours$1.txt 2>&1; mark fours$1; }
fpeer 1; fours 1; fours 2; fpeer 2; fpeer 3; fours 3; fours 4; fpeer 4; fpeer 5; fours 5
$B compare --ours $R/fours1.jsonl,$R/fours2.jsonl,$R/fours3.jsonl,$R/fours4.jsonl,$R/fours5.jsonl --peer $R/fpeer1.jsonl,$R/fpeer2.jsonl,$R/fpeer3.jsonl,$R/fpeer4.jsonl,$R/fpeer5.jsonl --bound 0.98 > $R/compare-fp8.txt 2>&1
grep -E "◂" $R/compare-fp8.txt; tail -4 $R/compare-fp8.txt
for i in 1 2 3; do
  timeout 90 bash .gpu/run bin gemmbridge-burn bench --suite "" --shapes 5120x2048x768,4096x4096x4096,8192x8192x8192 --reps 5 --dtypes f16,bf16 --sm-reserve 1 --out $R/burn-bench-$i.jsonl > $R/burn-bench-$i.txt 2>&1; echo "rc $?" >> $R/burn-bench-$i.txt; mark burn$i
  tail -9 $R/burn-bench-$i.txt
done
timeout 60 bash .gpu/run bin gemmbridge-burn train --data crates/gemmbridge/examples/data/digits.csv.gz --batch 4096 --steps 60 --modes on-tf32,on-tf32-host-wait > $R/burn-train.txt 2>&1; echo "rc $?" >> $R/burn-train.txt; mark train
tail -4 $R/burn-train.txt
T="--dtypes bf16 --ops mlp_train --reps 3"
CUBLASLT_LOG_LEVEL=5 CUBLASLT_LOG_FILE=$R/lt-train-peer.log timeout 90 python3 bench/train_peer.py $T --breakdown --out $R/train-peer.jsonl > $R/train-peer.txt 2>&1
CUBLASLT_LOG_LEVEL=5 CUBLASLT_LOG_FILE=$R/lt-train-ours.log timeout 90 $B train-bench $T --breakdown --out $R/train-ours.jsonl > $R/train-ours.txt 2>&1
for s in peer ours; do
  grep -h "Matmul\]" $R/lt-train-$s.log* | sed -E 's/^\[[^]]*\]//; s/\[[0-9]+\]//; s/ (A|B|C|D)=0X[0-9A-F]+//g; s/workSpace=0X[0-9A-F]+ //; s/stream=0X[0-9A-F]+//; s/(biasPointer|epilogueAuxPointer)=0x[0-9a-f]+//g' | sort | uniq -c | sort -rn > $R/lt-train-$s.txt
  rm -f $R/lt-train-$s.log*
done; mark traces
cut -c1-400 $R/lt-train-peer.txt | head -12; cut -c1-400 $R/lt-train-ours.txt | head -12
rm -f $OUT/*.log
tar czf $OUT/kernels-fp8-burn.tgz -C /tmp r
