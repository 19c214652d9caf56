#!/usr/bin/env bash
# (1) GPU tests of the SM count target and the FP8 kernels (cast-transpose tiles of 128 columns
# for 16-bit sources, cast_blk128 with 4 CTAs per SM); the kernels one by one. (2) Why matmul
# 3537x12288x2048 trails PyTorch: the llm suite's matmul rows through the database's algorithm,
# the heuristic's (no database) and cuBLAS, beside PyTorch, four rounds. (3) The burn adapter:
# GPU tests with device ordering (device-ordered GEMMs leaving one SM), and its bench with
# 0, 1 and 2 SMs left free.
set -x
export OUT=${OUT:-/tmp/o}; R=/tmp/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export CUDA_PATH=/usr/local/cuda
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz && B=/tmp/gb/bin/gemmbridge
DB=tactics/h200.json
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; }
for t in sm_target_gpu fp8_gpu; do T=$(ls /tmp/gb/tests/$t-* | head -1); timeout 120 $T --include-ignored --nocapture > $R/tests-$t.txt 2>&1; echo "rc $?" >> $R/tests-$t.txt; done; mark tests
tail -3 $R/tests-*.txt
timeout 100 $B fp8 quantize --rows 8192 --cols 8192 --reps 20 > $R/quantize-8k.txt 2>&1; echo "rc $?" >> $R/quantize-8k.txt; mark q8
timeout 100 $B fp8 quantize --rows 16384 --cols 16384 --reps 10 > $R/quantize-16k.txt 2>&1; echo "rc $?" >> $R/quantize-16k.txt; mark q16
grep -v "whole call" $R/quantize-16k.txt | awk '$NF+0<75'; grep -v "whole call" $R/quantize-8k.txt | awk '$NF+0<75'
M="--suite llm --dtypes f16,bf16 --ops matmul"
for i in 1 2 3 4; do
  timeout 60 python3 bench/peer.py $M --out $R/mpeer$i.jsonl > /dev/null 2>&1; mark mpeer$i
  timeout 60 $B bench $M --db $DB --out $R/mdb$i.jsonl > /dev/null 2>&1; mark mdb$i
  timeout 60 $B bench $M --out $R/mheur$i.jsonl > /dev/null 2>&1; mark mheur$i
  timeout 60 $B bench $M --backend blas --out $R/mblas$i.jsonl > /dev/null 2>&1; mark mblas$i
done
for v in db heur blas; do $B compare --ours $R/m${v}1.jsonl,$R/m${v}2.jsonl,$R/m${v}3.jsonl,$R/m${v}4.jsonl --peer $R/mpeer1.jsonl,$R/mpeer2.jsonl,$R/mpeer3.jsonl,$R/mpeer4.jsonl --bound 0.98 > $R/compare-matmul-$v.txt 2>&1; echo "== $v"; grep -E "3537|geomean" -A0 $R/compare-matmul-$v.txt; done
timeout 200 bash .gpu/run tests --test-threads 1 stress_chain orderings_agree operand_from_another forward_ gradients_ linear_ unusual_views switch_off > $R/burn-tests.txt 2>&1; echo "burn tests rc $?" >> $R/burn-tests.txt; mark burntests
grep -E '^test .*(ok|FAILED)$|panicked|hung|rc ' $R/burn-tests.txt | tail -20
for r in 1 0 2; do
  D=f16,bf16; [ $r = 1 ] && D=f16,bf16,f32,tf32
  timeout 120 bash .gpu/run bin gemmbridge-burn bench --suite "" --shapes 5120x2048x768,4096x4096x4096,8192x8192x8192 --reps 5 --dtypes $D --sm-reserve $r --out $R/burn-bench-r$r.jsonl > $R/burn-bench-r$r.txt 2>&1; echo "rc $?" >> $R/burn-bench-r$r.txt; mark burn-r$r
  tail -12 $R/burn-bench-r$r.txt
done
rm -f $OUT/*.log
tar czf $OUT/run3.tgz -C /tmp r
