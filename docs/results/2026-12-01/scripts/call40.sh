#!/usr/bin/env bash
# Device call 40: every GPU test at the final code (padding thresholds set, CUDA_MEMCPY3D
# fix); compute-sanitizer memcheck over the padded-path tests; the misaligned suite with the
# default settings beside PyTorch (bench/peer.py), three alternated pairs, and once with padding
# always; the default suite against the previous binary (f66092c, before the padding path) with
# the same database, three alternated pairs; square + llm f16/bf16 (four ops) beside PyTorch,
# three alternated pairs, with the repository's database.
set -x
export OUT=${OUT:-/tmp/o}; R=$OUT/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz bin/gemmbridge && NEW=/tmp/gb/bin/gemmbridge
OLD=.base/gemmbridge-f66092c
DB=tactics/h200.json
smi() { nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; }
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; }
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
timeout 150 bash .gpu/run tests > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt; mark tests
timeout 100 bash .gpu/run sanitize misaligned_base_addresses padded_call_captures > $R/sanitize.txt 2>&1; echo "sanitize rc $?" >> $R/sanitize.txt; mark sanitize
M="--suite misaligned --dtypes f32,tf32,f16,bf16 --ops matmul,linear"
mpeer() { timeout 60 python3 bench/peer.py $M --out $R/mpeer$1.jsonl > $R/mpeer$1.txt 2>&1; mark mpeer$1; }
mours() { timeout 60 $NEW bench $M --db $DB --padding $2 --out $R/m$2$1.jsonl > $R/m$2$1.txt 2>&1; mark m$2$1; }
mpeer 1; mours 1 on; mours 2 on; mpeer 2; mpeer 3; mours 3 on; mours 1 always
D="--suite default --dtypes f32,tf32,f16,bf16 --ops matmul,linear,linear_bias,linear_bias_gelu --db $DB"
dflt() { timeout 60 $2 bench $D --out $R/d$1.jsonl > $R/d$1.txt 2>&1; mark d$1; }
dflt old1 $OLD; dflt new1 $NEW; dflt new2 $NEW; dflt old2 $OLD; dflt old3 $OLD; dflt new3 $NEW
smi
P="--suite square --dtypes f16,bf16 --ops matmul,linear,linear_bias,linear_bias_gelu"
L="--suite llm --dtypes f16,bf16 --ops matmul,linear,linear_bias,linear_bias_gelu"
peer() { timeout 60 python3 bench/peer.py $P --out $R/p$1-sq.jsonl > /dev/null 2>&1; timeout 60 python3 bench/peer.py $L --out $R/p$1-llm.jsonl > /dev/null 2>&1; cat $R/p$1-sq.jsonl $R/p$1-llm.jsonl > $R/peer$1.jsonl; mark peer$1; }
ours() { timeout 60 $NEW bench $P --db $DB --out $R/o$1-sq.jsonl > /dev/null 2>&1; timeout 60 $NEW bench $L --db $DB --out $R/o$1-llm.jsonl > /dev/null 2>&1; cat $R/o$1-sq.jsonl $R/o$1-llm.jsonl > $R/ours$1.jsonl; mark ours$1; }
[ $SECONDS -lt 470 ] && { peer 1; ours 1; }
[ $SECONDS -lt 500 ] && { ours 2; peer 2; }
[ $SECONDS -lt 530 ] && { peer 3; ours 3; }
smi
tar czf $OUT/call40.tgz -C $OUT r
