//! [`GpuOptions`]: every setting of the engine in one value — given when a [`Gpu`] is made
//! ([`Gpu::with_options`]), read back with [`Gpu::options`], changed on a live engine with
//! [`Gpu::update_options`], which says what each change reaches ([`Applied`]).

use super::engine::Gpu;
use crate::cuda::device::{GraphReplay, Held};
use crate::cuda::route::Libraries;
use crate::cuda::status;
use crate::error::Result;

pub(super) mod value;

pub use value::GpuOptions;

/// How far a changed setting reaches on a live engine ([`Gpu::update_options`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reach {
    /// Every call from the next on; nothing cached is dropped (plans made under another value
    /// are kept, for a change back: the SM count target, the convolution API and fusion are
    /// part of their plans' keys).
    NextCall,
    /// What is made from now on — plans of problems first planned from now (the convolution
    /// search and workspace limit, the attention search), workspaces of streams that get their
    /// first call from now (the workspace size); what was made keeps what it was made with.
    /// The plan cache's capacity: the next plan made drops the least recently used plans
    /// until the cache is within it.
    NewlyMade,
    /// The cached replay graphs — of single calls and of whole grouped GEMMs — were dropped,
    /// this many; later calls are captured again under the new settings (graph replay).
    GraphsDropped(usize),
}

/// One setting [`Gpu::update_options`] changed: its field's name and how far the change
/// reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    /// The [`GpuOptions`] field, e.g. `"sm_count_target"`.
    pub setting: &'static str,
    /// What the change reaches and what it dropped.
    pub reach: Reach,
}

/// What [`Gpu::update_options`] changed, in [`GpuOptions`]' field order; empty when nothing
/// changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Every setting that changed.
    pub changes: Vec<Change>,
}

impl Applied {
    /// How far the change of `setting` reaches; `None` where it did not change.
    pub fn reach(&self, setting: &str) -> Option<Reach> {
        self.changes.iter().find(|c| c.setting == setting).map(|c| c.reach)
    }
}

impl Gpu {
    /// Opens device `ordinal` (its primary context) with a new non-blocking stream, with
    /// `options` ([`GpuOptions`]).
    ///
    /// # Errors
    /// In this order: [`Error::OutOfRange`](crate::Error::OutOfRange) for an option [`GpuOptions::validate`] refuses
    /// (checked first, without a device); then as [`Gpu::new`] ([`Error::LibraryNotFound`](crate::Error::LibraryNotFound),
    /// [`Error::NoDevice`](crate::Error::NoDevice), [`Error::Driver`](crate::Error::Driver), [`Error::Cublas`](crate::Error::Cublas)); then [`Error::OutOfRange`](crate::Error::OutOfRange)
    /// for an SM count target above the device's SMs.
    pub fn with_options(ordinal: usize, options: GpuOptions) -> Result<Gpu> {
        Gpu::open(ordinal, options)
    }

    /// The settings in use ([`GpuOptions`]; the workspace size as it is, not `None`).
    pub fn options(&self) -> GpuOptions {
        self.read_options(&self.lock())
    }

    /// The settings in use, under the lock `st`.
    fn read_options(&self, st: &Held<'_, Libraries>) -> GpuOptions {
        let libs = &st.libs;
        GpuOptions {
            backend: libs.backend,
            workspace_bytes: Some(st.dev.workspaces.bytes),
            padding: libs.padding,
            graph_replay: libs.lt.as_ref().map_or_else(GraphReplay::default, |lt| lt.replay.options),
            sm_count_target: Some(libs.sm_count_target).filter(|&n| n > 0),
            check_raw_addresses: self.device().checks_raw_addresses(),
            conv_search: libs.conv_search,
            conv_api: libs.conv_api,
            conv_fusion: libs.conv_fuse,
            conv_workspace_limit: libs.conv_ws_limit,
            attention_search: libs.attn_search,
            grouped_backend: libs.grouped.backend,
            grouped_streams: libs.grouped.streams,
            plan_cache_capacity: libs.lt.as_ref().map_or(crate::cuda::lt::PLAN_CAPACITY, |lt| lt.plans.capacity()),
            norm_fusion: libs.norm_fuse,
        }
    }

    /// Changes settings of this live engine: `change` edits a copy of [`Gpu::options`]; the
    /// result is checked as at creation, then every setting it changed is applied (settings
    /// another thread changed meanwhile and `change` left alone keep that thread's value).
    /// Returns what changed and how far each change reaches ([`Applied`], [`Reach`]):
    ///
    /// - the backend, the padding, the raw-address check, the forced grouped backend and the
    ///   pool's streams: from the next call ([`Reach::NextCall`]); a larger pool's streams are
    ///   made when a call first needs them, a smaller one keeps the streams it has;
    /// - the SM count target: the cuBLAS handle's target is set now, and dense GEMMs from the
    ///   next call are planned for it; plans of other targets are kept ([`Reach::NextCall`]);
    /// - the convolution API and fusion, and RMSNorm's fusion: from the next call, plans of the
    ///   other value kept ([`Reach::NextCall`]);
    /// - the convolution search, the convolution workspace limit, the attention search:
    ///   problems planned from now on; plans already made are kept ([`Reach::NewlyMade`]);
    /// - the workspace size: streams that get their first call from now on; workspaces made are
    ///   kept ([`Reach::NewlyMade`]);
    /// - the plan cache's capacity: the next cuBLASLt plan made drops least recently used
    ///   plans until each cache is within it ([`Reach::NewlyMade`]); without cuBLASLt the
    ///   setting is neither kept nor reported;
    /// - graph replay: every cached replay graph (of single calls and of whole grouped GEMMs)
    ///   is dropped, its count returned ([`Reach::GraphsDropped`]); later calls are captured
    ///   again under the new settings. Without cuBLASLt nothing is replayed: the setting is
    ///   neither kept nor reported.
    ///
    /// A setting left as it is changes and drops nothing. `change` runs without the engine's
    /// lock held.
    ///
    /// # Errors
    /// Nothing is changed on an error: [`Error::OutOfRange`](crate::Error::OutOfRange) for an option out of range
    /// ([`GpuOptions::validate`] first, then the SM count target against the device's SMs);
    /// [`Error::Driver`](crate::Error::Driver) from the device query or binding the context; [`Error::Cublas`](crate::Error::Cublas) from
    /// setting cuBLAS's SM count target.
    pub fn update_options(&self, change: impl FnOnce(&mut GpuOptions)) -> Result<Applied> {
        let old = self.options();
        let mut new = old.clone();
        change(&mut new);
        new.validate()?;
        new.validate_for(self.sm_count()?)?;
        self.apply(&old, &new)
    }

    /// The device's SM count.
    fn sm_count(&self) -> Result<u32> {
        let attr = cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
        Ok(self.context().attribute(attr).map_err(status::driver("cuDeviceGetAttribute"))? as u32)
    }

    /// The workspace size cuBLASLt's documentation recommends for this device: 32 MiB on
    /// Hopper and later, 4 MiB before.
    pub(super) fn recommended_workspace(&self) -> Result<usize> {
        let attr = cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR;
        let major = self.context().attribute(attr).map_err(status::driver("cuDeviceGetAttribute"))?;
        Ok(if major >= 9 { 32 << 20 } else { 4 << 20 })
    }

    /// Applies every setting `new` changes against `old` (both checked) to the settings in use
    /// (those `new` leaves as in `old` keep their current value), the fallible steps (binding
    /// the context, cuBLAS's SM count target) first.
    pub(super) fn apply(&self, old: &GpuOptions, new: &GpuOptions) -> Result<Applied> {
        let mut new = new.clone();
        if new.workspace_bytes.is_none() {
            new.workspace_bytes = Some(self.recommended_workspace()?);
        }
        let mut st = self.lock();
        let cur = self.read_options(&st);
        if st.libs.lt.is_none() {
            new.graph_replay = cur.graph_replay; // nothing is replayed: not kept
            new.plan_cache_capacity = cur.plan_cache_capacity; // no plan cache: not kept
        }
        let (mut to, mut changes) = (cur.clone(), Vec::new());
        macro_rules! changed {
            ($($field:ident: $reach:expr),* $(,)?) => {$(
                if new.$field != old.$field && new.$field != cur.$field {
                    to.$field = new.$field.clone();
                    changes.push(Change { setting: stringify!($field), reach: $reach });
                }
            )*};
        }
        changed!(backend: Reach::NextCall, workspace_bytes: Reach::NewlyMade, padding: Reach::NextCall,
            graph_replay: Reach::GraphsDropped(0), sm_count_target: Reach::NextCall,
            check_raw_addresses: Reach::NextCall, conv_search: Reach::NewlyMade, conv_api: Reach::NextCall,
            conv_fusion: Reach::NextCall, conv_workspace_limit: Reach::NewlyMade, attention_search: Reach::NewlyMade,
            grouped_backend: Reach::NextCall, grouped_streams: Reach::NextCall,
            plan_cache_capacity: Reach::NewlyMade, norm_fusion: Reach::NextCall);
        if to.sm_count_target != cur.sm_count_target || to.graph_replay != cur.graph_replay {
            self.device().bind()?; // cuBLAS's handle; replay graphs are destroyed
        }
        if to.sm_count_target != cur.sm_count_target {
            let n = to.sm_count_target.unwrap_or(0);
            st.libs.blas.set_sm_count_target(n as i32)?;
            st.libs.sm_count_target = n;
            if let Some(lt) = st.libs.lt.as_mut() {
                lt.sm_count = n;
            }
        }
        if let Some(c) = changes.iter_mut().find(|c| c.setting == "graph_replay") {
            c.reach = Reach::GraphsDropped(replace_replay(&mut st.libs, to.graph_replay));
        }
        st.dev.workspaces.bytes = to.workspace_bytes.expect("resolved above");
        set_libraries(&mut st.libs, &to);
        self.device().set_check_raw_addresses(to.check_raw_addresses);
        Ok(Applied { changes })
    }
}

/// Drops the replay graphs (of single calls and of whole grouped GEMMs; the context is bound)
/// and keeps `options` for later ones; the number dropped. Without cuBLASLt: nothing.
fn replace_replay(libs: &mut Libraries, options: GraphReplay) -> usize {
    let Some(lt) = libs.lt.as_mut() else { return 0 };
    let dropped = lt.replay.graphs.len() + lt.composite.graphs.len();
    lt.replay.clear();
    lt.replay.options = options;
    lt.composite.clear();
    lt.composite.options = options;
    dropped
}

/// The settings the routing floor and the cuDNN room keep (the SM count target, the replay
/// settings, the workspace size and the raw-address check are set apart).
fn set_libraries(libs: &mut Libraries, o: &GpuOptions) {
    libs.backend = o.backend;
    libs.padding = o.padding;
    libs.conv_search = o.conv_search;
    libs.conv_api = o.conv_api;
    libs.conv_fuse = o.conv_fusion;
    libs.norm_fuse = o.norm_fusion;
    libs.conv_ws_limit = o.conv_workspace_limit;
    libs.attn_search = o.attention_search;
    libs.grouped.backend = o.grouped_backend;
    libs.grouped.streams = o.grouped_streams;
    if let Some(lt) = libs.lt.as_mut() {
        lt.plans.set_capacity(o.plan_cache_capacity);
        lt.fp8_plans.set_capacity(o.plan_cache_capacity);
    }
    if let Some(d) = libs.dnn.as_mut() {
        d.search = o.conv_search;
        d.api = o.conv_api;
        d.fuse = o.conv_fusion;
        d.ws_limit = o.conv_workspace_limit;
        d.attn_search = o.attention_search;
    }
}

#[cfg(test)]
mod tests;
