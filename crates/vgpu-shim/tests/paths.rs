//! The quota through every way real programs reach the driver: linked, dlopen + dlsym,
//! cuGetProcAddress (with and without the per-thread flag), Python ctypes. Each run checks
//! total = quota, inside fits, crossing → CUDA_ERROR_OUT_OF_MEMORY, free makes room, every
//! allocation path counted exactly, uncounted frees passed through, NVML virtualised.

use crate::common::*;

const QUOTA: u64 = 64 * MIB;

fn run_paths(mode: &str) -> String {
    let bench = Bench::new(GIB, &[QUOTA]);
    let paths = bench.compile("paths", &[]);
    let out = run_ok(bench.shimmed(&paths).args([mode, &QUOTA.to_string()]));
    assert!(out.contains(&format!("ok {mode}")), "{out}");
    assert_eq!(field_u64(&out, "total"), QUOTA);
    assert_eq!(
        field_u64(&out, "counted_pitch"),
        1024 * 10,
        "pitch × height, the driver's real pitch"
    );
    assert_eq!(field_u64(&out, "counted_vmm_host"), 0);
    // The driver's own answer for a pointer it never gave out (shim adds nothing).
    let bare = run_ok(bench.bare(bench.compile("uncounted", &[])).arg(shim_library()));
    assert_eq!(field(&out, "uncounted_free_rc"), field(&bare, "bogus_rc"));
    // Everything was freed: the vGPU holds nothing, and the driver agrees.
    let usage = bench.usage();
    assert_eq!(usage.devices()[0].used_bytes, 0);
    assert!(usage.devices()[0].peak_bytes <= QUOTA);
    assert!(
        bench.driver_states()[0].peak() <= QUOTA,
        "the driver never held more than the quota"
    );
    let procs = usage.processes();
    assert_eq!(procs.len(), 1, "one per-process file: {procs:?}");
    assert_eq!(procs[0].used_bytes, vec![0]);
    assert_eq!(procs[0].peak_bytes, vec![QUOTA / 2 + QUOTA / 8]);
    out
}

#[test]
fn linked_against_libcuda() {
    run_paths("linked");
}

#[test]
fn dlopen_and_dlsym() {
    run_paths("dlsym");
}

#[test]
fn through_cu_get_proc_address() {
    let out = run_paths("procaddr");
    // dlsym hands out the shim's cuGetProcAddress_v2; through it, cuGetProcAddress itself
    // and every governed function are the shim's.
    assert_eq!(field(&out, "first_getprocaddress"), "libvgpu.so:cuGetProcAddress_v2");
    assert_eq!(field(&out, "getprocaddress"), "libvgpu.so:cuGetProcAddress_v2");
    assert_eq!(field(&out, "memalloc"), "libvgpu.so:cuMemAlloc_v2");
    assert_eq!(field(&out, "memallocasync"), "libvgpu.so:cuMemAllocAsync");
    assert_eq!(field(&out, "v1_getprocaddress"), "libvgpu.so:cuGetProcAddress");
    assert_eq!(field(&out, "v1_memalloc"), "libvgpu.so:cuMemAlloc_v2");
}

#[test]
fn through_cu_get_proc_address_per_thread() {
    let out = run_paths("ptds");
    assert_eq!(field(&out, "memallocasync"), "libvgpu.so:cuMemAllocAsync_ptsz");
    assert_eq!(field(&out, "memfreeasync"), "libvgpu.so:cuMemFreeAsync_ptsz");
    assert_eq!(
        field(&out, "memalloc"),
        "libvgpu.so:cuMemAlloc_v2",
        "no per-thread variant: the legacy one"
    );
}

#[test]
fn python_ctypes() {
    let bench = Bench::new(GIB, &[QUOTA]);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/ctypes_quota.py");
    let out = run_ok(bench.shimmed("python3").arg(script).arg(QUOTA.to_string()));
    assert!(out.contains("ok python"), "{out}");
    assert_eq!(bench.usage().devices()[0].used_bytes, 0);
}

#[test]
fn uncounted_pointer_is_freed_by_the_driver() {
    let bench = Bench::new(GIB, &[QUOTA]);
    let program = bench.compile("uncounted", &[]);
    // Not preloaded: the shim is loaded after the allocation, inside the vGPU.
    let out = run_ok(
        bench
            .bare(&program)
            .env("VGPU_DIR", &bench.vgpu_dir)
            .arg(shim_library()),
    );
    assert!(out.contains("ok uncounted"), "{out}");
    assert_eq!(field_u64(&out, "shim_total"), QUOTA);
    assert_eq!(field_u64(&out, "shim_free"), QUOTA, "nothing counted");
    assert_eq!(bench.usage().devices()[0].used_bytes, 0);
}
