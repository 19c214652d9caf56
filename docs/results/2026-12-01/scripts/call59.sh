#!/usr/bin/env bash
# Device call 59: the batched op (bmm, 4 matmuls) tuned for square + llm, f16 and bf16, into
# the repository's tactic database, then one pair beside torch.bmm (peer, ours, ours, peer).
set -x
export OUT=${OUT:-/tmp/o}; R=$OUT/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz bin/gemmbridge && NEW=/tmp/gb/bin/gemmbridge
cp tactics/h200.json $R/h200.json; DB=$R/h200.json
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; }
for s in square llm; do
  timeout 100 $NEW tune --suite $s --dtypes f16,bf16 --ops bmm --db $DB > $R/tune_bmm_$s.txt 2>&1; echo "tune rc $?" >> $R/tune_bmm_$s.txt; mark tune_$s
done
B="--suite default --dtypes f16,bf16 --ops bmm"
bpeer() { timeout 60 python3 bench/peer.py $B --out $R/bpeer$1.jsonl > $R/bpeer$1.txt 2>&1; mark bpeer$1; }
bours() { timeout 60 $NEW bench $B --db $DB --out $R/bours$1.jsonl > $R/bours$1.txt 2>&1; mark bours$1; }
bpeer 1; bours 1; bours 2; bpeer 2
$NEW compare --ours $R/bours1.jsonl,$R/bours2.jsonl --peer $R/bpeer1.jsonl,$R/bpeer2.jsonl --bound 0.98 > $R/compare_bmm.txt 2>&1
tar czf $OUT/call59.tgz -C $OUT r
