#!/usr/bin/env bash
# Device call 45: every GPU test after the final read's refactor (the padded copy-back built as
# the copy-in reversed); memcheck over the padded-path tests.
set -x
export OUT=${OUT:-/tmp/o}; R=$OUT/r; mkdir -p $R
timeout 150 bash .gpu/run tests > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
timeout 100 bash .gpu/run sanitize misaligned_base_addresses padded_call_captures > $R/sanitize.txt 2>&1; echo "sanitize rc $?" >> $R/sanitize.txt
tar czf $OUT/call45.tgz -C $OUT r
