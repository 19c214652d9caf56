#!/usr/bin/env bash
# Device call 27: every criterion in one call. torch_peer.py --suite default (all dtypes, launch rows) and
# gemmbridge bench --suite default with one database (call 19's, with the call-23 small-suite and the
# call-26 fused square+llm entries replacing its own), twice: PyTorch first in run 1, ours first in run 2.
set -x
export OUT=/tmp/o; rm -rf $OUT; mkdir -p $OUT; R=$OUT/r; mkdir -p $R
B="bash .gpu/run bin gemmbridge"
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
peer() { timeout 150 bash .gpu/run peer --suite default --dtypes f32,tf32,f16,bf16 --out $R/peer$1.jsonl > /dev/null 2>&1; }
ours() { timeout 150 $B bench --suite default --db .gpu/merged.json --peer $R/peer$2.jsonl --out $R/ours$1.jsonl > $R/ours$1.txt 2>&1; }
peer 1; ours 1 1
[ $SECONDS -lt 330 ] && { timeout 150 $B bench --suite default --db .gpu/merged.json --out $R/ours2.jsonl > $R/ours2.txt 2>&1; peer 2; }
tar czf $OUT/call27.tgz -C $OUT r
