//! The GPU time of each GEMM a training step enqueues: CUDA events recorded on the `Gpu`'s
//! stream just before and just after each one, through the layers' GEMM observer
//! (`Mlp::set_gemm_observer`), read back after the steps.

use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, DeviceRepr, ValidAsZeroBits};
use gemmbridge::cuda::train::{GemmMark, GemmRole, Mlp};
use gemmbridge::cuda::Gpu;
use gemmbridge::Element;

/// (layer, role, the event before, the event after) per GEMM, in order.
type Marks = Vec<(usize, GemmRole, CudaEvent, Option<CudaEvent>)>;

/// The events of one `Mlp`'s GEMMs, recorded from [`GemmEvents::observe`] on.
pub struct GemmEvents(Arc<Mutex<Marks>>);

impl GemmEvents {
    /// Sets `mlp`'s GEMM observer to record an event on `gpu`'s stream on each side of every
    /// GEMM.
    pub fn observe<T: Element + DeviceRepr + ValidAsZeroBits>(gpu: &Gpu, mlp: &mut Mlp<T>) -> GemmEvents {
        let marks: Arc<Mutex<Marks>> = Arc::default();
        let (s, m) = (gpu.stream().clone(), marks.clone());
        mlp.set_gemm_observer(Some(Box::new(move |layer, role, mark| {
            let e = s
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| gemmbridge::Error::Driver { operation: "cuEventRecord", status: format!("{:?}", e.0) })?;
            let mut v = m.lock().unwrap_or_else(|p| p.into_inner());
            match mark {
                GemmMark::Before => v.push((layer, role, e, None)),
                GemmMark::After => {
                    if let Some(last) = v.last_mut() {
                        last.3 = Some(e);
                    }
                }
            }
            Ok(())
        })));
        GemmEvents(marks)
    }

    /// Each GEMM recorded since the last call, in order: its layer, its role and its GPU time
    /// in ms (waits for them).
    pub fn take(&self) -> anyhow::Result<Vec<(usize, GemmRole, f64)>> {
        let marks = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
        marks
            .into_iter()
            .map(|(layer, role, start, end)| {
                let end = end.ok_or_else(|| anyhow::anyhow!("layer {layer} {role:?}: no event after the GEMM"))?;
                end.synchronize()?;
                Ok((layer, role, f64::from(start.elapsed_ms(&end)?)))
            })
            .collect()
    }
}
