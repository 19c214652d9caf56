#!/usr/bin/env bash
# The misaligned path with its own copy kernel: (1) the copy kernel's and the padded path's GPU
# tests; (2) the misaligned suite, three alternated pairs beside PyTorch, with the binary from
# before the kernel (.base) interleaved; (3) cuBLASLt's API log of the FP8 block recipe, both
# sides, on the default suite (which algorithm each runs).
set -x
export OUT=${OUT:-/tmp/o}; R=/tmp/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CUDA_PATH=/usr/local/cuda
mkdir -p /tmp/gb /tmp/gbase && tar -C /tmp/gb -xzf .gpu/payload.tgz && tar -C /tmp/gbase -xzf .base/old-cli.tgz
B=/tmp/gb/bin/gemmbridge; OLD=/tmp/gbase/bin/gemmbridge; DB=tactics/h200.json
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; }
for t in /tmp/gb/tests/*; do timeout 120 $t --include-ignored copy_kernel pad misaligned 2>&1 | grep -E "^test |test result|panicked|FAILED"; done > $R/tests-pad.txt 2>&1; mark tests
grep -E "FAILED|panicked" $R/tests-pad.txt; grep -c "ok$" $R/tests-pad.txt
M="--suite misaligned --dtypes f32,tf32,f16,bf16 --ops matmul,linear"
mpeer() { timeout 60 python3 bench/peer.py $M --out $R/mpeer$1.jsonl > /dev/null 2>&1; mark mpeer$1; }
mnew() { timeout 60 $B bench $M --db $DB --out $R/mnew$1.jsonl > /dev/null 2>&1; mark mnew$1; }
mold() { timeout 60 $OLD bench $M --db $DB --out $R/mold$1.jsonl > /dev/null 2>&1; mark mold$1; }
mpeer 1; mnew 1; mold 1; mold 2; mnew 2; mpeer 2; mpeer 3; mnew 3; mold 3
$B compare --ours $R/mnew1.jsonl,$R/mnew2.jsonl,$R/mnew3.jsonl --peer $R/mpeer1.jsonl,$R/mpeer2.jsonl,$R/mpeer3.jsonl --bound 3.0 > $R/compare-misaligned.txt 2>&1
$B compare --ours $R/mnew1.jsonl,$R/mnew2.jsonl,$R/mnew3.jsonl --peer $R/mold1.jsonl,$R/mold2.jsonl,$R/mold3.jsonl --bound 1.0 > $R/compare-new-vs-driver-copies.txt 2>&1
grep -E "2047|4095|8191" $R/compare-misaligned.txt | grep -E "f16|bf16" | head -40
grep -E "2047|4095|8191" $R/compare-new-vs-driver-copies.txt | head -40
F="--suite default --dtypes fp8_e4m3 --scalings block --reps 3"
CUBLASLT_LOG_LEVEL=5 CUBLASLT_LOG_FILE=$R/lt-peer.log timeout 90 python3 bench/peer.py $F --out $R/trace-peer.jsonl > /dev/null 2>&1
CUBLASLT_LOG_LEVEL=5 CUBLASLT_LOG_FILE=$R/lt-ours.log timeout 90 $B bench $F --db $DB --out $R/trace-ours.jsonl > /dev/null 2>&1
for s in peer ours; do
  grep -h "Matmul\]" $R/lt-$s.log* | grep "8F_E4M3" | sed -E 's/^\[[^]]*\]//; s/\[[0-9]+\]//; s/ (A|B|C|D)=0X[0-9A-F]+//g; s/workSpace=0X[0-9A-F]+ //; s/stream=0X[0-9A-F]+//; s/(a|b)ScalePointer=0x[0-9a-f]+//g' | sort | uniq -c | sort -rn > $R/lt-$s-block.txt
  rm -f $R/lt-$s.log*
done
head -c 3000 $R/lt-peer-block.txt; head -c 3000 $R/lt-ours-block.txt; mark end
tar czf $OUT/pad-kernel.tgz -C /tmp r
