//! `gemmbridge info`.

use gemmbridge::cuda::{cuda_version_string, Gpu};

pub fn run() -> anyhow::Result<i32> {
    match Gpu::new(0) {
        Ok(gpu) => {
            let i = gpu.info()?;
            println!("device        {} (ordinal {})", i.name, i.ordinal);
            println!("compute cap.  {}.{}", i.compute_capability.0, i.compute_capability.1);
            println!("SMs           {}", i.sm_count);
            println!("memory        {:.1} GiB", i.total_memory_bytes as f64 / (1u64 << 30) as f64);
            println!("driver        supports CUDA {}", cuda_version_string(i.driver_cuda_version));
            match i.runtime_version {
                Some(v) => println!("CUDA runtime  {}", cuda_version_string(v)),
                None => println!("CUDA runtime  libcudart not loadable (not needed by gemmbridge)"),
            }
            let (a, b, c) = i.cublas_version;
            println!("cuBLAS        {a}.{b}.{c}");
            match i.cublaslt_version {
                Some(v) => {
                    let grouped = if i.cublaslt_grouped_matmul { "offered" } else { "not offered (13.2 and later)" };
                    println!("cuBLASLt      {}.{}.{} (grouped matmul {grouped})", v / 10000, (v / 100) % 100, v % 100)
                }
                None => println!("cuBLASLt      not loadable"),
            }
            println!("backend       cuBLAS (cublasGemmEx / cublasGemmStridedBatchedEx)");
        }
        Err(e) => {
            println!("no CUDA GPU available: {}", crate::gpu::why_not(&e));
            println!("backend       CPU (matrixmultiply crate, f32 accumulation)");
        }
    }
    Ok(0)
}
