//! What the driver knows of a raw address: whether the bytes a call will touch lie inside one
//! allocation the device can access (`cuPointerGetAttributes`), so that a host pointer given
//! as a device address is a named error instead of a fault that poisons the context.

use cudarc::driver::sys::{self as drv, CUmemorytype, CUpointer_attribute as Attr};

use crate::error::{Error, Result, Which};

/// The driver's view of one address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Seen {
    /// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`: 0 when the driver knows no allocation there.
    memory_type: u32,
    /// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
    ordinal: i32,
    /// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR` / `_RANGE_SIZE`: the allocation holding it.
    start: u64,
    size: usize,
    /// `CU_POINTER_ATTRIBUTE_IS_MANAGED`.
    managed: u32,
}

/// The attributes read, in the order of [`Seen`]'s fields.
const ATTRS: [Attr; 5] = [
    Attr::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
    Attr::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    Attr::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
    Attr::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    Attr::CU_POINTER_ATTRIBUTE_IS_MANAGED,
];

fn seen(address: u64) -> Result<Seen> {
    let mut s = Seen::default();
    let mut data: [*mut std::ffi::c_void; 5] = [
        &mut s.memory_type as *mut u32 as _,
        &mut s.ordinal as *mut i32 as _,
        &mut s.start as *mut u64 as _,
        &mut s.size as *mut usize as _,
        &mut s.managed as *mut u32 as _,
    ];
    let mut attrs = ATTRS;
    // SAFETY: each data pointer points to a local of the attribute's documented type; for an
    // address the driver does not know, it writes zeros and returns success (CUDA Driver API,
    // cuPointerGetAttributes).
    unsafe { drv::cuPointerGetAttributes(ATTRS.len() as u32, attrs.as_mut_ptr(), data.as_mut_ptr(), address) }
        .result()
        .map_err(crate::cuda::status::driver("cuPointerGetAttributes"))?;
    Ok(s)
}

/// Checks that `[address, address + len)` lies inside one allocation that device `ordinal` can
/// access: its own device memory (plain, pool or virtual-memory-managed), managed memory, or
/// host memory registered with or allocated by CUDA (mapped into the device's address space).
/// An empty extent is not checked.
///
/// # Errors
/// [`Error::NotDeviceMemory`] naming the operand, the extent and what the driver reported;
/// [`Error::Driver`] if the query itself fails.
pub(crate) fn check_extent(which: Which, address: u64, len: usize, ordinal: usize) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let s = seen(address)?;
    let wrong = |why: String| Err(Error::NotDeviceMemory { operand: which, address, len_bytes: len, why });
    let host = CUmemorytype::CU_MEMORYTYPE_HOST as u32;
    let device = CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
    let unified = CUmemorytype::CU_MEMORYTYPE_UNIFIED as u32;
    match s.memory_type {
        0 => return wrong("the driver knows no allocation there (a host pointer?)".into()),
        t if t == device && s.managed == 0 && s.ordinal != ordinal as i32 => {
            return wrong(format!("it is memory of device {}", s.ordinal));
        }
        t if t == device || t == host || t == unified => {}
        t => return wrong(format!("memory type {t} (an array?) is not linear memory")),
    }
    let end = address.saturating_add(len as u64);
    if s.size > 0 && (address < s.start || end > s.start.saturating_add(s.size as u64)) {
        return wrong(format!(
            "it runs past its allocation [{:#x}, {:#x})",
            s.start,
            s.start.saturating_add(s.size as u64)
        ));
    }
    Ok(())
}
