//! The shim's modes and its manners as a preloaded library: pass-through without a vGPU,
//! fail-closed with a broken one, `dlsym(RTLD_NEXT)` kept intact for everyone else.

use crate::common::*;

const QUOTA: u64 = 64 * MIB;

#[test]
fn without_vgpu_dir_the_shim_passes_everything_through() {
    let bench = Bench::new(GIB, &[QUOTA]);
    let probe = bench.compile("probe", &[]);
    let out =
        run_ok(
            bench
                .shimmed(&probe)
                .env_remove("VGPU_DIR")
                .args(["info", "alloc", &(512 * MIB).to_string(), "total"]),
        );
    assert_eq!(field_u64(&out, "total"), GIB, "the device's own size");
    assert_eq!(
        field(&out, "alloc"),
        "0",
        "far above the vGPU's quota, but no vGPU was named"
    );
    assert_eq!(field_u64(&out, "device_total"), GIB);
    assert_eq!(bench.usage().devices()[0].used_bytes, 0);
    assert!(bench.usage().processes().is_empty(), "no state file without a vGPU");
}

#[test]
fn loading_the_shim_does_nothing_until_the_driver_is_called() {
    // A program that never touches CUDA: no driver loaded, no vGPU looked up (the broken
    // VGPU_DIR would be reported), no output from the shim.
    let bench = Bench::new(GIB, &[QUOTA]);
    let out = bench
        .shimmed("cat")
        .arg("/proc/self/maps")
        .env("VGPU_DIR", "/nonexistent")
        .output()
        .unwrap();
    assert!(out.status.success());
    let maps = String::from_utf8_lossy(&out.stdout);
    assert!(maps.contains("libvgpu.so"), "the shim is loaded");
    assert!(
        !maps.contains("libfakegpu") && !maps.contains("libcuda"),
        "no driver loaded:\n{maps}"
    );
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_missing_usage_file_fails_closed_with_one_line() {
    let bench = Bench::new(GIB, &[QUOTA]);
    let probe = bench.compile("probe", &[]);
    let missing = bench.dir.path().join("no-such-vgpu");
    let out = bench
        .shimmed(&probe)
        .env("VGPU_DIR", &missing)
        .args(["alloc", "4096", "alloc", "1", "info"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stdout.matches("alloc=2").count(),
        2,
        "every allocation refused with OUT_OF_MEMORY:\n{stdout}"
    );
    assert_eq!(field(&stdout, "free"), "0");
    assert_eq!(stderr.lines().count(), 1, "exactly one line:\n{stderr}");
    assert!(
        stderr.contains(missing.to_str().unwrap()) && stderr.contains("refusing"),
        "{stderr}"
    );
}

#[test]
fn a_usage_file_of_another_layout_version_fails_closed_and_says_so() {
    let bench = Bench::new(GIB, &[QUOTA]);
    let probe = bench.compile("probe", &[]);
    let path = bench.vgpu_dir.join("usage");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8..12].copy_from_slice(&99u32.to_ne_bytes());
    std::fs::write(&path, bytes).unwrap();
    let out = bench.shimmed(&probe).args(["alloc", "4096"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("alloc=2"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = format!(
        "created by a newer vgpu (layout version 99, this build reads {})",
        vgpu_abi::layout::LAYOUT_VERSION
    );
    assert!(stderr.contains(&expected), "{stderr}");
}

#[test]
fn a_garbage_usage_file_fails_closed() {
    let bench = Bench::new(GIB, &[QUOTA]);
    let probe = bench.compile("probe", &[]);
    std::fs::write(
        bench.vgpu_dir.join("usage"),
        b"not a usage file, just text long enough to hold a header........",
    )
    .unwrap();
    let out = bench.shimmed(&probe).args(["alloc", "4096"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("alloc=2"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a vgpu usage file"));
}

#[test]
fn unwritable_procs_dir_refuses_allocations_but_still_reports() {
    let bench = Bench::new(GIB, &[QUOTA]);
    let probe = bench.compile("probe", &[]);
    std::fs::remove_dir(bench.vgpu_dir.join("procs")).unwrap();
    std::fs::write(bench.vgpu_dir.join("procs"), b"a file, not a directory").unwrap();
    let out = bench
        .shimmed(&probe)
        .args(["info", "alloc", "4096", "alloc", "4096"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(field_u64(&stdout, "total"), QUOTA);
    assert_eq!(stdout.matches("alloc=2").count(), 2, "{stdout}");
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
    assert_eq!(
        bench.usage().devices()[0].used_bytes,
        0,
        "refused reservations were given back"
    );
}

#[test]
fn rtld_next_keeps_its_meaning_for_other_callers() {
    // libnext_a's dlsym(RTLD_NEXT, "probe") must find libnext_b's, not its own: with the
    // shim calling the real dlsym from its own frame it would (LLVM OpenMP under HAMi-core).
    let bench = Bench::new(GIB, &[QUOTA]);
    for lib in ["next_a", "next_b"] {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{lib}.c"));
        let out = bench.bin_dir.join(format!("lib{lib}.so"));
        run_ok(
            std::process::Command::new("gcc")
                .args(["-shared", "-fPIC", "-o"])
                .arg(&out)
                .arg(src)
                .arg("-ldl"),
        );
    }
    let rpath = format!("-Wl,-rpath,{}", bench.bin_dir.display());
    let program = bench.compile(
        "rtld_next",
        &[
            "-L",
            bench.bin_dir.to_str().unwrap(),
            "-Wl,--no-as-needed",
            "-lnext_a",
            "-lnext_b",
            &rpath,
        ],
    );
    assert!(
        run_ok(&mut bench.bare(&program)).contains("ok rtld_next"),
        "the test itself must hold without the shim"
    );
    assert!(run_ok(&mut bench.shimmed(&program)).contains("ok rtld_next"));
    assert!(run_ok(bench.shimmed(&program).env_remove("VGPU_DIR")).contains("ok rtld_next"));
}

#[test]
fn each_device_of_a_vgpu_has_its_own_quota_matched_by_uuid() {
    let bench = Bench::new(GIB, &[32 * MIB, 64 * MIB]);
    let probe = bench.compile("probe", &[]);
    let out = run_ok(
        bench
            .shimmed(&probe)
            .args(["info", "dev", "1", "info", "alloc", &(40 * MIB).to_string()]),
    );
    let infos: Vec<&str> = out.lines().filter(|l| l.starts_with("info=")).collect();
    assert_eq!(field_u64(infos[0], "total"), 32 * MIB);
    assert_eq!(field_u64(infos[1], "total"), 64 * MIB);
    assert_eq!(field(&out, "alloc"), "0", "40 MiB fits device 1's 64 MiB");
    let usage = bench.usage();
    // The process exited holding it; reclaim gives it back from device 1 only.
    let report = usage.reclaim_dead();
    assert_eq!(report.bytes, 40 * MIB);
    assert_eq!(usage.devices()[1].peak_bytes, 40 * MIB);
    assert_eq!(usage.devices()[0].peak_bytes, 0);

    // CUDA_VISIBLE_DEVICES renumbers: ordinal 0 is now the second GPU, found by its UUID.
    let out = run_ok(bench.shimmed(&probe).env("CUDA_VISIBLE_DEVICES", "1").args([
        "info",
        "alloc",
        &(40 * MIB).to_string(),
        "total",
    ]));
    assert_eq!(field_u64(&out, "total"), 64 * MIB);
    assert_eq!(field_u64(&out, "device_total"), 64 * MIB);
    assert_eq!(field(&out, "alloc"), "0");
    assert_eq!(bench.usage().devices()[1].peak_bytes, 40 * MIB);
}

#[test]
fn a_gpu_outside_the_vgpu_offers_nothing() {
    // Two GPUs visible, the vGPU has only the first.
    let bench = Bench::new(GIB, &[32 * MIB, 64 * MIB]);
    let usage_path = bench.vgpu_dir.join("usage");
    vgpu_abi::usage::UsageFile::create(
        &usage_path,
        &[vgpu_abi::usage::DeviceQuota {
            uuid: UUIDS[0].into(),
            quota_bytes: 32 * MIB,
            compute_pct: 100,
            policy: Default::default(),
            priority: 0,
            turn_max_us: 0,
        }],
    )
    .unwrap();
    let probe = bench.compile("probe", &[]);
    let out = run_ok(bench.shimmed(&probe).args(["dev", "1", "info", "alloc", "4096"]));
    assert_eq!(field(&out, "free"), "0");
    assert_eq!(field_u64(&out, "total"), GIB);
    assert_eq!(field(&out, "alloc"), "2");
}
