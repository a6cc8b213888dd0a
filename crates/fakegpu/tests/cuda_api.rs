//! The CUDA driver API as a client sees it, in child processes that `dlopen("libcuda.so.1")`
//! through LD_LIBRARY_PATH: initialization and context rules, every allocation path and
//! what it charges, frees, OOM, launches. The client's own checks are the probes of
//! `examples/fakegpu_probe.rs` of the same names; the parent checks the shared state
//! afterwards.

use crate::common::{run_ok, Fake};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

#[test]
fn initialization_and_context_rules() {
    let fake = Fake::new();
    run_ok(&mut fake.probe("init_and_context_rules"));
}

#[test]
fn linear_allocations_charge_exactly_and_free_exactly() {
    let fake = Fake::new();
    run_ok(&mut fake.probe("linear_allocations"));
    assert_eq!(fake.states()[0].peak(), GIB + 100 + 3 * MIB);
}

#[test]
fn async_pool_vmm_and_array_paths() {
    let fake = Fake::new();
    run_ok(&mut fake.probe("async_pool_vmm_arrays"));
}

#[test]
fn launches_are_counted_and_synchronize_waits() {
    let fake = Fake::new();
    run_ok(&mut fake.probe("launches"));
    let state = &fake.states()[0];
    assert_eq!(state.launches(), 20);
    assert_eq!(state.used(), 0);
    assert!(
        state.processes().is_empty(),
        "the exited child left no slot"
    );
}

/// A process that exits without freeing gives its memory back, as with the real driver.
#[test]
fn exit_without_free_gives_memory_back() {
    let fake = Fake::new();
    run_ok(&mut fake.probe("exit_without_free"));
    let state = &fake.states()[0];
    assert_eq!((state.used(), state.peak()), (0, 2 * GIB));
}
