//! How a checked grouped product's GEMMs are enqueued: one after another on the caller's
//! stream, or spread over the device's lanes ([`Lanes`]) by the schedule
//! [`crate::grouped::streams`] makes and checks as data — forked from the caller's stream,
//! each lane's groups in order, joined back. Every group goes through the dense routing
//! ([`dispatch::enqueue`]: library, fallbacks, padded copies) under one hold of the lock.

use cudarc::driver::sys::CUstream;

use crate::cuda::blas::BlasGemm;
use crate::cuda::call::GemmCall;
use crate::cuda::device::{capture, is_capturing, Cached, Locked, ReplayKey};
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
    /// Multiply-adds, as the pool weighs groups: a backward weight's empty group (k = 0) still
    /// writes its zeros, so it counts as k = 1.
    fn work(&self) -> u64 {
        self.p.m() as u64 * self.p.n() as u64 * self.p.k().max(1) as u64
    }

    fn call(&self, stream: CUstream) -> GemmCall<'_> {
        GemmCall {
            problem: &self.p,
            cm: column_major_call(&self.p),
            alpha: 1.0,
            beta: 0.0,
            abc: self.abc,
            c_in: None,
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

/// Enqueues `groups` as one cuBLAS grouped batched call on `caller` (not capturable).
///
/// # Safety
/// As [`in_order`].
pub(crate) unsafe fn batched(st: &mut Locked<Libraries>, groups: &[GroupGemm], caller: CUstream) -> Result<()> {
    let gemms: Vec<BlasGemm> = groups.iter().map(|g| BlasGemm::of(&g.call(caller))).collect();
    let Locked { dev, libs } = st;
    // SAFETY: the caller's contract.
    unsafe { libs.blas.gemm_grouped(dev, &gemms, caller) }
}

/// Enqueues `groups` over at most `lanes` of the device's lanes, as [`pooled_launches`] does.
///
/// # Safety
/// As [`in_order`].
pub(crate) unsafe fn pooled(
    st: &mut Locked<Libraries>,
    groups: &[GroupGemm],
    lanes: usize,
    caller: CUstream,
) -> Result<()> {
    let work: Vec<u64> = groups.iter().map(GroupGemm::work).collect();
    let describe = || format!("{} grouped GEMMs", groups.len());
    // SAFETY: the caller's contract; each launch is one checked group on a live stream.
    unsafe {
        pooled_launches(st, &work, lanes, caller, &describe, |st, e, s| {
            dispatch::enqueue(st, &groups[e].call(s)).map(|_| ())
        })
    }
}

/// Runs `launch(state, e, stream)` for every group `e` of nonzero `work[e]` over at most
/// `lanes` of the device's lanes (created, with their workspaces, on first use — never while
/// `caller` is capturing), the larger groups first, each to the lane with the least work so
/// far; `caller` waits for all of them. After a failed launch the remaining groups are skipped
/// but every lane is still joined back, so that `caller`'s order (and a capture of it) stays
/// whole; the first error is returned. `describe` names the call in errors.
///
/// # Safety
/// `caller` is a live stream of the bound context; each `launch` enqueues only work that is
/// valid on the stream it is given (a lane with its workspace, or `caller`).
pub(crate) unsafe fn pooled_launches(
    st: &mut Locked<Libraries>,
    work: &[u64],
    lanes: usize,
    caller: CUstream,
    describe: &dyn Fn() -> String,
    mut launch: impl FnMut(&mut Locked<Libraries>, usize, CUstream) -> Result<()>,
) -> Result<()> {
    let assigned = assign(work, lanes);
    // taken out of the state while the groups are enqueued through them, put back below
    let pool = st.dev.take_lanes(assigned.len(), caller, describe)?;
    // the lanes' work after the last replayed graph that holds lane work (its nodes ran on
    // another stream with these lanes' workspaces); a fork inside a capture runs nothing now
    if !is_capturing(caller).unwrap_or(true) {
        // SAFETY: `caller` by the contract.
        if let Err(e) = unsafe { pool.wait_last_graph(caller) } {
            st.dev.put_lanes(pool);
            return Err(e);
        }
    }
    let mut first_error = None;
    let mut forked = vec![false; assigned.len()];
    for (lane, step) in schedule(&assigned) {
        let stream = if lane == 0 { caller } else { pool.stream(lane - 1) };
        // SAFETY: `caller` by the contract; lanes are the device's own streams.
        let done = match step {
            Step::Record(0) => unsafe { pool.record_fork(caller) },
            Step::Wait(0) => pool.wait_fork(lane - 1),
            Step::Record(_) => pool.record_join(lane - 1),
            Step::Wait(n) => unsafe { pool.wait_join(caller, n - 1) },
            Step::Launch(_) if first_error.is_some() => Ok(()),
            Step::Launch(e) => launch(st, e, stream),
        };
        match done {
            Ok(()) if step == Step::Wait(0) => forked[lane - 1] = true,
            Ok(()) => {}
            Err(e) if matches!(step, Step::Launch(_)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                // an event that cannot be recorded or waited for: the order is lost, say so;
                // but every lane that took the fork is joined back (best effort), so that a
                // capture of `caller` is not left with a lane outside it
                for (i, _) in forked.iter().enumerate().filter(|(_, &f)| f) {
                    // SAFETY: as above.
                    let _ = pool.record_join(i).and_then(|()| unsafe { pool.wait_join(caller, i) });
                }
                st.dev.put_lanes(pool);
                return Err(first_error.unwrap_or(e));
            }
        }
    }
    st.dev.put_lanes(pool);
    first_error.map_or(Ok(()), Err)
}

/// Enqueues `groups` pooled (over at most `lanes` lanes) or in order, as [`pooled`] and
/// [`in_order`] do, replayed as one graph when repeated ([`replayed_with`]; `key` must encode
/// everything the groups' launches depend on: their problems, addresses, the way and the
/// lanes).
///
/// # Safety
/// As [`in_order`].
pub(crate) unsafe fn replayed(
    st: &mut Locked<Libraries>,
    groups: &[GroupGemm],
    key: Vec<u64>,
    lanes: Option<usize>,
    caller: CUstream,
) -> Result<()> {
    let describe = || format!("{} grouped GEMMs", groups.len());
    // SAFETY (every launch): the caller's contract.
    let direct = |st: &mut Locked<Libraries>, s: CUstream| match lanes {
        Some(n) => unsafe { pooled(st, groups, n, s) },
        None => unsafe { in_order(st, groups, s) },
    };
    // SAFETY: the caller's contract; `key` encodes what `direct` enqueues.
    unsafe { replayed_with(st, key, groups.len(), &describe, caller, direct) }
}

/// Runs `direct` (a grouped call's launches, enqueued on the stream it is given and on lanes
/// forked from it) on `caller`, but a call repeated with the same `key` — which must encode
/// everything those launches depend on — on the same stream is captured once into a CUDA
/// graph (with the lanes' work: the fork and join are captured as dependencies) and from then
/// on launched as that one graph, when graph replay is on ([`crate::cuda::GraphReplay`]:
/// `after_calls`, `capacity`; its `max_macs` is for single calls and not applied here) and
/// there is more than one launch (`launches`). One graph launch replaces one library launch
/// per group on the host. Never into a stream being captured; a failed capture runs the call
/// directly.
///
/// # Safety
/// `caller` is a live stream of the bound context; `direct` enqueues only work valid on the
/// stream it is given and on lanes forked from it, the same work for the same `key`.
pub(crate) unsafe fn replayed_with(
    st: &mut Locked<Libraries>,
    key: Vec<u64>,
    launches: usize,
    describe: &dyn Fn() -> String,
    caller: CUstream,
    mut direct: impl FnMut(&mut Locked<Libraries>, CUstream) -> Result<()>,
) -> Result<()> {
    if !st.libs.lt.as_ref().is_some_and(|lt| lt.composite.options.enabled && launches > 1) {
        return direct(st, caller);
    }
    let key = ReplayKey::new(key, [0; 6], (1.0, 0.0), 0, caller);
    let Locked { dev, libs } = &mut *st;
    let lt = libs.lt.as_mut().expect("checked above");
    let has_graph = lt.composite.graphs.contains_key(&key);
    // a graph is not launched into a stream being captured (nor is the call counted then)
    let mut graph_unused = has_graph && is_capturing(caller).unwrap_or(true);
    if has_graph && !graph_unused {
        // SAFETY: `caller` is live (the contract) and not capturing; the key holds it and
        // everything the launches depend on. A fence error after the launch is returned: the
        // work is enqueued, so it must not run again directly.
        unsafe {
            dev.graph_fence_before(caller)?;
            match lt.composite.launch_cached(&key, caller, describe) {
                Cached::Launched => return dev.graph_fence_after(caller),
                Cached::NotLaunched { graph_unused: unused } => graph_unused = unused,
            }
        }
    }
    if !lt.composite.due(&key, graph_unused, caller) {
        return direct(st, caller);
    }
    let Some(cap) = st.dev.capture_stream().map(|c| c.raw()) else { return direct(st, caller) };
    // the capture stream's own workspace (in-order launches run there), made outside the
    // capture, which refuses to allocate one
    if st.dev.workspaces.get(cap, describe).is_err() {
        return direct(st, caller);
    }
    // SAFETY: `cap` is the device's private capture stream, used only under its lock; the
    // launches enqueue on it and on the lanes forked from it.
    let graph = unsafe { capture(cap, |s| direct(st, s)) };
    // SAFETY (fences, launch): the graph's launches are this call's, on the caller's stream
    // (not being captured: `due` said so).
    let launched =
        graph.and_then(|g| unsafe { st.dev.graph_fence_before(caller).and_then(|()| g.launch(caller)) }.map(|()| g));
    match launched {
        Ok(g) => {
            st.libs.lt.as_mut().expect("checked above").composite.graphs.insert(key, g);
            // SAFETY: as above, after the launch.
            unsafe { st.dev.graph_fence_after(caller) }
        }
        Err(e) => {
            tracing::debug!(problem = %describe(), error = %e, "grouped graph capture failed; this call runs directly");
            st.libs.lt.as_mut().expect("checked above").composite.failed(&key);
            direct(st, caller)
        }
    }
}
