//! How the artefacts are linked (crates/vgpu-link): none loads libgcc_s.so.1, whose
//! constructor costs every process ~140 µs of trapped CPUID instructions on a virtual
//! machine, and none exports the unwinder linked into it in its place.

use std::path::Path;
use std::process::Command;

use crate::common::artefact;

/// The shared objects a program would load, as ld.so lists them (what `ldd` prints),
/// with `preload` preloaded.
fn loaded(program: &Path, preload: Option<&Path>) -> String {
    let mut cmd = Command::new(program);
    cmd.env("LD_TRACE_LOADED_OBJECTS", "1");
    if let Some(lib) = preload {
        cmd.env("LD_PRELOAD", lib);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    assert!(out.status.success(), "ld.so cannot list what {} loads: {}", program.display(), String::from_utf8_lossy(&out.stderr));
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(listed.contains("libc.so.6"), "ld.so's list names libc: {listed}");
    listed
}

#[test]
fn no_artefact_loads_libgcc_s() {
    let vgpu = artefact("vgpu");
    let listed = loaded(&vgpu, None);
    assert!(!listed.contains("libgcc_s"), "vgpu loads libgcc_s.so.1:\n{listed}");
    for lib in ["libvgpu.so", "libfakegpu.so", "libspank_vgpu.so"] {
        let listed = loaded(Path::new("/bin/true"), Some(&artefact(lib)));
        assert!(listed.contains(lib), "{lib} preloaded is listed: {listed}");
        assert!(!listed.contains("libgcc_s"), "{lib} loads libgcc_s.so.1:\n{listed}");
    }
}

#[test]
fn the_linked_in_unwinder_is_not_exported() {
    for lib in ["libvgpu.so", "libfakegpu.so", "libspank_vgpu.so"] {
        let path = artefact(lib);
        let out = Command::new("nm").args(["-D", "--defined-only"]).arg(&path).output().expect("nm (binutils) runs");
        assert!(out.status.success(), "nm -D {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
        let symbols = String::from_utf8_lossy(&out.stdout);
        assert!(symbols.lines().count() > 5, "{lib} exports its functions: {symbols}");
        let unwinder: Vec<&str> = symbols.lines().filter(|l| l.contains("_Unwind_") || l.contains("__register_frame")).collect();
        assert!(unwinder.is_empty(), "{lib} exports the unwinder, which would take over a C++ program's exceptions: {unwinder:?}");
    }
}
