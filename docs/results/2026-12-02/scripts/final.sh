#!/usr/bin/env bash
# At the final code, with the tactic database pruned of entries that only held the heuristic's
# own choice: (1) dense square + llm f16/bf16, four ops, beside PyTorch, five alternated pairs;
# (2) FP8 default suite beside torch._scaled_mm, three pairs; (3) the misaligned suite beside
# PyTorch, three pairs; (4) the burn adapter bench (one SM left to device ordering's wait
# kernel), twice, and a short digits training in both orderings; (5) the FP8 kernels one by
# one; (6) every GPU test with both oracles.
set -x
export OUT=${OUT:-/tmp/o}; R=/tmp/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CUDA_PATH=/usr/local/cuda
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz && B=/tmp/gb/bin/gemmbridge
DB=tactics/h200.json
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; }
P="--dtypes f16,bf16 --ops matmul,linear,linear_bias,linear_bias_gelu"
peer() { for s in square llm; do timeout 60 python3 bench/peer.py --suite $s $P --out $R/p$1-$s.jsonl > /dev/null 2>&1; done; cat $R/p$1-square.jsonl $R/p$1-llm.jsonl > $R/dpeer$1.jsonl; mark dpeer$1; }
ours() { for s in square llm; do timeout 60 $B bench --suite $s $P --db $DB --out $R/o$1-$s.jsonl > /dev/null 2>&1; done; cat $R/o$1-square.jsonl $R/o$1-llm.jsonl > $R/dours$1.jsonl; mark dours$1; }
peer 1; ours 1; ours 2; peer 2; peer 3; ours 3; ours 4; peer 4; peer 5; ours 5
$B compare --ours $R/dours1.jsonl,$R/dours2.jsonl,$R/dours3.jsonl,$R/dours4.jsonl,$R/dours5.jsonl --peer $R/dpeer1.jsonl,$R/dpeer2.jsonl,$R/dpeer3.jsonl,$R/dpeer4.jsonl,$R/dpeer5.jsonl --bound 0.98 > $R/compare-dense-vs-pytorch.txt 2>&1
grep -E "◂" $R/compare-dense-vs-pytorch.txt; tail -10 $R/compare-dense-vs-pytorch.txt
F="--suite default --dtypes fp8_e4m3 --scalings tensorwise,rowwise,block"
fpeer() { timeout 90 python3 bench/peer.py $F --out $R/fpeer$1.jsonl > $R/fpeer$1.txt 2>&1; mark fpeer$1; }
fours() { timeout 90 $B bench $F --db $DB --out $R/fours$1.jsonl > $R/fours$1.txt 2>&1; mark fours$1; }
fpeer 1; fours 1; fours 2; fpeer 2; fpeer 3; fours 3
$B compare --ours $R/fours1.jsonl,$R/fours2.jsonl,$R/fours3.jsonl --peer $R/fpeer1.jsonl,$R/fpeer2.jsonl,$R/fpeer3.jsonl --bound 0.98 > $R/compare-fp8.txt 2>&1
grep -E "◂" $R/compare-fp8.txt; tail -4 $R/compare-fp8.txt
M="--suite misaligned --dtypes f32,tf32,f16,bf16 --ops matmul,linear"
mpeer() { timeout 60 python3 bench/peer.py $M --out $R/mpeer$1.jsonl > /dev/null 2>&1; mark mpeer$1; }
mours() { timeout 60 $B bench $M --db $DB --out $R/mon$1.jsonl > /dev/null 2>&1; mark mon$1; }
mpeer 1; mours 1; mours 2; mpeer 2; mpeer 3; mours 3
$B compare --ours $R/mon1.jsonl,$R/mon2.jsonl,$R/mon3.jsonl --peer $R/mpeer1.jsonl,$R/mpeer2.jsonl,$R/mpeer3.jsonl --bound 3.0 > $R/compare-misaligned.txt 2>&1
grep -E "2047|4095|8191" $R/compare-misaligned.txt | head -40
for i in 1 2; do
  timeout 90 bash .gpu/run bin gemmbridge-burn bench --suite "" --shapes 5120x2048x768,4096x4096x4096,8192x8192x8192 --reps 5 --dtypes f16,bf16 --sm-reserve 1 --out $R/burn-bench-$i.jsonl > $R/burn-bench-$i.txt 2>&1; echo "rc $?" >> $R/burn-bench-$i.txt; mark burn$i
  tail -9 $R/burn-bench-$i.txt
done
timeout 60 bash .gpu/run bin gemmbridge-burn train --data crates/gemmbridge/examples/data/digits.csv.gz --batch 4096 --steps 60 --modes on-tf32,on-tf32-host-wait > $R/burn-train.txt 2>&1; echo "rc $?" >> $R/burn-train.txt; mark train
tail -4 $R/burn-train.txt
timeout 60 $B fp8 quantize --rows 8192 --cols 8192 --reps 20 > $R/quantize-8k.txt 2>&1; mark q8
timeout 60 $B fp8 quantize --rows 16384 --cols 16384 --reps 10 > $R/quantize-16k.txt 2>&1; mark q16
grep -v "whole call" $R/quantize-16k.txt | awk '$NF+0<70'; grep -v "whole call" $R/quantize-8k.txt | awk '$NF+0<70'
timeout 30 python3 .gpu/torch_oracle.py /tmp/oracle_shared > $R/oracle.txt 2>&1
timeout 30 python3 bench/train_oracle.py /tmp/oracle_train >> $R/oracle.txt 2>&1; mark oracles
GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train timeout 290 bash .gpu/run > $R/tests-all.txt 2>&1; echo "tests rc $?" >> $R/tests-all.txt; mark tests
grep -E "^test result|FAILED|panicked|tests rc" $R/tests-all.txt | sort | uniq -c | head -30
rm -f $OUT/*.log
tar czf $OUT/run4.tgz -C /tmp r
