#!/usr/bin/env bash
# After the library checks stopped loading and unloading cuBLASLt on every FP8 call: the FP8
# default suite beside torch._scaled_mm, five alternated pairs, with the binary before that change
# (`old`, same FP8 code) interleaved three times; then every GPU test once more (crash reporter in).
export OUT=${OUT:-/tmp/o}; R=/tmp/r-fh; rm -rf $R; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb3 /tmp/gold && tar -C /tmp/gb3 -xzf .gpu/payload.tgz && tar -C /tmp/gold -xzf .gpu/old-cli.tgz
B=/tmp/gb3/bin/gemmbridge; OLD=/tmp/gold/gemmbridge; DB=tactics/h200.json
F="--suite default --dtypes fp8_e4m3 --scalings tensorwise,rowwise,block"
fpeer() { timeout 90 python3 bench/peer.py $F --out $R/fpeer$1.jsonl > $R/fpeer$1.txt 2>&1; }
fours() { timeout 90 $B bench $F --db $DB --out $R/fours$1.jsonl > $R/fours$1.txt 2>&1; }
fold() { timeout 90 $OLD bench $F --db $DB --out $R/fold$1.jsonl > $R/fold$1.txt 2>&1; }
fpeer 1; fours 1; fold 1; fours 2; fpeer 2; fpeer 3; fours 3; fold 2; fours 4; fpeer 4; fpeer 5; fours 5; fold 3
j() { echo $(ls $R/$1*.jsonl | tr '\n' ',' | sed 's/,$//'); }
$B compare --ours $(j fours) --peer $(j fpeer) --bound 0.98 > $R/compare-fp8.txt 2>&1
$B compare --ours $R/fours1.jsonl,$R/fours3.jsonl,$R/fours5.jsonl --peer $(j fold) --bound 0.98 > $R/compare-fp8-new-vs-old.txt 2>&1
grep -E "◂" $R/compare-fp8.txt; tail -5 $R/compare-fp8.txt; tail -5 $R/compare-fp8-new-vs-old.txt
export GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared3 GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train3
timeout 90 python3 .gpu/torch_oracle.py /tmp/oracle_shared3 > $R/oracle.txt 2>&1
timeout 90 python3 bench/train_oracle.py /tmp/oracle_train3 >> $R/oracle.txt 2>&1
timeout 200 bash .gpu/run > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
grep -E "FAILED|crash reporter|tests rc" $R/tests.txt | sort | uniq -c
cp $R/*.txt $R/*.jsonl $OUT/
