#!/usr/bin/env bash
# The burn adapter with a tactic database tuned for its device-ordered GEMMs: f16/bf16 matmul on
# the square suite tuned on the whole GPU (for the raw GEMM and host-wait calls) and under an SM
# count target of the SM count less one (the device-ordered calls, one SM reserved), then the
# adapter bench with and without the database, alternated, two runs each. (The final run's
# script meant to do this but its SM-count query failed, so its "tuned" runs had only the
# whole-GPU entries: the raw GEMM tuned, the adapter's device-ordered GEMMs not.)
set -x
export OUT=${OUT:-/tmp/o}; R=/tmp/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz && B=/tmp/gb/bin/gemmbridge
SMS=$(python3 -c "import torch; print(torch.cuda.get_device_properties(0).multi_processor_count)")
echo "SMs: $SMS" > $R/sms.txt
BDB=$R/burn-tactics.json
timeout 120 $B tune --suite square --dtypes f16,bf16 --ops matmul --db $BDB > $R/tune-whole.txt 2>&1
timeout 120 $B tune --suite square --dtypes f16,bf16 --ops matmul --sm-count-target $((SMS - 1)) --db $BDB > $R/tune-sm.txt 2>&1
cat $R/tune-whole.txt $R/tune-sm.txt
bb() { timeout 90 bash .gpu/run bin gemmbridge-burn bench --suite "" --shapes 5120x2048x768,4096x4096x4096,8192x8192x8192 --reps 5 --dtypes f16,bf16 --sm-reserve 1 "$@"; }
bb --out $R/burn-plain-1.jsonl > $R/burn-plain-1.txt 2>&1
bb --db $BDB --out $R/burn-tuned-1.jsonl > $R/burn-tuned-1.txt 2>&1
bb --db $BDB --out $R/burn-tuned-2.jsonl > $R/burn-tuned-2.txt 2>&1
bb --out $R/burn-plain-2.jsonl > $R/burn-plain-2.txt 2>&1
for f in $R/burn-plain-1.txt $R/burn-tuned-1.txt $R/burn-tuned-2.txt $R/burn-plain-2.txt; do echo "== $f"; grep -E "tactic database|×[0-9]+ +(f16|bf16)" $f | awk '{print $1,$2,$3,$4,$5,$7,$8,$10}'; done
rm -f $OUT/*.log
tar czf $OUT/tuned-burn.tgz -C /tmp r
