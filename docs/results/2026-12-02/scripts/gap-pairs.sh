#!/usr/bin/env bash
# The idle-gap protocol (`--gap-ms 200` on both sides: the GPU drained and idle for 200 ms
# before each row's warm-up): (1) dense square + llm f16/bf16, four ops, beside PyTorch, four
# alternated pairs (peer, ours, ours, peer, ...), so that each side's runs can also be compared
# with each other (same-binary A/A); (2) the FP8 default suite beside torch._scaled_mm, three
# alternated pairs. Each step re-packs the outputs into $OUT, so a run cut short keeps what it
# finished.
set -x
export OUT=${OUT:-/tmp/o}; R=/tmp/gap; mkdir -p $R $OUT
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz && B=/tmp/gb/bin/gemmbridge
DB=tactics/h200.json; G="--gap-ms 200"
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; tar czf $OUT/gap.tgz -C /tmp gap; }
P="--dtypes f16,bf16 --ops matmul,linear,linear_bias,linear_bias_gelu $G"
peer() { for s in square llm; do timeout 80 python3 bench/peer.py --suite $s $P --out /tmp/p$1-$s.jsonl > /dev/null 2>&1; done; cat /tmp/p$1-square.jsonl /tmp/p$1-llm.jsonl > $R/gpeer$1.jsonl; mark gpeer$1; }
ours() { for s in square llm; do timeout 80 $B bench --suite $s $P --db $DB --out /tmp/o$1-$s.jsonl > /dev/null 2>&1; done; cat /tmp/o$1-square.jsonl /tmp/o$1-llm.jsonl > $R/gours$1.jsonl; mark gours$1; }
peer 1; ours 1; ours 2; peer 2; peer 3; ours 3; ours 4; peer 4
j() { local a=(); for i in "$@"; do a+=("$R/$i.jsonl"); done; (IFS=,; echo "${a[*]}"); }
$B compare --ours $(j gours1 gours2 gours3 gours4) --peer $(j gpeer1 gpeer2 gpeer3 gpeer4) --bound 0.98 > $R/compare-dense-gap.txt 2>&1
$B compare --ours $(j gours2 gours4) --peer $(j gours1 gours3) --bound 0.98 > $R/aa-ours-dense-gap.txt 2>&1
$B compare --ours $(j gpeer2 gpeer4) --peer $(j gpeer1 gpeer3) --bound 0.98 > $R/aa-peer-dense-gap.txt 2>&1
grep -E "◂" $R/compare-dense-gap.txt; tail -9 $R/compare-dense-gap.txt; tail -9 $R/aa-ours-dense-gap.txt; tail -9 $R/aa-peer-dense-gap.txt
F="--suite default --dtypes fp8_e4m3 --scalings tensorwise,rowwise,block $G"
fpeer() { timeout 100 python3 bench/peer.py $F --out $R/fpeer$1.jsonl > /tmp/fpeer$1.txt 2>&1; mark fpeer$1; }
fours() { timeout 100 $B bench $F --db $DB --out $R/fours$1.jsonl > /tmp/fours$1.txt 2>&1; mark fours$1; }
fpeer 1; fours 1; fours 2; fpeer 2; fpeer 3; fours 3
$B compare --ours $(j fours1 fours2 fours3) --peer $(j fpeer1 fpeer2 fpeer3) --bound 0.98 > $R/compare-fp8-gap.txt 2>&1
grep -E "◂" $R/compare-fp8-gap.txt; tail -4 $R/compare-fp8-gap.txt
tar czf $OUT/gap.tgz -C /tmp gap
