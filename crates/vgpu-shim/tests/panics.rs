//! A panic inside the shim (injected with `VGPU_SHIM_TEST_PANIC=<hook>:<point>`) never calls
//! the driver twice and never loses or doubles what the quota counts:
//! - after the driver allocated: the program gets the driver's answer, the allocation is
//!   counted exactly once (the simulated driver holds it once, the vGPU counter matches) and
//!   its free gives it back;
//! - before the driver: the reservation is given back and the driver is called once;
//! - after the driver freed: the bytes are given back once.

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;

use crate::common::*;

const QUOTA: u64 = 64 * MIB;
const BYTES: u64 = 4 * MIB;

struct Seen {
    /// The program's output up to "waiting".
    before: String,
    /// What the simulated driver says the process holds while it waits.
    driver_bytes: u64,
    /// The vGPU's counter while it waits.
    counted: u64,
    /// The rest of stdout, and stderr.
    after: String,
    stderr: String,
}

fn run_with_panic(point: &str) -> (Bench, Seen) {
    let bench = Bench::new(GIB, &[QUOTA]);
    let program = bench.compile("panic", &[]);
    let mut child = bench
        .shimmed(&program)
        .arg(BYTES.to_string())
        .env("VGPU_SHIM_TEST_PANIC", point)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut before = String::new();
    while !before.contains("waiting") {
        let mut line = String::new();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "exited early:\n{before}");
        before += &line;
    }
    let driver_bytes = bench.driver_states()[0].bytes_of(child.id());
    let counted = bench.usage().devices()[0].used_bytes;
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let mut after = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut after).unwrap();
    after += &String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{before}{after}\n{stderr}");
    (
        bench,
        Seen {
            before,
            driver_bytes,
            counted,
            after,
            stderr,
        },
    )
}

#[test]
fn a_panic_after_the_driver_allocated_counts_the_allocation_once() {
    let (bench, seen) = run_with_panic("cuMemAlloc_v2:after_driver");
    assert_eq!(
        field(&seen.before, "alloc"),
        "0",
        "the driver's answer:\n{}",
        seen.stderr
    );
    assert_ne!(field(&seen.before, "ptr"), "0");
    assert_eq!(seen.driver_bytes, BYTES, "the driver allocated once");
    assert_eq!(seen.counted, BYTES, "the vGPU counts it once");
    assert!(
        seen.stderr
            .contains("internal error in cuMemAlloc_v2 after the driver answered"),
        "{}",
        seen.stderr
    );
    assert_eq!(field(&seen.after, "free"), "0");
    assert_eq!(bench.usage().devices()[0].used_bytes, 0, "the free gave it back");
    assert!(bench.usage().devices()[0].peak_bytes <= BYTES);
}

#[test]
fn a_panic_before_the_driver_gives_the_reservation_back() {
    let (bench, seen) = run_with_panic("cuMemAlloc_v2:before_driver");
    // The fallback called the driver once, uncounted (the shim's failure does not fail
    // the program); the reservation made before the panic was given back.
    assert_eq!(field(&seen.before, "alloc"), "0");
    assert_eq!(seen.driver_bytes, BYTES, "the driver was called exactly once");
    assert_eq!(seen.counted, 0, "the reservation was given back");
    assert!(
        seen.stderr.contains("internal error in cuMemAlloc_v2; falling back"),
        "{}",
        seen.stderr
    );
    assert_eq!(field(&seen.after, "free"), "0", "an uncounted free reaches the driver");
    assert_eq!(bench.usage().devices()[0].used_bytes, 0);
}

#[test]
fn a_panic_after_the_driver_freed_gives_back_once() {
    let (bench, seen) = run_with_panic("cuMemFree_v2:after_driver");
    assert_eq!(field(&seen.before, "alloc"), "0");
    assert_eq!((seen.driver_bytes, seen.counted), (BYTES, BYTES));
    assert_eq!(
        field(&seen.after, "free"),
        "0",
        "the driver's answer, not a second free's"
    );
    assert!(
        seen.stderr
            .contains("internal error in cuMemFree_v2 after the driver answered"),
        "{}",
        seen.stderr
    );
    let usage = bench.usage();
    assert_eq!(usage.devices()[0].used_bytes, 0, "given back exactly once");
    assert_eq!(usage.processes()[0].used_bytes, vec![0]);
}
