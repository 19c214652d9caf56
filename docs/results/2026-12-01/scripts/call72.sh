# which memory CUDA's stream memory operations accept here (bench/probes/stream_memops.py)
python3 bench/probes/stream_memops.py 2>&1 | tee $OUT/memops.txt
