//! A crash reporter for the GPU test executables: on SIGSEGV or SIGBUS it writes the faulting
//! address, the stack pointer, the raw backtrace (glibc's `backtrace_symbols_fd`: object file,
//! offset and address of every frame) and `/proc/self/maps` to stderr, then lets the default
//! action end the process. Everything the handler calls is async-signal-safe or, for
//! `backtrace`, primed before any crash, so a report comes out even from a smashed heap.

use std::ffi::{c_int, c_void};
use std::sync::Once;

extern "C" {
    // glibc <execinfo.h>
    fn backtrace(buffer: *mut *mut c_void, size: c_int) -> c_int;
    fn backtrace_symbols_fd(buffer: *const *mut c_void, size: c_int, fd: c_int);
}

fn put(bytes: &[u8]) {
    // SAFETY: write(2) on stderr with a valid buffer; async-signal-safe.
    unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
}

fn put_hex(label: &[u8], v: usize) {
    let mut buf = [0u8; 18];
    let digits = b"0123456789abcdef";
    for (i, b) in buf.iter_mut().skip(2).enumerate() {
        *b = digits[(v >> (60 - 4 * i)) & 0xf];
    }
    buf[0] = b'0';
    buf[1] = b'x';
    put(label);
    put(&buf);
    put(b"\n");
}

extern "C" fn on_fault(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    put(if sig == libc::SIGSEGV { b"\n=== crash reporter: SIGSEGV\n" } else { b"\n=== crash reporter: SIGBUS\n" });
    // SAFETY: the kernel passes a valid siginfo and ucontext to an SA_SIGINFO handler.
    unsafe {
        put_hex(b"fault address ", (*info).si_addr() as usize);
        let uc = ctx as *const libc::ucontext_t;
        put_hex(b"stack pointer ", (*uc).uc_mcontext.gregs[libc::REG_RSP as usize] as usize);
        put_hex(b"instruction   ", (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] as usize);
        put_hex(b"thread id     ", libc::syscall(libc::SYS_gettid) as usize);
        let mut frames = [std::ptr::null_mut::<c_void>(); 48];
        let n = backtrace(frames.as_mut_ptr(), frames.len() as c_int);
        put(b"--- backtrace (object(symbol+offset) [address])\n");
        backtrace_symbols_fd(frames.as_ptr(), n, 2);
        put(b"--- /proc/self/maps\n");
        let fd = libc::open(c"/proc/self/maps".as_ptr(), libc::O_RDONLY);
        if fd >= 0 {
            let mut buf = [0u8; 256];
            loop {
                let r = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                if r <= 0 {
                    break;
                }
                put(&buf[..r as usize]);
            }
            libc::close(fd);
        }
        put(b"=== end of crash report\n");
    }
    // SA_RESETHAND restored the default action: returning re-runs the faulting instruction,
    // which now ends the process with the signal (exit status 128 + signal).
}

/// Installs the reporter once per process (for SIGSEGV and SIGBUS, on the alternate signal
/// stack the Rust runtime gives each of its threads).
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: priming backtrace (it loads libgcc_s on first use, which allocates) outside
        // any signal; then a plain sigaction with a handler of the right signature.
        unsafe {
            let mut frames = [std::ptr::null_mut::<c_void>(); 4];
            backtrace(frames.as_mut_ptr(), frames.len() as c_int);
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_fault as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESETHAND;
            libc::sigemptyset(&mut act.sa_mask);
            for sig in [libc::SIGSEGV, libc::SIGBUS] {
                libc::sigaction(sig, &act, std::ptr::null_mut());
            }
        }
    });
}
