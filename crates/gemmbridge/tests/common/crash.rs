//! A crash reporter for the GPU test executables (x86-64 Linux with glibc; elsewhere
//! [`install`] does nothing): on SIGSEGV or SIGBUS it writes the faulting address, the stack
//! pointer, the raw return addresses of the stack (glibc's `backtrace`) and `/proc/self/maps`
//! to stderr, then hands the signal to the handler installed before it (Rust's, which names a
//! stack overflow) and finally re-raises it with the default action, so the process ends with
//! the signal. Everything the handler calls is async-signal-safe or, for `backtrace`, primed
//! before any crash; it keeps its own frame small, for the few KiB of alternate signal stack
//! the Rust runtime gives each thread.

#[cfg(all(target_os = "linux", target_env = "gnu", target_arch = "x86_64"))]
mod imp {
    use std::ffi::{c_int, c_void};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Once;

    extern "C" {
        // glibc <execinfo.h>
        fn backtrace(buffer: *mut *mut c_void, size: c_int) -> c_int;
    }

    /// The handlers installed before ours (address and flags), per signal: SIGSEGV, SIGBUS.
    static PREVIOUS: [(AtomicUsize, AtomicUsize); 2] =
        [(AtomicUsize::new(0), AtomicUsize::new(0)), (AtomicUsize::new(0), AtomicUsize::new(0))];

    fn put(bytes: &[u8]) {
        // SAFETY: write(2) on stderr with a valid buffer; async-signal-safe.
        unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
    }

    fn put_hex(label: &[u8], v: usize) {
        let mut buf = [0u8; 19];
        let digits = b"0123456789abcdef";
        buf[0] = b'0';
        buf[1] = b'x';
        for (i, b) in buf[2..18].iter_mut().enumerate() {
            *b = digits[(v >> (60 - 4 * i)) & 0xf];
        }
        buf[18] = b'\n';
        put(label);
        put(&buf);
    }

    extern "C" fn on_fault(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
        put(if sig == libc::SIGSEGV { b"\n=== crash reporter: SIGSEGV\n" } else { b"\n=== crash reporter: SIGBUS\n" });
        // SAFETY: the kernel passes a valid siginfo and ucontext to an SA_SIGINFO handler; the
        // calls below are async-signal-safe (backtrace was primed in `install`).
        unsafe {
            put_hex(b"fault address ", (*info).si_addr() as usize);
            let uc = ctx as *const libc::ucontext_t;
            put_hex(b"stack pointer ", (*uc).uc_mcontext.gregs[libc::REG_RSP as usize] as usize);
            put_hex(b"instruction   ", (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] as usize);
            put_hex(b"thread id     ", libc::syscall(libc::SYS_gettid) as usize);
            let mut frames = [std::ptr::null_mut::<c_void>(); 32];
            let n = backtrace(frames.as_mut_ptr(), frames.len() as c_int);
            put(b"--- return addresses (find each in the map below)\n");
            for f in &frames[..n.max(0) as usize] {
                put_hex(b"  ", *f as usize);
            }
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
            // the handler before ours (Rust's names a stack overflow, then aborts; otherwise it
            // restores the default action and returns)
            let (addr, flags) = &PREVIOUS[usize::from(sig == libc::SIGBUS)];
            let (addr, flags) = (addr.load(Ordering::Relaxed), flags.load(Ordering::Relaxed) as c_int);
            if addr != libc::SIG_DFL && addr != libc::SIG_IGN {
                if flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = std::mem::transmute(addr);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(c_int) = std::mem::transmute(addr);
                    f(sig);
                }
            }
            // SA_RESETHAND restored the default action; a signal sent (not a fault) would not
            // recur by itself, so it is raised again: pending until this handler returns, then
            // delivered with the default action, which ends the process with it.
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }

    pub fn install() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            // SAFETY: priming backtrace (it loads libgcc_s on first use, which allocates)
            // outside any signal; then plain sigactions with a handler of the right signature.
            unsafe {
                let mut frames = [std::ptr::null_mut::<c_void>(); 4];
                backtrace(frames.as_mut_ptr(), frames.len() as c_int);
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = on_fault as *const () as usize;
                act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESETHAND;
                libc::sigemptyset(&mut act.sa_mask);
                for (i, sig) in [libc::SIGSEGV, libc::SIGBUS].into_iter().enumerate() {
                    let mut old: libc::sigaction = std::mem::zeroed();
                    if libc::sigaction(sig, &act, &mut old) == 0 {
                        PREVIOUS[i].0.store(old.sa_sigaction, Ordering::Relaxed);
                        PREVIOUS[i].1.store(old.sa_flags as usize, Ordering::Relaxed);
                    }
                }
            }
        });
    }
}

/// Installs the reporter once per process (for SIGSEGV and SIGBUS, on the alternate signal
/// stack the Rust runtime gives each of its threads).
pub fn install() {
    #[cfg(all(target_os = "linux", target_env = "gnu", target_arch = "x86_64"))]
    imp::install();
}
