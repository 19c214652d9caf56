# training layers: GPU tests after the f32 GELU fix; 3 alternated pairs of train-bench vs bench/train_peer.py
set -x
python3 .gpu/torch_oracle.py /tmp/oracle_shared > $OUT/oracle_shared.log 2>&1
python3 bench/train_oracle.py /tmp/oracle_train > $OUT/oracle_train.log 2>&1
GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train timeout 200 bash .gpu/run tests --test-threads 1 > /dev/null 2>&1; tail -5 $OUT/tests.log
grep -E "FAIL|panicked" $OUT/tests.log | head
for i in 1 2 3; do
  if [ $i = 2 ]; then
    timeout 120 bash .gpu/run bin gemmbridge train-bench --out $OUT/ours$i.jsonl 2>&1 | tail -12
    timeout 120 python3 bench/train_peer.py --out $OUT/peer$i.jsonl 2>&1 | grep -v Warn | tail -12
  else
    timeout 120 python3 bench/train_peer.py --out $OUT/peer$i.jsonl 2>&1 | grep -v Warn | tail -12
    timeout 120 bash .gpu/run bin gemmbridge train-bench --out $OUT/ours$i.jsonl 2>&1 | tail -12
  fi
done
