//! The unwinder is linked into each artefact (libgcc_eh.a), so no process vgpu starts or
//! preloads into loads libgcc_s.so.1.
//!
//! Rust's standard library links `-lgcc_s` for `_Unwind_*` (panics unwind: the shim
//! catches them at its C boundary). Loading libgcc_s.so.1 costs a process ~140 µs on a
//! virtual machine: its constructor (`__cpu_indicator_init`) executes CPUID about a dozen
//! times, and each CPUID traps to the hypervisor (7.8 µs apiece on the CI machine, nested).
//! `vgpu run` paid it twice (vgpu, then the workload through the shim), and so does every
//! process the shim is preloaded into. Measured paired: `LD_PRELOAD=libvgpu.so true` +216 µs
//! over `true` with libgcc_s.so.1, +72 µs without; `vgpu --version` −135..−162 µs.
//!
//! How: a linker script named `libgcc_s.so` in a directory searched before the compiler's
//! names the static unwinder instead (`INPUT(-lgcc_eh)`, found in the compiler's own
//! directory, as `gcc -static-libgcc` would). The unwinder's symbols stay private to each
//! shared library: rustc exports a cdylib's `#[no_mangle]` functions only (a version
//! script), so a C++ host program's exceptions still go through its own libgcc_s.
//!
//! Not on a target that links the C runtime statically (crt-static) or another libc:
//! there std links the unwinder itself, or something else.
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let static_crt = var("CARGO_CFG_TARGET_FEATURE").split(',').any(|f| f == "crt-static");
    if var("CARGO_CFG_TARGET_OS") != "linux" || var("CARGO_CFG_TARGET_ENV") != "gnu" || static_crt {
        return;
    }
    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        panic!("cargo sets OUT_DIR for build scripts");
    };
    let script = out.join("libgcc_s.so");
    if let Err(e) = std::fs::write(&script, "/* vgpu-link/build.rs: the unwinder linked in, not libgcc_s.so.1 loaded */\nINPUT(-lgcc_eh)\n") {
        panic!("cannot write {}: {e}", script.display());
    }
    println!("cargo:rustc-link-search=native={}", out.display());
}
