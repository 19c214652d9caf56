#!/usr/bin/env bash
# Final run: (1) a tactic database for the burn adapter's square shapes, f16/bf16 matmul,
# tuned on the whole GPU and under an SM count target of the SM count less one (the adapter's
# device-ordered GEMMs); (2) the adapter bench with and without it, alternated, two runs each;
# (3) every GPU test with both oracles; (4) the training layers beside PyTorch, three
# alternated pairs.
set -x
export OUT=${OUT:-/tmp/o}; R=/tmp/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CUDA_PATH=/usr/local/cuda
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz && B=/tmp/gb/bin/gemmbridge
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; }
SMS=$(nvidia-smi --query-gpu=multiprocessor_count --format=csv,noheader 2>/dev/null | head -1); SMS=${SMS:-132}
BDB=$R/burn-tactics.json
timeout 120 $B tune --suite square --dtypes f16,bf16 --ops matmul --db $BDB > $R/tune-whole.txt 2>&1; mark tune-whole
timeout 120 $B tune --suite square --dtypes f16,bf16 --ops matmul --sm-count-target $((SMS - 1)) --db $BDB > $R/tune-sm.txt 2>&1; mark tune-sm
cat $R/tune-whole.txt $R/tune-sm.txt
BB="bin gemmbridge-burn bench --suite \"\" --shapes 5120x2048x768,4096x4096x4096,8192x8192x8192 --reps 5 --dtypes f16,bf16 --sm-reserve 1"
plain() { timeout 90 bash .gpu/run bin gemmbridge-burn bench --suite "" --shapes 5120x2048x768,4096x4096x4096,8192x8192x8192 --reps 5 --dtypes f16,bf16 --sm-reserve 1 --out $R/burn-plain-$1.jsonl > $R/burn-plain-$1.txt 2>&1; mark plain$1; }
tuned() { timeout 90 bash .gpu/run bin gemmbridge-burn bench --suite "" --shapes 5120x2048x768,4096x4096x4096,8192x8192x8192 --reps 5 --dtypes f16,bf16 --sm-reserve 1 --db $BDB --out $R/burn-tuned-$1.jsonl > $R/burn-tuned-$1.txt 2>&1; mark tuned$1; }
plain 1; tuned 1; tuned 2; plain 2
for f in $R/burn-plain-1.txt $R/burn-tuned-1.txt $R/burn-tuned-2.txt $R/burn-plain-2.txt; do echo "== $f"; grep -E "×[0-9]+ +(f16|bf16)" $f | awk '{print $1,$2,$7,$8,$10}'; done
timeout 30 python3 .gpu/torch_oracle.py /tmp/oracle_shared > $R/oracle.txt 2>&1
timeout 30 python3 bench/train_oracle.py /tmp/oracle_train >> $R/oracle.txt 2>&1; mark oracles
GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train timeout 300 bash .gpu/run > $R/tests-all.txt 2>&1; echo "tests rc $?" >> $R/tests-all.txt; mark tests
grep -E "^test result|FAILED|panicked|tests rc|Segmentation" $R/tests-all.txt | sort | uniq -c | head -30
grep -E "^fp8 .* layer" $R/tests-all.txt | awk '{print $(NF-5), $NF, $0}' | sort -g | tail -4
tpeer() { timeout 120 python3 bench/train_peer.py --dtypes bf16,f16 --out $R/tpeer$1.jsonl > $R/tpeer$1.txt 2>&1; mark tpeer$1; }
tours() { timeout 120 $B train-bench --dtypes bf16,f16 --out $R/tours$1.jsonl > $R/tours$1.txt 2>&1; mark tours$1; }
tpeer 1; tours 1; tours 2; tpeer 2; tpeer 3; tours 3
$B compare --ours $R/tours1.jsonl,$R/tours2.jsonl,$R/tours3.jsonl --peer $R/tpeer1.jsonl,$R/tpeer2.jsonl,$R/tpeer3.jsonl --bound 1.03 > $R/compare-train.txt 2>&1
cat $R/compare-train.txt | head -20
rm -f $OUT/*.log
tar czf $OUT/final-tuned-burn.tgz -C /tmp r
