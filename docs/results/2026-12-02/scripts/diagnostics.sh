#!/usr/bin/env bash
# Diagnostics: (1) a resident one-thread spin kernel beside a cuBLASLt GEMM, with and without
# one SM left to it (SM_COUNT_TARGET) — the device ordering's cost; (2) FP8 quantisation
# kernels timed one by one, 8192² and 16384², and the FP8 GPU tests (bit-exactness of the
# rewritten kernels); (3) cuBLASLt API traces of PyTorch's and our calls on the rows where we
# trail (bf16 matmul 3537x12288x2048, FP8 row-wise 4096³).
set -x
export OUT=${OUT:-/tmp/o}; R=/tmp/r; mkdir -p $R
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/gb && tar -C /tmp/gb -xzf .gpu/payload.tgz && B=/tmp/gb/bin/gemmbridge
nvidia-smi --query-gpu=name,driver_version,temperature.gpu,clocks.sm,power.draw --format=csv > $R/smi.txt 2>&1
mark() { echo "$1 at $SECONDS s" >> $R/smi.txt; nvidia-smi --query-gpu=temperature.gpu,clocks.sm,power.draw --format=csv,noheader >> $R/smi.txt 2>&1; }
nvcc -O2 -arch=sm_90 -o /tmp/spin bench/probes/spin_residency.cu -lcublasLt -lcuda > $R/spin.txt 2>&1 && timeout 120 /tmp/spin >> $R/spin.txt 2>&1; echo "rc $?" >> $R/spin.txt; mark spin
cat $R/spin.txt
T=$(ls /tmp/gb/tests/fp8_gpu-* | head -1)
timeout 150 $T --include-ignored > $R/tests-fp8.txt 2>&1; echo "rc $?" >> $R/tests-fp8.txt; mark tests
tail -5 $R/tests-fp8.txt
timeout 100 $B fp8 quantize --rows 8192 --cols 8192 --reps 20 > $R/quantize-8k.txt 2>&1; echo "rc $?" >> $R/quantize-8k.txt; mark q8
timeout 100 $B fp8 quantize --rows 16384 --cols 16384 --reps 10 > $R/quantize-16k.txt 2>&1; echo "rc $?" >> $R/quantize-16k.txt; mark q16
cat $R/quantize-16k.txt
CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE=$R/lt-torch.log CUBLAS_LOGINFO_DBG=1 CUBLAS_LOGDEST_DBG=$R/blas-torch.log timeout 60 python3 bench/probes/torch_lt_trace.py > $R/torch-trace.txt 2>&1; mark trace-torch
CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE=$R/lt-ours-dense.log timeout 60 $B bench --suite llm --dtypes bf16,f16 --ops matmul,linear --reps 1 --db tactics/h200.json > $R/ours-dense.txt 2>&1; mark trace-ours
CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE=$R/lt-ours-fp8.log timeout 60 $B bench --suite square --dtypes fp8_e4m3 --scalings rowwise,tensorwise --reps 1 --db tactics/h200.json > $R/ours-fp8.txt 2>&1; mark trace-ours-fp8
ls -la $R; du -sh $R
tar czf $OUT/run1.tgz -C /tmp r
