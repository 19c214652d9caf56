#!/usr/bin/env bash
# Device call 30: every GPU test at the final commit (after the final-read tidy).
export OUT=/tmp/o; rm -rf $OUT; mkdir -p $OUT/r
timeout 200 bash .gpu/run tests > $OUT/r/tests.txt 2>&1; echo "tests rc $?" >> $OUT/r/tests.txt
tar czf $OUT/call30.tgz -C $OUT r
