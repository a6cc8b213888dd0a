//! Allocation is one atomic step across processes: processes racing for the last bytes of a
//! device never push its usage past the device size, at any instant (the peak proves it).
//! The racers are the `grabber` probe of `examples/fakegpu_probe.rs`: each grabs 512 MiB
//! blocks until OOM and frees them, 50 rounds, and prints how many it held at most.

use crate::common::{field, Fake};

const GIB: u64 = 1 << 30;

#[test]
fn racing_processes_never_exceed_the_device() {
    let fake =
        Fake::with_config("[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"4GiB\"\n");
    let state = &fake.states()[0];
    let children: Vec<_> = (0..4)
        .map(|_| {
            fake.probe("grabber")
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn grabber")
        })
        .collect();
    let mut total_most = 0;
    for child in children {
        let out = child.wait_with_output().expect("wait for grabber");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        total_most += field(&String::from_utf8_lossy(&out.stdout), "most")
            .parse::<u64>()
            .unwrap();
    }
    assert!(total_most >= 8, "the device was filled at some point");
    assert_eq!(state.used(), 0);
    assert_eq!(
        state.peak(),
        4 * GIB,
        "usage reached the device size and never went past it"
    );
}
