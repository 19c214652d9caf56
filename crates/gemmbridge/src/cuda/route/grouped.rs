//! How a checked grouped product's GEMMs are enqueued: one after another on the caller's
//! stream, or spread over the device's lanes ([`Lanes`]) by the schedule
//! [`crate::grouped::streams`] makes and checks as data — forked from the caller's stream,
//! each lane's groups in order, joined back. Every group goes through the dense routing
//! ([`dispatch::enqueue`]: library, fallbacks, padded copies) under one hold of the lock.

use cudarc::driver::sys::CUstream;

use crate::cuda::call::GemmCall;
use crate::cuda::device::Locked;
use crate::cuda::route::{dispatch, Libraries};
use crate::error::Result;
use crate::grouped::streams::{assign, schedule, Step};
use crate::mapping::column_major_call;
use crate::problem::GemmProblem;

/// One group's checked GEMM by address: A, B, C and the bias.
pub(crate) struct GroupGemm {
    pub p: GemmProblem,
    pub abc: (u64, u64, u64),
    pub bias: Option<u64>,
}

impl GroupGemm {
    fn call(&self, stream: CUstream) -> GemmCall<'_> {
        GemmCall {
            problem: &self.p,
            cm: column_major_call(&self.p),
            alpha: 1.0,
            beta: 0.0,
            abc: self.abc,
            bias: self.bias,
            aux: None,
            stream,
        }
    }
}

/// Enqueues `groups` on `caller`, one after another.
///
/// # Safety
/// Every group passed the dense entry's checks on live buffers that stay valid until it has
/// run; `caller` is a live stream of the bound context.
pub(crate) unsafe fn in_order(st: &mut Locked<Libraries>, groups: &[GroupGemm], caller: CUstream) -> Result<()> {
    for g in groups {
        // SAFETY: the caller's contract.
        unsafe { dispatch::enqueue(st, &g.call(caller)) }?;
    }
    Ok(())
}

/// Enqueues `groups` over at most `lanes` of the device's lanes (created, with their
/// workspaces, on first use — never while `caller` is capturing), the larger groups first,
/// each to the lane with the least work so far; `caller` waits for all of them. After a failed
/// launch the remaining groups are skipped but every lane is still joined back, so that
/// `caller`'s order (and a capture of it) stays whole; the first error is returned.
///
/// # Safety
/// As [`in_order`].
pub(crate) unsafe fn pooled(
    st: &mut Locked<Libraries>,
    groups: &[GroupGemm],
    lanes: usize,
    caller: CUstream,
) -> Result<()> {
    let work: Vec<u64> = groups.iter().map(|g| g.p.m() as u64 * g.p.n() as u64 * g.p.k() as u64).collect();
    let assigned = assign(&work, lanes);
    // taken out of the state while the groups are enqueued through them, put back below
    let pool = st.dev.take_lanes(assigned.len(), caller, &|| format!("{} grouped GEMMs", groups.len()))?;
    let mut first_error = None;
    for (lane, step) in schedule(&assigned) {
        let stream = if lane == 0 { caller } else { pool.stream(lane - 1) };
        // SAFETY: `caller` by the contract; lanes are the device's own streams.
        let done = match step {
            Step::Record(0) => unsafe { pool.record_fork(caller) },
            Step::Wait(0) => pool.wait_fork(lane - 1),
            Step::Record(_) => pool.record_join(lane - 1),
            Step::Wait(n) => unsafe { pool.wait_join(caller, n - 1) },
            Step::Launch(_) if first_error.is_some() => Ok(()),
            // SAFETY: the caller's contract; the lane's workspace exists (`lanes`).
            Step::Launch(e) => unsafe { dispatch::enqueue(st, &groups[e].call(stream)) }.map(|_| ()),
        };
        if let Err(e) = done {
            if matches!(step, Step::Launch(_)) {
                first_error.get_or_insert(e);
            } else {
                // an event that cannot be recorded or waited for: the order is lost, say so
                st.dev.put_lanes(pool);
                return Err(first_error.unwrap_or(e));
            }
        }
    }
    st.dev.put_lanes(pool);
    first_error.map_or(Ok(()), Err)
}
