//! (c) nvml-wrapper, which `dlopen`s "libnvidia-ml.so.1", reads the fake: identity, memory,
//! clocks, power and energy, utilization and processes, and (as root) changes clocks and the
//! power limit, which then shows in the clock and power readings. The client's checks are
//! the `nvml_wrapper` probe of `examples/fakegpu_probe.rs`; the parent checks what persists.

use crate::common::{field, run_ok, Fake};

#[test]
fn nvml_wrapper_reads_and_controls_the_fake() {
    let fake = Fake::new();
    let out = run_ok(&mut fake.probe("nvml_wrapper"));
    let state = &fake.states()[0];
    assert_eq!(field(&out, "uuid"), fake.config().devices[0].uuid);
    // Settings persist in the shared state for every process.
    assert_eq!(state.power_limit_mw(), Some(300_000));
    assert_eq!(state.locked_clocks(), None);
    assert_eq!(state.used(), 0);
}
