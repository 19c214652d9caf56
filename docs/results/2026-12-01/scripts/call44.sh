#!/usr/bin/env bash
# Device call 44: the soak at the final code, with problems that take the padded path
# (8 threads, 180 s).
set -x
export OUT=${OUT:-/tmp/o}; R=$OUT/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz bin/gemmbridge && B=/tmp/gb/bin/gemmbridge
timeout 280 $B soak --threads 8 --seconds 180 --seed 44 --json $R/soak.json > $R/soak.txt 2>&1; echo "soak rc $? at $SECONDS s" >> $R/soak.txt
tar czf $OUT/call44.tgz -C $OUT r
