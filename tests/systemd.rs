//! vgpu under a real systemd: each test boots a container whose PID 1 is systemd
//! (`systemd/container.rs`: systemd-nspawn on a root made from this machine's `/usr` and
//! `/etc`, on the host's hybrid cgroup v1 layout or on a real unified v2 tree), installs
//! vgpu in it with `install.sh` as an admin would (`systemd/installed.rs`), and acts as an
//! admin or a user would: `systemctl` on vgpu's units, `vgpu run` from a shell. The
//! container is torn down when the test ends, pass or fail (its `Drop`), leaving no
//! process, mount or cgroup behind. Needs root and `systemd-nspawn` (Debian:
//! systemd-container; `.ci/run` installs it); a container that cannot boot fails the test.
//!
//! An area of the integration harness (tests/integration.rs): each file of tests/systemd/ is
//! a module here. This area: `cargo test --test integration systemd::`; one file's tests:
//! `cargo test --test integration systemd::watch_unit::`.


#[path = "systemd/container.rs"]
mod container;
#[path = "systemd/installed.rs"]
mod installed;

#[path = "systemd/harness.rs"]
mod harness;
#[path = "systemd/watch_unit.rs"]
mod watch_unit;
#[path = "systemd/workload_unit.rs"]
mod workload_unit;
#[path = "systemd/scope.rs"]
mod scope;
#[path = "systemd/unified.rs"]
mod unified;
#[path = "systemd/service_unit.rs"]
mod service_unit;
#[path = "systemd/carbon_timer.rs"]
mod carbon_timer;
#[path = "systemd/uninstall.rs"]
mod uninstall;
