//! The checks every entry point shares: a buffer's context, the epilogue operands' roles, and
//! the buffer descriptions of a call (all before anything is enqueued).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

use crate::epilogue::{AuxUse, Epilogue, VectorUse};
use crate::error::{Error, Result, Which};

/// [`Error::WrongContext`] unless `s` belongs to `ctx`.
pub(crate) fn same_context(which: Which, s: &Arc<CudaStream>, ctx: &Arc<CudaContext>) -> Result<()> {
    if s.context() == ctx {
        Ok(())
    } else {
        Err(Error::WrongContext { operand: which, ordinal: s.context().ordinal(), expected: ctx.ordinal() })
    }
}

/// The epilogue operands given for reading or writing as the epilogue uses them, each once.
pub(super) fn check_roles(e: Epilogue, bias: bool, bias_grad: bool, aux_in: bool, aux_out: bool) -> Result<()> {
    let wrong = |operand, problem| Err(Error::EpilogueOperand { epilogue: e, operand, problem });
    if bias && e.vector() == VectorUse::WritesGrad {
        return wrong("bias", "is written by this epilogue: pass it as bias_grad (&mut), not bias (&)");
    }
    if aux_in && e.aux() == AuxUse::Writes {
        return wrong("aux", "is written by this epilogue: pass it as aux_out (&mut), not aux_in (&)");
    }
    if bias && bias_grad {
        return wrong("bias", "was given twice (bias and bias_grad)");
    }
    if aux_in && aux_out {
        return wrong("aux", "was given twice (aux_in and aux_out)");
    }
    Ok(())
}

/// The address, length in bytes and cudarc guard of an operand given either for reading or for
/// writing (never both: the caller has checked).
pub(super) fn either_ptr<'g, 'o: 'g, T>(
    read: Option<&'g (dyn DevicePtr<T> + 'o)>,
    write: Option<&'g mut (dyn DevicePtrMut<T> + 'o)>,
    s: &'g CudaStream,
) -> (Option<u64>, usize, Option<cudarc::driver::SyncOnDrop<'g>>) {
    match (read, write) {
        (Some(v), _) => {
            let len = v.num_bytes();
            let (p, g) = v.device_ptr(s);
            (Some(p), len, Some(g))
        }
        (None, Some(v)) => {
            let len = v.num_bytes();
            let (p, g) = v.device_ptr_mut(s);
            (Some(p), len, Some(g))
        }
        (None, None) => (None, 0, None),
    }
}

/// One checked buffer: which, address, byte span the problem touches.
#[derive(Clone, Copy)]
pub(super) struct Span {
    pub which: Which,
    pub addr: u64,
    pub bytes: usize,
}

impl Span {
    /// The `elems` elements of `elem` bytes a buffer of `have` bytes at `addr` must hold.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] when it holds fewer.
    pub(super) fn sized(which: Which, addr: u64, have: usize, elems: usize, elem: usize) -> Result<Span> {
        Error::check_bytes(which, have, elems, elem)?;
        Ok(Span { which, addr, bytes: elems * elem })
    }
}

/// No written span overlaps another written span or a read one.
pub(super) fn disjoint(written: &[Span], read: &[Span]) -> Result<()> {
    for (i, o) in written.iter().enumerate() {
        for r in written[i + 1..].iter().chain(read) {
            let (o1, r1) = (o.addr + o.bytes as u64, r.addr + r.bytes as u64);
            if o.addr < r1 && r.addr < o1 && o.bytes > 0 && r.bytes > 0 {
                return Err(Error::OutputOverlapsInput {
                    output: o.which,
                    input: r.which,
                    out_start: o.addr,
                    out_end: o1,
                    in_start: r.addr,
                    in_end: r1,
                });
            }
        }
    }
    Ok(())
}

/// The buffer rules: the buffer holds `elems` elements of `elem` bytes, its address is a
/// multiple of the element size.
pub(super) fn span(which: Which, addr: u64, have: usize, elems: usize, elem: usize) -> Result<Span> {
    let s = Span::sized(which, addr, have, elems, elem)?;
    if !addr.is_multiple_of(elem as u64) {
        return Err(Error::Misaligned { operand: which, address: addr, align: elem });
    }
    Ok(s)
}

/// An input's checked span (its guard added to `guards`).
pub(super) fn read_span<'g, 'b: 'g, V>(
    s: &'g CudaStream,
    (which, buf): (Which, &'g (dyn DevicePtr<V> + 'b)),
    (elems, elem): (usize, usize),
    guards: &mut Vec<SyncOnDrop<'g>>,
) -> Result<Span> {
    let (addr, g) = buf.device_ptr(s);
    guards.push(g);
    span(which, addr, buf.num_bytes(), elems, elem)
}

/// An output's checked span (its guard added to `guards`).
pub(super) fn write_span<'g, 'b: 'g, V>(
    s: &'g CudaStream,
    (which, buf): (Which, &'g mut (dyn DevicePtrMut<V> + 'b)),
    (elems, elem): (usize, usize),
    guards: &mut Vec<SyncOnDrop<'g>>,
) -> Result<Span> {
    let bytes = buf.num_bytes();
    let (addr, g) = buf.device_ptr_mut(s);
    guards.push(g);
    span(which, addr, bytes, elems, elem)
}
