#!/usr/bin/env bash
# (1) The spin-residency probe (device ordering's cost) with and without one SM left to the
# spinner. (2) FP8 GPU tests and the quantisation kernels one by one after the kernel
# changes (8-byte transposes, packed-f16 amax, two 1x128 groups per thread). (3) Dense square
# + llm f16/bf16, four ops, beside PyTorch, five alternated pairs. (4) The default suite against
# the binary before the padded path (f66092c), five alternated pairs, same database. (5) FP8
# default suite beside torch._scaled_mm, three alternated pairs.
set -x
export OUT=${OUT:-/tmp/o}; R=/tmp/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz && B=/tmp/gb/bin/gemmbridge
OLD=.base/gemmbridge-f66092c
DB=tactics/h200.json
LTDB=.base/h200-lt.json  # the cuBLASLt entries alone: the older binary cannot read cuDNN entries
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; }
nvcc -O2 -arch=sm_90 -o /tmp/spin bench/probes/spin_residency.cu -lcublasLt -lcuda > $R/spin.txt 2>&1 && timeout 120 /tmp/spin >> $R/spin.txt 2>&1; echo "rc $?" >> $R/spin.txt; mark spin
T=$(ls /tmp/gb/tests/fp8_gpu-* | head -1)
timeout 150 $T --include-ignored > $R/tests-fp8.txt 2>&1; echo "rc $?" >> $R/tests-fp8.txt; mark tests
timeout 100 $B fp8 quantize --rows 8192 --cols 8192 --reps 20 > $R/quantize-8k.txt 2>&1; echo "rc $?" >> $R/quantize-8k.txt; mark q8
timeout 100 $B fp8 quantize --rows 16384 --cols 16384 --reps 10 > $R/quantize-16k.txt 2>&1; echo "rc $?" >> $R/quantize-16k.txt; mark q16
P="--dtypes f16,bf16 --ops matmul,linear,linear_bias,linear_bias_gelu"
peer() { for s in square llm; do timeout 60 python3 bench/peer.py --suite $s $P --out $R/p$1-$s.jsonl > /dev/null 2>&1; done; cat $R/p$1-square.jsonl $R/p$1-llm.jsonl > $R/dpeer$1.jsonl; mark dpeer$1; }
ours() { for s in square llm; do timeout 60 $B bench --suite $s $P --db $DB --out $R/o$1-$s.jsonl > /dev/null 2>&1; done; cat $R/o$1-square.jsonl $R/o$1-llm.jsonl > $R/dours$1.jsonl; mark dours$1; }
peer 1; ours 1; ours 2; peer 2; peer 3; ours 3; ours 4; peer 4; peer 5; ours 5
$B compare --ours $R/dours1.jsonl,$R/dours2.jsonl,$R/dours3.jsonl,$R/dours4.jsonl,$R/dours5.jsonl --peer $R/dpeer1.jsonl,$R/dpeer2.jsonl,$R/dpeer3.jsonl,$R/dpeer4.jsonl,$R/dpeer5.jsonl --bound 0.98 > $R/compare-dense-vs-pytorch.txt 2>&1
tail -30 $R/compare-dense-vs-pytorch.txt
D="--suite default --dtypes f32,tf32,f16,bf16 --ops matmul,linear,linear_bias,linear_bias_gelu --db $LTDB"
dflt() { timeout 60 $2 bench $D --out $R/d$1.jsonl > $R/d$1.txt 2>&1; mark d$1; }
if [ -x $OLD ]; then
  dflt old1 $OLD; dflt new1 $B; dflt new2 $B; dflt old2 $OLD; dflt old3 $OLD; dflt new3 $B; dflt new4 $B; dflt old4 $OLD; dflt old5 $OLD; dflt new5 $B
  $B compare --ours $R/dnew1.jsonl,$R/dnew2.jsonl,$R/dnew3.jsonl,$R/dnew4.jsonl,$R/dnew5.jsonl --peer $R/dold1.jsonl,$R/dold2.jsonl,$R/dold3.jsonl,$R/dold4.jsonl,$R/dold5.jsonl --bound 0.98 > $R/compare-new-vs-old.txt 2>&1
  tail -30 $R/compare-new-vs-old.txt
fi
F="--suite default --dtypes fp8_e4m3 --scalings tensorwise,rowwise,block"
fpeer() { timeout 90 python3 bench/peer.py $F --out $R/fpeer$1.jsonl > $R/fpeer$1.txt 2>&1; mark fpeer$1; }
fours() { timeout 90 $B bench $F --db $DB --out $R/fours$1.jsonl > $R/fours$1.txt 2>&1; mark fours$1; }
fpeer 1; fours 1; fours 2; fpeer 2; fpeer 3; fours 3
$B compare --ours $R/fours1.jsonl,$R/fours2.jsonl,$R/fours3.jsonl --peer $R/fpeer1.jsonl,$R/fpeer2.jsonl,$R/fpeer3.jsonl --bound 0.98 > $R/compare-fp8.txt 2>&1
tail -20 $R/compare-fp8.txt
cat $R/spin.txt
tar czf $OUT/run2.tgz -C /tmp r
