//! The graph API's building block: an owned backend descriptor (`cudnnBackendCreateDescriptor`,
//! destroyed on drop), its typed attribute setters and getters, and its finalization.

use std::ffi::c_void;
use std::ptr::null_mut;

use cudarc::cudnn::sys as raw;
use raw::cudnnBackendAttributeName_t as A;
use raw::cudnnBackendAttributeType_t as T;
use raw::cudnnBackendDescriptorType_t as D;

use super::sys::check;
use crate::error::Result;

/// An owned backend descriptor, destroyed on drop.
pub(crate) struct Desc(pub(super) raw::cudnnBackendDescriptor_t);

// SAFETY: a host-side cuDNN object, used under the device's Mutex only.
unsafe impl Send for Desc {}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created in new, destroyed once here.
        let _ = unsafe { raw::cudnnBackendDestroyDescriptor(self.0) };
    }
}

impl Desc {
    pub(super) fn new(ty: D) -> Result<Desc> {
        let mut d = null_mut();
        // SAFETY: a valid out-pointer.
        check(unsafe { raw::cudnnBackendCreateDescriptor(ty, &mut d) }, "cudnnBackendCreateDescriptor", || {
            format!("{ty:?}")
        })?;
        Ok(Desc(d))
    }

    /// Sets `attr` to `vals`, of cuDNN attribute type `ty`.
    ///
    /// # Safety
    /// `V` is the C type cuDNN reads for `ty` (`int64_t` for INT64, a pointer for VOID_PTR and
    /// BACKEND_DESCRIPTOR, `float` for FLOAT, the enum for enum types, `bool` for BOOLEAN).
    pub(super) unsafe fn set<V>(self, attr: A, ty: T, vals: &[V]) -> Result<Desc> {
        // SAFETY: a live descriptor; `vals.len()` elements of the type cuDNN expects (contract).
        let st = unsafe {
            raw::cudnnBackendSetAttribute(self.0, attr, ty, vals.len() as i64, vals.as_ptr() as *const c_void)
        };
        check(st, "cudnnBackendSetAttribute", || format!("{attr:?}"))?;
        Ok(self)
    }

    pub(super) fn i64s(self, attr: A, vals: &[i64]) -> Result<Desc> {
        // SAFETY: INT64 attributes read int64_t.
        unsafe { self.set(attr, T::CUDNN_TYPE_INT64, vals) }
    }

    pub(super) fn descs(self, attr: A, ds: &[&Desc]) -> Result<Desc> {
        let raws: Vec<raw::cudnnBackendDescriptor_t> = ds.iter().map(|d| d.0).collect();
        // SAFETY: BACKEND_DESCRIPTOR attributes read descriptor handles; every one is live.
        unsafe { self.set(attr, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raws) }
    }

    pub(super) fn handle(self, attr: A, h: raw::cudnnHandle_t) -> Result<Desc> {
        // SAFETY: HANDLE attributes read a cudnnHandle_t; the caller's handle is live.
        unsafe { self.set(attr, T::CUDNN_TYPE_HANDLE, &[h]) }
    }

    pub(super) fn finalize(self, what: impl FnOnce() -> String) -> Result<Desc> {
        // SAFETY: a live descriptor with its required attributes set.
        check(unsafe { raw::cudnnBackendFinalize(self.0) }, "cudnnBackendFinalize", what)?;
        Ok(self)
    }

    /// Reads up to `out.len()` elements of `attr`; the count cuDNN has.
    ///
    /// # Safety
    /// As [`Desc::set`], for the type cuDNN writes.
    pub(super) unsafe fn get<V>(&self, attr: A, ty: T, out: &mut [V]) -> Result<usize> {
        let mut n = 0i64;
        // SAFETY: a live, finalized descriptor; room for `out.len()` elements.
        let st = unsafe {
            raw::cudnnBackendGetAttribute(self.0, attr, ty, out.len() as i64, &mut n, out.as_mut_ptr() as *mut c_void)
        };
        check(st, "cudnnBackendGetAttribute", || format!("{attr:?}"))?;
        Ok(n.max(0) as usize)
    }

    pub(super) fn get_i64(&self, attr: A) -> Result<i64> {
        let mut v = [0i64];
        // SAFETY: INT64 attributes write int64_t.
        unsafe { self.get(attr, T::CUDNN_TYPE_INT64, &mut v) }?;
        Ok(v[0])
    }
}
