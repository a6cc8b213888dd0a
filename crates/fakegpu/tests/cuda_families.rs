//! The API families real programs use, as clients see them (the probes `fam_*` of
//! `examples/fakegpu_probe.rs`, in `examples/fakegpu_probe/families.rs`): memory pools,
//! stream and context queries, IPC between processes, libraries and kernels, pointer
//! attributes, function attributes and occupancy, copies and fills. The parent checks
//! what other processes see: the shared state and NVML.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::common::{field, run_ok, Fake, Holder};

const GIB: u64 = 1 << 30;

#[test]
fn memory_pools() {
    let fake = Fake::new();
    run_ok(&mut fake.probe("fam_mempool"));
    // The pool's memory was on the device: 192 MiB at the most (3 × 64 MiB, then reused).
    assert_eq!(fake.states()[0].peak(), 192 << 20);
    assert_eq!(fake.states()[0].used(), 0);
}

#[test]
fn stream_and_context_queries() {
    let fake = Fake::new();
    run_ok(&mut fake.probe("fam_queries"));
}

#[test]
fn libraries_and_kernels() {
    let fake = Fake::new();
    let out = run_ok(fake.probe("fam_library").env("FAKEGPU_KERNELS", "k=50ms"));
    for what in ["kernel", "function", "module_function"] {
        let ms: f64 = field(&out, &format!("{what}_ms")).parse().unwrap();
        assert!(ms >= 50.0, "{what}: {ms} ms");
    }
    // Three launches of one block each.
    assert_eq!(fake.states()[0].launches(), 3);
}

#[test]
fn pointer_attributes() {
    let fake = Fake::new();
    run_ok(&mut fake.probe("fam_pointer"));
}

#[test]
fn function_attributes_and_occupancy() {
    let fake = Fake::new();
    run_ok(&mut fake.probe("fam_occupancy"));
}

#[test]
fn copies_and_fills() {
    let fake = Fake::with_config(
        "[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\n\
         copy_gbps = 10\ndevice_copy_gbps = 100\n",
    );
    let out = run_ok(&mut fake.probe("fam_copies"));
    let htod: f64 = field(&out, "htod_ms").parse().unwrap();
    assert!(htod >= GIB as f64 / 10.0 / 1e6, "{htod}");
    let state = &fake.states()[0];
    assert_eq!(state.launches(), 0, "copies are not kernels");
    assert_eq!(state.used(), 0);
}

#[test]
fn bad_copy_rates_are_config_errors() {
    for bad in [
        "copy_gbps = 0",
        "device_copy_gbps = -1",
        "copy_gbps = \"fast\"",
    ] {
        let toml = format!("[[device]]\nname = \"x\"\nmemory = \"1GiB\"\n{bad}\n");
        let err = fakegpu::config::parse(&toml, "test")
            .unwrap_err()
            .to_string();
        let key = bad.split(' ').next().unwrap();
        assert!(err.contains(key), "{bad}: {err}");
    }
}

/// Exporter holds 1 GiB; the importer maps it; NVML in a third process sees 1 GiB, not 2.
#[test]
fn ipc_memory_is_counted_once_and_events_are_shared() {
    let fake = Fake::new();
    let mut exporter = Holder::spawn(
        fake.probe("fam_ipc_exporter")
            .env("FAKEGPU_KERNELS", "long=2s"),
    );
    let mem = exporter_field(&exporter, "mem_handle");
    let event = exporter_field(&exporter, "event_handle");
    let importer = Holder::spawn(
        fake.probe("fam_ipc_importer")
            .env("FAM_MEM_HANDLE", &mem)
            .env("FAM_EVENT_HANDLE", &event),
    );
    assert_eq!(holder_field(&importer, "used"), GIB.to_string());
    let wait_ms: u64 = holder_field(&importer, "event_wait_ms").parse().unwrap();
    println!("importer waited {wait_ms} ms for the exporter's event");
    let nvml = run_ok(&mut fake.probe("nvml_memory"));
    assert_eq!(field(&nvml, "used"), GIB.to_string(), "counted once");
    assert_eq!(fake.states()[0].used(), GIB);
    importer.finish();
    assert_eq!(
        fake.states()[0].used(),
        GIB,
        "closing the mapping frees nothing"
    );

    // Freed by the exporter: the handle no longer opens.
    writeln!(exporter.child.stdin.as_mut().unwrap(), "free").unwrap();
    wait_for(|| fake.states()[0].used() == 0);
    let out = run_ok(
        fake.probe("fam_ipc_importer")
            .env("FAM_MEM_HANDLE", &mem)
            .env("FAM_EXPECT", "400"), // CUDA_ERROR_INVALID_HANDLE
    );
    assert_eq!(field(&out, "open"), "400");
    exporter.finish();

    // A dead exporter's handle does not open either.
    let exporter = Holder::spawn(&mut fake.probe("fam_ipc_exporter"));
    let mem = exporter_field(&exporter, "mem_handle");
    exporter.kill();
    let out = run_ok(
        fake.probe("fam_ipc_importer")
            .env("FAM_MEM_HANDLE", &mem)
            .env("FAM_EXPECT", "400"),
    );
    assert_eq!(field(&out, "open"), "400");
}

fn holder_field(holder: &Holder, key: &str) -> String {
    field(&holder.output.join("\n"), key).to_string()
}

fn exporter_field(holder: &Holder, key: &str) -> String {
    holder_field(holder, key)
}

fn wait_for(done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "timed out");
        std::thread::sleep(Duration::from_millis(10));
    }
}
