//! (f) State shared across processes: allocations of several processes add up, a SIGKILLed
//! process's memory comes back, CUDA_VISIBLE_DEVICES selects and orders devices, a
//! two-device config is honoured, setters are refused to unprivileged callers, and a bad
//! config fails cleanly with one line naming the file and key.

mod common;

use std::ffi::{c_char, c_uint, c_void};

use common::{field, in_child, run_ok, Cuda, Fake, Holder};
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
    let out = run_ok(&mut fake.rerun("nvml_memory_probe"));
    assert_eq!(field(&out, "used"), "0");
    assert_eq!(field(&out, "processes"), "0");
    assert_eq!(state.used(), 0);
}

/// Child of the test above: what NVML reports.
#[test]
#[ignore = "child process of sigkilled_process_memory_is_reclaimed"]
fn nvml_memory_probe() {
    assert!(in_child(), "run by sigkilled_process_memory_is_reclaimed");
    let nvml = nvml_wrapper::Nvml::init().unwrap();
    let device = nvml.device_by_index(0).unwrap();
    println!("used={}", device.memory_info().unwrap().used);
    println!(
        "processes={}",
        device.running_compute_processes().unwrap().len()
    );
}

/// Child: what CUDA shows under the inherited CUDA_VISIBLE_DEVICES.
#[test]
#[ignore = "child process of cuda_visible_devices_selects_and_orders"]
fn visible_devices_probe() {
    assert!(in_child(), "run by cuda_visible_devices_selects_and_orders");
    let cuda = Cuda::load();
    let init = cuda.init();
    println!("init={init}");
    if init != 0 {
        return;
    }
    let count = cuda.device_count().unwrap();
    println!("count={count}");
    let uuids: Vec<String> = (0..count)
        .map(|d| {
            cuda.device_uuid(d)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        })
        .collect();
    println!("uuids={}", uuids.join(","));
    println!("name0={}", cuda.device_name(0));
}

#[test]
fn cuda_visible_devices_selects_and_orders() {
    let fake = Fake::with_config(TWO_A100);
    let hex = |uuid: &str| uuid.trim_start_matches("GPU-").replace('-', "");
    let config = fake.config();
    let (u0, u1) = (hex(&config.devices[0].uuid), hex(&config.devices[1].uuid));
    let probe = |visible: Option<&str>| {
        let mut cmd = fake.rerun("visible_devices_probe");
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

/// Child: hold 1 GiB on CUDA device 0 and 3 GiB on CUDA device 1 until stdin closes.
#[test]
#[ignore = "child process of two_device_config_is_honoured"]
fn two_device_holder() {
    assert!(in_child(), "run by two_device_config_is_honoured");
    let cuda = Cuda::load();
    assert_eq!(cuda.init(), 0);
    let count = cuda.device_count().unwrap();
    cuda.ctx_create(0).unwrap();
    cuda.alloc(GIB as usize).unwrap();
    if count > 1 {
        cuda.ctx_create(1).unwrap();
        cuda.alloc(3 * GIB as usize).unwrap();
        assert_eq!(
            cuda.alloc(38 * GIB as usize),
            Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY as u32),
            "40 GiB devices"
        );
    }
    println!("ready");
    common::wait_for_stdin_eof();
}

#[test]
fn two_device_config_is_honoured() {
    let fake = Fake::with_config(TWO_A100);
    let states = fake.states();
    let holder = Holder::spawn(&mut fake.rerun("two_device_holder"));
    assert_eq!((states[0].used(), states[1].used()), (GIB, 3 * GIB));
    holder.finish();
    assert_eq!((states[0].used(), states[1].used()), (0, 0));

    // CUDA device 0 is physical device 1 here.
    let holder = Holder::spawn(
        fake.rerun("two_device_holder")
            .env("CUDA_VISIBLE_DEVICES", "1"),
    );
    assert_eq!((states[0].used(), states[1].used()), (0, GIB));
    holder.finish();
}

type SetClocks = unsafe extern "C" fn(*mut c_void, c_uint, c_uint) -> u32;
type SetLimit = unsafe extern "C" fn(*mut c_void, c_uint) -> u32;

/// Child: try every setter on both devices and print the results.
#[test]
#[ignore = "child process of setters_need_root_and_support"]
fn setters_probe() {
    assert!(in_child(), "run by setters_need_root_and_support");
    // SAFETY: loading the fake NVML by soname.
    let lib = unsafe { libloading::Library::new("libnvidia-ml.so.1") }.unwrap();
    // SAFETY: signatures as nvml.h declares them.
    unsafe {
        let init = *lib
            .get::<unsafe extern "C" fn() -> u32>(b"nvmlInit_v2")
            .unwrap();
        let by_index = *lib
            .get::<unsafe extern "C" fn(c_uint, *mut *mut c_void) -> u32>(
                b"nvmlDeviceGetHandleByIndex_v2",
            )
            .unwrap();
        let set_clocks = *lib
            .get::<SetClocks>(b"nvmlDeviceSetGpuLockedClocks")
            .unwrap();
        let reset_clocks = *lib
            .get::<unsafe extern "C" fn(*mut c_void) -> u32>(b"nvmlDeviceResetGpuLockedClocks")
            .unwrap();
        let set_limit = *lib
            .get::<SetLimit>(b"nvmlDeviceSetPowerManagementLimit")
            .unwrap();
        let set_persistence = *lib
            .get::<SetLimit>(b"nvmlDeviceSetPersistenceMode")
            .unwrap();
        let get_limit = *lib
            .get::<unsafe extern "C" fn(*mut c_void, *mut c_uint) -> u32>(
                b"nvmlDeviceGetPowerManagementLimit",
            )
            .unwrap();
        assert_eq!(init(), 0);
        for index in 0..2 {
            let mut dev = std::ptr::null_mut();
            assert_eq!(by_index(index, &mut dev), 0);
            println!("clocks{index}={}", set_clocks(dev, 1000, 1200));
            println!("bad_clocks{index}={}", set_clocks(dev, 100, 5000));
            println!("reset{index}={}", reset_clocks(dev));
            println!("limit{index}={}", set_limit(dev, 250_000));
            println!("bad_limit{index}={}", set_limit(dev, 10_000));
            println!("persistence{index}={}", set_persistence(dev, 1));
            let mut limit = 0;
            println!("get_limit{index}={}", get_limit(dev, &mut limit));
        }
    }
    // The unprivileged can still use the GPU.
    let cuda = Cuda::load();
    assert_eq!(cuda.init(), 0);
    cuda.ctx_create(0).unwrap();
    println!("alloc={}", cuda.alloc(1 << 20).err().unwrap_or(0));
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
    let out = run_ok(fake.rerun("setters_probe").uid(65534).gid(65534));
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

    let out = run_ok(&mut fake.rerun("setters_probe"));
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

/// Child: initialize both halves and print the results.
#[test]
#[ignore = "child process of bad_config_fails_cleanly_and_says_why"]
fn init_probe() {
    assert!(in_child(), "run by bad_config_fails_cleanly_and_says_why");
    let cuda = Cuda::load();
    println!("cu_init={}", cuda.init());
    println!("cu_init_again={}", cuda.init());
    let nvml_init: unsafe extern "C" fn() -> u32 = cuda.sym("nvmlInit_v2");
    let error_string: unsafe extern "C" fn(u32) -> *const c_char = cuda.sym("nvmlErrorString");
    // SAFETY: no arguments; the string is static.
    unsafe {
        let rc = nvml_init();
        println!("nvml_init={rc}");
        println!(
            "nvml_text={}",
            std::ffi::CStr::from_ptr(error_string(rc)).to_string_lossy()
        );
    }
}

#[test]
fn bad_config_fails_cleanly_and_says_why() {
    let fake = Fake::with_config("[[device]]\nname = \"x\"\nmemory = \"8GiB\"\nmemry = 1\n");
    let mut cmd = fake.rerun("init_probe");
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
    let mut cmd = fake.rerun("init_probe");
    cmd.env("FAKEGPU_CONFIG", fake.dir.path().join("missing.toml"));
    let out = cmd.output().unwrap();
    assert_eq!(
        field(&String::from_utf8_lossy(&out.stdout), "cu_init"),
        no_device
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml: cannot read"));
}
