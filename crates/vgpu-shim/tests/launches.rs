//! Every kernel launch path is governed through every way programs reach the driver:
//! linked, dlsym on a dlopen'ed libcuda, cuGetProcAddress_v2 with and without the
//! per-thread flag. Each name must resolve to the shim's own export (the C program compares
//! the pointer with the shim's dlsym of that export), and the launches must reach the
//! simulated driver exactly once each: the driver counts as many kernels with the shim as
//! without it.

use crate::common::*;

/// Every launch symbol the shim governs, and what each C label resolves to per mode.
const SYMBOLS: [&str; 12] = [
    "cuLaunchKernel",
    "cuLaunchKernel_ptsz",
    "cuLaunchKernelEx",
    "cuLaunchKernelEx_ptsz",
    "cuLaunchCooperativeKernel",
    "cuLaunchCooperativeKernel_ptsz",
    "cuLaunchCooperativeKernelMultiDevice",
    "cuGraphLaunch",
    "cuGraphLaunch_ptsz",
    "cuLaunch",
    "cuLaunchGrid",
    "cuLaunchGridAsync",
];

/// Run `launch MODE` bare and shimmed on one simulated GPU; the shimmed output.
fn run_launch(mode: &str) -> String {
    let bench = Bench::new(GIB, &[GIB / 2]);
    let program = bench.compile("launch", &[]);
    let bare = run_ok(bench.bare(&program).arg(mode));
    assert!(bare.contains(&format!("ok {mode}")), "{bare}");
    let after_bare = bench.driver_states()[0].launches();
    assert!(after_bare >= field_u64(&bare, "launched"), "{bare}");
    let out = run_ok(bench.shimmed(&program).arg(mode));
    assert!(out.contains(&format!("ok {mode}")), "{out}");
    assert_eq!(field(&out, "launched"), field(&bare, "launched"));
    assert_eq!(
        bench.driver_states()[0].launches() - after_bare,
        after_bare,
        "every launch reached the driver exactly once, as without the shim"
    );
    out
}

#[test]
fn launches_linked_against_libcuda() {
    let out = run_launch("linked");
    for symbol in SYMBOLS {
        assert_eq!(field(&out, &format!("fn.{symbol}")), format!("libvgpu.so:{symbol}"));
    }
}

#[test]
fn launches_through_dlsym() {
    let out = run_launch("dlsym");
    for symbol in SYMBOLS {
        assert_eq!(field(&out, &format!("fn.{symbol}")), format!("libvgpu.so:{symbol}"));
    }
}

#[test]
fn launches_through_cu_get_proc_address() {
    let out = run_launch("procaddr");
    for symbol in SYMBOLS.iter().filter(|s| !s.ends_with("_ptsz")) {
        assert_eq!(field(&out, &format!("fn.{symbol}")), format!("libvgpu.so:{symbol}"));
    }
}

#[test]
fn launches_through_cu_get_proc_address_per_thread() {
    let out = run_launch("ptds");
    for base in SYMBOLS.iter().filter(|s| !s.ends_with("_ptsz")) {
        let ptsz = format!("{base}_ptsz");
        let expected = if SYMBOLS.contains(&ptsz.as_str()) {
            ptsz
        } else {
            base.to_string()
        };
        assert_eq!(field(&out, &format!("fn.{base}")), format!("libvgpu.so:{expected}"));
    }
}

#[test]
fn the_proc_table_maps_launch_names_to_their_exports() {
    use vgpu_abi::cuda_procs::{resolve, Resolution};
    let symbol = |name: &str, version: i32, per_thread: bool| match resolve(name, version, per_thread) {
        Resolution::Found(p) => Some(p.symbol),
        _ => None,
    };
    assert_eq!(symbol("cuLaunchKernelEx", 12000, false), Some("cuLaunchKernelEx"));
    assert_eq!(symbol("cuLaunchKernelEx", 12000, true), Some("cuLaunchKernelEx_ptsz"));
    assert_eq!(symbol("cuGraphLaunch", 12000, true), Some("cuGraphLaunch_ptsz"));
    assert_eq!(symbol("cuGraphLaunch", 12000, false), Some("cuGraphLaunch"));
    assert_eq!(
        symbol("cuLaunchCooperativeKernel", 12000, true),
        Some("cuLaunchCooperativeKernel_ptsz")
    );
    assert_eq!(
        symbol("cuLaunchCooperativeKernelMultiDevice", 12000, true),
        Some("cuLaunchCooperativeKernelMultiDevice"),
        "no per-thread variant: the legacy one"
    );
    for legacy in ["cuLaunch", "cuLaunchGrid", "cuLaunchGridAsync"] {
        assert_eq!(symbol(legacy, 12000, true), Some(legacy));
    }
}
