//! (f) State shared across processes: allocations of several processes add up, a SIGKILLed
//! process's memory comes back, CUDA_VISIBLE_DEVICES selects and orders devices, a
//! two-device config is honoured, setters are refused to unprivileged callers, and a bad
//! config fails cleanly with one line naming the file and key. Clients are the C program
//! `tests/c/client.c` and probes of `examples/fakegpu_probe.rs`.

use crate::common::{self, field, run_ok, Fake, Holder};
use cudarc::driver::sys::CUresult;
use nvml_wrapper_sys::bindings as nv;

const GIB: u64 = 1 << 30;

const TWO_A100: &str = r#"
[[device]]
name = "NVIDIA A100-SXM4-40GB"
memory = "40GiB"
uuid = "GPU-a1000000-0000-0000-0000-000000000000"

[[device]]
name = "NVIDIA A100-SXM4-40GB"
memory = "40GiB"
uuid = "GPU-a1000001-0000-0000-0000-000000000001"
clock_locking = false
power_limit_settable = false
"#;

#[test]
fn two_processes_allocations_both_count() {
    let fake = Fake::new();
    let client = fake.build_client();
    let state = &fake.states()[0];
    let one = Holder::spawn(fake.command(&client).args(["hold", "1024"]));
    let two = Holder::spawn(fake.command(&client).args(["hold", "2048"]));
    assert_eq!(state.used(), 3 * GIB);
    let mut seen: Vec<(u32, u64)> = state.processes().iter().map(|p| (p.pid, p.bytes)).collect();
    seen.sort();
    let mut expected = vec![(one.pid(), GIB), (two.pid(), 2 * GIB)];
    expected.sort();
    assert_eq!(seen, expected);
    one.finish();
    assert_eq!(state.used(), 2 * GIB);
    two.finish();
    assert_eq!((state.used(), state.peak()), (0, 3 * GIB));
    assert!(state.processes().is_empty());
}

#[test]
fn sigkilled_process_memory_is_reclaimed() {
    let fake = Fake::new();
    let client = fake.build_client();
    let state = &fake.states()[0];

    // Reclaimed by the next cuInit.
    let holder = Holder::spawn(fake.command(&client).args(["hold", "4096"]));
    let pid = holder.pid();
    holder.kill();
    assert_eq!(state.used(), 4 * GIB, "nobody has looked yet");
    assert_eq!(state.bytes_of(pid), 4 * GIB);
    let out = run_ok(&mut fake.command(&client));
    assert_eq!(
        field(&out, "free"),
        (79 * GIB).to_string(),
        "cuInit gave the dead process's 4 GiB back"
    );
    assert_eq!(state.used(), 0);

    // Reclaimed by an NVML memory query.
    let holder = Holder::spawn(fake.command(&client).args(["hold", "2048"]));
    holder.kill();
    assert_eq!(state.used(), 2 * GIB);
    let out = run_ok(&mut fake.probe("nvml_memory"));
    assert_eq!(field(&out, "used"), "0");
    assert_eq!(field(&out, "processes"), "0");
    assert_eq!(state.used(), 0);
}

#[test]
fn cuda_visible_devices_selects_and_orders() {
    let fake = Fake::with_config(TWO_A100);
    let hex = |uuid: &str| uuid.trim_start_matches("GPU-").replace('-', "");
    let config = fake.config();
    let (u0, u1) = (hex(&config.devices[0].uuid), hex(&config.devices[1].uuid));
    let probe = |visible: Option<&str>| {
        let mut cmd = fake.probe("visible_devices");
        if let Some(v) = visible {
            cmd.env("CUDA_VISIBLE_DEVICES", v);
        }
        run_ok(&mut cmd)
    };
    let out = probe(None);
    assert_eq!(field(&out, "uuids"), format!("{u0},{u1}"));
    assert_eq!(field(&out, "name0"), "NVIDIA A100-SXM4-40GB");
    assert_eq!(field(&probe(Some("1")), "uuids"), u1);
    assert_eq!(field(&probe(Some("1,0")), "uuids"), format!("{u1},{u0}"));
    assert_eq!(
        field(&probe(Some("0,7,1")), "uuids"),
        u0,
        "parsing stops at the first invalid entry"
    );
    assert_eq!(
        field(&probe(Some("GPU-a1000001")), "uuids"),
        u1,
        "a unique UUID prefix"
    );
    assert_eq!(
        field(&probe(Some(&config.devices[1].uuid)), "uuids"),
        u1,
        "a full UUID"
    );
    assert_eq!(
        field(&probe(Some("GPU-a100000")), "init"),
        (CUresult::CUDA_ERROR_NO_DEVICE as u32).to_string(),
        "ambiguous"
    );
    assert_eq!(
        field(&probe(Some("")), "init"),
        (CUresult::CUDA_ERROR_NO_DEVICE as u32).to_string()
    );
}

#[test]
fn two_device_config_is_honoured() {
    let fake = Fake::with_config(TWO_A100);
    let states = fake.states();
    let holder = Holder::spawn(&mut fake.probe("two_device_holder"));
    assert_eq!((states[0].used(), states[1].used()), (GIB, 3 * GIB));
    holder.finish();
    assert_eq!((states[0].used(), states[1].used()), (0, 0));

    // CUDA device 0 is physical device 1 here.
    let holder = Holder::spawn(
        fake.probe("two_device_holder")
            .env("CUDA_VISIBLE_DEVICES", "1"),
    );
    assert_eq!((states[0].used(), states[1].used()), (0, GIB));
    holder.finish();
}

#[test]
fn setters_need_root_and_support() {
    use std::os::unix::process::CommandExt;
    let fake = Fake::with_config(TWO_A100);
    let states = fake.states();
    let code = |c: u32| c.to_string();
    let (ok, no_permission, not_supported, invalid) = (
        code(nv::nvmlReturn_enum_NVML_SUCCESS),
        code(nv::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION),
        code(nv::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED),
        code(nv::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT),
    );

    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test runs as root and drops to nobody in a child"
    );
    let out = run_ok(fake.probe("setters").uid(65534).gid(65534));
    for key in ["clocks0", "reset0", "limit0", "persistence0"] {
        assert_eq!(field(&out, key), no_permission, "{key} as nobody");
    }
    assert_eq!(
        field(&out, "clocks1"),
        not_supported,
        "clock_locking = false comes first"
    );
    assert_eq!(field(&out, "get_limit0"), ok, "reading needs no privilege");
    assert_eq!(
        field(&out, "alloc"),
        "0",
        "an unprivileged process can use the device"
    );
    assert_eq!(
        (
            states[0].locked_clocks(),
            states[0].power_limit_mw(),
            states[0].persistence_mode()
        ),
        (None, None, false)
    );

    let out = run_ok(&mut fake.probe("setters"));
    assert_eq!(field(&out, "clocks0"), ok);
    assert_eq!(field(&out, "bad_clocks0"), invalid);
    assert_eq!(field(&out, "reset0"), ok);
    assert_eq!(field(&out, "limit0"), ok);
    assert_eq!(field(&out, "bad_limit0"), invalid);
    assert_eq!(field(&out, "persistence0"), ok);
    assert_eq!(field(&out, "clocks1"), not_supported);
    assert_eq!(field(&out, "limit1"), not_supported);
    assert_eq!(field(&out, "persistence1"), ok);
    assert_eq!(
        (
            states[0].locked_clocks(),
            states[0].power_limit_mw(),
            states[0].persistence_mode()
        ),
        (None, Some(250_000), true)
    );
}

#[test]
fn bad_config_fails_cleanly_and_says_why() {
    let fake = Fake::with_config("[[device]]\nname = \"x\"\nmemory = \"8GiB\"\nmemry = 1\n");
    let mut cmd = fake.probe("init");
    let out = cmd.output().unwrap();
    common::assert_success(&cmd, &out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let no_device = (CUresult::CUDA_ERROR_NO_DEVICE as u32).to_string();
    assert_eq!(field(&stdout, "cu_init"), no_device);
    assert_eq!(field(&stdout, "cu_init_again"), no_device);
    assert_eq!(
        field(&stdout, "nvml_init"),
        nv::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED.to_string()
    );
    assert_eq!(field(&stdout, "nvml_text"), "Driver Not Loaded");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("fakegpu:"))
        .collect();
    assert_eq!(lines.len(), 1, "exactly one line: {stderr}");
    let path = fake.config_path.as_ref().unwrap().display().to_string();
    assert!(
        lines[0].contains(&path) && lines[0].contains("memry"),
        "{}",
        lines[0]
    );

    // A missing file is a bad config too.
    let mut cmd = fake.probe("init");
    cmd.env("FAKEGPU_CONFIG", fake.dir.path().join("missing.toml"));
    let out = cmd.output().unwrap();
    assert_eq!(
        field(&String::from_utf8_lossy(&out.stdout), "cu_init"),
        no_device
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml: cannot read"));
}
