# training layers: GPU tests (failure messages), then the MLP rows with per-GEMM breakdown, untuned and tuned
python3 .gpu/torch_oracle.py /tmp/oracle_shared > /dev/null 2>&1
python3 bench/train_oracle.py /tmp/oracle_train > /dev/null 2>&1
GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train timeout 200 bash .gpu/run tests --test-threads 1 > /dev/null 2>&1
grep -E "^test |panicked" -A1 $OUT/tests.log | grep -v "^--" | head -30; rm $OUT/tests.log
timeout 150 bash .gpu/run bin gemmbridge train-bench --ops mlp_train --breakdown --out $OUT/ours_untuned.jsonl 2>&1 | grep -v "^$"
timeout 250 bash .gpu/run bin gemmbridge train-bench --ops mlp_train --breakdown --tune --out $OUT/ours_tuned.jsonl 2>&1 | grep -v "^$"
