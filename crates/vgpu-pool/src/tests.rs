//! The pool's behaviour end to end (pure): the document's examples, allocation,
//! preemption, resumption, persistence; then property tests over random histories.

use super::config::{DeclaredDevice, PoolConfig};
use super::inventory::tests::node0;
use super::*;

fn declared(kind: DeviceKind, name: &str, tflops: f64) -> DeclaredDevice {
    DeclaredDevice { kind, name: name.into(), tflops, id: None, env: None }
}

fn pool_of(devices: &[(DeviceKind, f64)]) -> Pool {
    let config = PoolConfig {
        devices: devices.iter().enumerate().map(|(i, &(k, t))| declared(k, &format!("{k}{i}"), t)).collect(),
        ..PoolConfig::default()
    };
    Pool::new(Inventory::build(&[], &config).unwrap())
}

fn prio(p: i64) -> Priority {
    Priority::new(p).unwrap()
}

fn request(id: &str, blocks: u64, priority: i64, kind: KindFilter) -> Request {
    Request::new(id, format!("{id}-cmd"), blocks, prio(priority), kind)
}

/// `vgpu run`: admit and record (all freezes succeed).
fn run(pool: &mut Pool, id: &str, blocks: u64, priority: i64) -> Plan {
    let plan = pool.admit(&request(id, blocks, priority, KindFilter::Any)).unwrap();
    pool.apply(plan.clone()).unwrap();
    plan
}

/// A workload exits: release, then settle.
fn exit(pool: &mut Pool, id: &str) -> Plan {
    pool.release(id).unwrap();
    let plan = pool.settle();
    pool.apply(plan.clone()).unwrap();
    plan
}

fn ranges(pool: &Pool, id: &str) -> Vec<[u64; 2]> {
    pool.view().allocations.into_iter().find(|a| a.id == id).map(|a| a.ranges).unwrap_or_default()
}

fn state(pool: &Pool, id: &str) -> AllocState {
    pool.allocation(id).unwrap().state
}

fn ids(workloads: &[WorkloadRef]) -> Vec<&str> {
    workloads.iter().map(|w| w.id.as_str()).collect()
}

fn suspended_ids(plan: &Plan) -> Vec<&str> {
    plan.suspend().iter().map(|s| s.id.as_str()).collect()
}

// ---- the design document's examples ----

#[test]
fn compaction_example_from_the_document() {
    let mut pool = pool_of(&[(DeviceKind::Gpu, 10.0)]);
    run(&mut pool, "app1", 3, 50);
    run(&mut pool, "app2", 3, 50);
    run(&mut pool, "app3", 2, 50);
    assert_eq!(ranges(&pool, "app1"), [[1, 3]]);
    assert_eq!(ranges(&pool, "app2"), [[4, 6]]);
    assert_eq!(ranges(&pool, "app3"), [[7, 8]]);
    assert_eq!(pool.view().free, [[9, 10]]);

    exit(&mut pool, "app1");
    run(&mut pool, "app4", 4, 50);
    assert_eq!(ranges(&pool, "app2"), [[1, 3]]);
    assert_eq!(ranges(&pool, "app3"), [[4, 5]]);
    assert_eq!(ranges(&pool, "app4"), [[6, 9]]);
    assert_eq!(pool.view().free, [[10, 10]]);
}

/// Free `id`'s blocks without compacting (the document's "blocks go back to the free
/// queue"), leaving a hole where they were.
fn leave_hole_of(pool: &mut Pool, id: &str) {
    let seq = pool.allocation(id).unwrap().seq;
    pool.map.device_mut(0).release(seq);
    pool.allocations.remove(&seq);
    pool.by_id.remove(id);
}

#[test]
fn compaction_example_step_by_step() {
    // The document's order of events: app1's blocks go back to the free queue (a hole at
    // 1–3), app4 arrives, and the allocations are compacted to make room for it.
    let mut pool = pool_of(&[(DeviceKind::Gpu, 10.0)]);
    for (id, n) in [("app1", 3), ("app2", 3), ("app3", 2)] {
        run(&mut pool, id, n, 50);
    }
    leave_hole_of(&mut pool, "app1");
    assert_eq!(pool.view().free, [[1, 3], [9, 10]]);
    assert!(!pool.map.is_compact());

    run(&mut pool, "app4", 4, 50);
    assert_eq!(ranges(&pool, "app2"), [[1, 3]]);
    assert_eq!(ranges(&pool, "app3"), [[4, 5]]);
    assert_eq!(ranges(&pool, "app4"), [[6, 9]]);
    assert_eq!(pool.view().free, [[10, 10]]);
}

#[test]
fn pool_compact_relabels_and_is_idempotent() {
    let mut pool = pool_of(&[(DeviceKind::Gpu, 10.0)]);
    for (id, n) in [("app1", 3), ("app2", 3), ("app3", 2)] {
        run(&mut pool, id, n, 50);
    }
    leave_hole_of(&mut pool, "app1");
    assert!(pool.compact());
    assert_eq!(ranges(&pool, "app2"), [[1, 3]]);
    assert_eq!(ranges(&pool, "app3"), [[4, 5]]);
    assert_eq!(pool.view().free, [[6, 10]]);
    assert!(!pool.compact());
}

#[test]
fn spec_node0_fifty_blocks_are_one_to_fifty() {
    let mut pool = Pool::new(node0());
    assert_eq!(pool.total_blocks(), 63);
    let plan = run(&mut pool, "big", 50, 50);
    let shares: Vec<(usize, u64)> = plan.granted().unwrap().shares.iter().map(|s| (s.device, s.blocks)).collect();
    assert_eq!(shares, [(0, 8), (1, 10), (2, 20), (3, 12)]);
    assert_eq!(ranges(&pool, "big"), [[1, 50]]);
    let view = pool.view();
    assert_eq!(view.free, [[51, 63]]);
    let regions: Vec<(DeviceKind, u64, u64)> = view.regions.iter().map(|r| (r.kind, r.first, r.last)).collect();
    assert_eq!(regions, [(DeviceKind::Gpu, 1, 18), (DeviceKind::Npu, 19, 38), (DeviceKind::Fpga, 39, 63)]);
}

// ---- allocation ----

#[test]
fn best_fit_prefers_the_tightest_single_device() {
    let mut pool = pool_of(&[(DeviceKind::Gpu, 10.0), (DeviceKind::Gpu, 6.0), (DeviceKind::Gpu, 8.0)]);
    let plan = run(&mut pool, "a", 5, 50);
    assert_eq!(plan.granted().unwrap().shares, [Share { device: 1, blocks: 5 }]);
    assert_eq!(ranges(&pool, "a"), [[11, 15]]);
    let plan = run(&mut pool, "b", 1, 50);
    assert_eq!(plan.granted().unwrap().shares, [Share { device: 1, blocks: 1 }], "the 1-block gap fits best");
    let plan = run(&mut pool, "c", 7, 50);
    assert_eq!(plan.granted().unwrap().shares, [Share { device: 2, blocks: 7 }]);
}

#[test]
fn requests_span_devices_when_no_single_one_fits() {
    // A stretch of the numbering across a boundary: device 0's free tail and device 1.
    let mut pool = pool_of(&[(DeviceKind::Gpu, 4.0), (DeviceKind::Gpu, 4.0)]);
    run(&mut pool, "a", 2, 50);
    let plan = run(&mut pool, "b", 5, 50);
    assert_eq!(plan.granted().unwrap().shares, [Share { device: 0, blocks: 2 }, Share { device: 1, blocks: 3 }]);
    assert_eq!(ranges(&pool, "b"), [[3, 7]]);

    // Scattered free blocks: the devices with the most free first.
    let mut pool = pool_of(&[(DeviceKind::Gpu, 4.0), (DeviceKind::Gpu, 4.0), (DeviceKind::Gpu, 4.0)]);
    run(&mut pool, "x", 3, 50); // device 0 (all tie: the first)
    run(&mut pool, "y", 2, 50); // device 1: 1 free on device 0 is too little
    run(&mut pool, "z", 2, 50); // device 1, best fit
                                // Free: device 0 has 1, device 2 has 4.
    let plan = run(&mut pool, "w", 5, 50);
    assert_eq!(plan.granted().unwrap().shares, [Share { device: 0, blocks: 1 }, Share { device: 2, blocks: 4 }]);
    assert_eq!(ranges(&pool, "w"), [[4, 4], [9, 12]]);
    assert_eq!(pool.free_blocks(), 0);
}

#[test]
fn kind_restricts_the_devices() {
    let mut pool = Pool::new(node0());
    let plan = pool.admit(&request("n", 5, 50, KindFilter::Only(DeviceKind::Npu))).unwrap();
    assert_eq!(plan.granted().unwrap().shares, [Share { device: 2, blocks: 5 }]);
    pool.apply(plan).unwrap();
    assert_eq!(ranges(&pool, "n"), [[19, 23]]);
    // 18 GPU blocks over two GPUs of 8 and 10.
    let plan = pool.admit(&request("g", 18, 50, KindFilter::Only(DeviceKind::Gpu))).unwrap();
    assert_eq!(plan.granted().unwrap().shares, [Share { device: 0, blocks: 8 }, Share { device: 1, blocks: 10 }]);
}

#[test]
fn a_request_above_the_pool_is_refused_with_its_size() {
    let pool = Pool::new(node0());
    let err = pool.admit(&request("x", 64, 100, KindFilter::Any)).unwrap_err();
    assert_eq!(err, PoolError::TooLarge { requested: 64, available: 63, total: 63, kind: KindFilter::Any });
    assert!(err.to_string().contains("63 blocks"), "{err}");
    assert!(err.is_usage());
    let err = pool.admit(&request("x", 19, 100, KindFilter::Only(DeviceKind::Gpu))).unwrap_err();
    assert!(matches!(err, PoolError::TooLarge { available: 18, total: 63, .. }), "{err:?}");
    // Too large even with nothing running: refused at once, not queued.
    let mut pool = pool;
    assert!(matches!(pool.enqueue(&request("x", 64, 100, KindFilter::Any)), Err(PoolError::TooLarge { .. })));
    let empty = pool_of(&[]);
    assert!(matches!(empty.admit(&request("x", 1, 50, KindFilter::Any)), Err(PoolError::TooLarge { total: 0, .. })));
}

#[test]
fn bad_requests_are_typed_errors() {
    let mut pool = pool_of(&[(DeviceKind::Gpu, 10.0)]);
    assert!(matches!(pool.admit(&request("x", 0, 50, KindFilter::Any)), Err(PoolError::InvalidTflops(_))));
    run(&mut pool, "x", 1, 50);
    assert_eq!(
        pool.admit(&request("x", 1, 50, KindFilter::Any)).unwrap_err(),
        PoolError::DuplicateWorkload("x".into())
    );
    assert_eq!(pool.release("nobody").unwrap_err(), PoolError::UnknownWorkload("nobody".into()));
    assert!(matches!(
        Request::for_tflops("y", "y", f64::NAN, 1.0, Priority::DEFAULT, KindFilter::Any),
        Err(PoolError::InvalidTflops(_))
    ));
}

// ---- resize (`vgpu update --tflops`) ----

/// `vgpu update --tflops`: resize and record (all freezes succeed).
fn resize(pool: &mut Pool, id: &str, blocks: u64) -> Plan {
    let plan = pool.resize(id, blocks).unwrap();
    pool.apply(plan.clone()).unwrap();
    plan
}

fn shares_of(pool: &Pool, id: &str) -> Vec<(usize, u64)> {
    pool.allocation(id).unwrap().shares.iter().map(|s| (s.device, s.blocks)).collect()
}

#[test]
fn a_raise_takes_free_blocks_on_its_own_devices_only() {
    let mut pool = pool_of(&[(DeviceKind::Gpu, 10.0), (DeviceKind::Gpu, 10.0)]);
    run(&mut pool, "a", 4, 50);
    let plan = resize(&mut pool, "a", 9);
    assert!(plan.suspend().is_empty() && plan.granted().is_none());
    assert_eq!(shares_of(&pool, "a"), [(0, 9)]);
    assert_eq!(pool.allocation("a").unwrap().blocks, 9);
    assert_eq!(ranges(&pool, "a"), [[1, 9]]);
    // Device 1 is wholly free, but "a" runs on device 0 only.
    let err = pool.resize("a", 11).unwrap_err();
    assert!(matches!(err, PoolError::ResizeTooLarge { requested: 11, available: 10, .. }), "{err:?}");
    assert!(err.is_usage());
    pool.check().unwrap();
}

#[test]
fn a_lower_gives_blocks_back_and_settles_in_the_same_plan() {
    let mut pool = pool_of(&[(DeviceKind::Gpu, 10.0)]);
    run(&mut pool, "big", 8, 50);
    run(&mut pool, "low", 2, 10);
    pool.enqueue(&request("waiter", 4, 50, KindFilter::Any)).unwrap();
    let plan = resize(&mut pool, "big", 4);
    assert_eq!(ids(plan.start()), ["waiter"]);
    assert_eq!(shares_of(&pool, "big"), [(0, 4)]);
    assert_eq!(state(&pool, "waiter"), AllocState::Running);
    pool.check().unwrap();
    // Never below one block per device it runs on.
    let err = pool.resize("big", 0).unwrap_err();
    assert!(matches!(err, PoolError::ResizeBelowDevices { devices: 1, requested: 0, .. }), "{err:?}");
    assert!(err.is_usage());
    assert!(pool.resize("big", 4).unwrap().is_empty(), "the same size plans nothing");
}

#[test]
fn a_raise_preempts_strictly_lower_priority_only_and_a_lower_resumes_it() {
    let mut pool = pool_of(&[(DeviceKind::Gpu, 10.0)]);
    run(&mut pool, "train", 4, 50);
    run(&mut pool, "low", 6, 10);
    let plan = resize(&mut pool, "train", 8);
    assert_eq!(suspended_ids(&plan), ["low"]);
    assert_eq!(plan.suspend()[0].by, "train");
    assert_eq!(state(&pool, "low"), AllocState::Suspended);
    assert_eq!(shares_of(&pool, "train"), [(0, 8)]);
    let plan = resize(&mut pool, "train", 4);
    assert_eq!(ids(plan.resume()), ["low"]);
    assert_eq!(state(&pool, "low"), AllocState::Running);
    pool.check().unwrap();
}

#[test]
fn a_raise_against_equal_or_higher_priority_is_refused_naming_them() {
    let mut pool = pool_of(&[(DeviceKind::Gpu, 10.0)]);
    run(&mut pool, "train", 4, 50);
    run(&mut pool, "peer", 6, 50);
    let before = pool.clone();
    let err = pool.resize("train", 6).unwrap_err();
    match &err {
        PoolError::NoRoom { requested: 2, free: 0, holders } => {
            assert_eq!(holders.iter().map(|h| h.id.as_str()).collect::<Vec<_>>(), ["peer"]);
        }
        other => panic!("{other:?}"),
    }
    assert!(!err.is_usage());
    assert_eq!(pool, before);
    assert!(matches!(pool.resize("nosuch", 2), Err(PoolError::UnknownWorkload(_))));
    // Not running: refused.
    let mut pool = pool_of(&[(DeviceKind::Gpu, 10.0)]);
    run(&mut pool, "low", 8, 10);
    run(&mut pool, "high", 5, 90);
    assert!(matches!(pool.resize("low", 2), Err(PoolError::NotRunning { .. })));
}

// ---- preemption ----

#[test]
fn preemption_suspends_lower_priority_and_resumes_it_after() {
    let mut pool = pool_of(&[(DeviceKind::Gpu, 10.0)]);
    run(&mut pool, "low", 8, 10);
    let plan = run(&mut pool, "high", 5, 90);
    assert_eq!(
        plan.suspend(),
        [Suspension { id: "low".into(), name: "low-cmd".into(), priority: prio(10), blocks: 8, by: "high".into() }]
    );
    assert_eq!(state(&pool, "low"), AllocState::Suspended);
    assert_eq!(pool.allocation("low").unwrap().preempted_by.as_deref(), Some("high"));
    assert_eq!(ranges(&pool, "high"), [[1, 5]]);
    assert_eq!(pool.view().free, [[6, 10]]);
    // 5 free, but "low" needs 8: it stays suspended.
    assert!(pool.settle().is_empty());

    let plan = exit(&mut pool, "high");
    assert_eq!(ids(plan.resume()), ["low"]);
    assert!(plan.suspend().is_empty());
    assert_eq!(state(&pool, "low"), AllocState::Running);
    assert_eq!(pool.allocation("low").unwrap().preempted_by, None);
    assert_eq!(ranges(&pool, "low"), [[1, 8]]);
}

#[test]
fn equal_priority_is_never_preempted_and_the_refusal_names_the_holder() {
    let mut pool = pool_of(&[(DeviceKind::Gpu, 10.0)]);
    run(&mut pool, "train", 8, 50);
    let err = pool.admit(&request("other", 5, 50, KindFilter::Any)).unwrap_err();
    match &err {
        PoolError::NoRoom { requested: 5, free: 2, holders } => {
            assert_eq!(holders.len(), 1);
            assert_eq!(holders[0].id, "train");
            assert_eq!(holders[0].blocks, 8);
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("train-cmd (train, priority 50, 8 blocks)"), "{err}");
    assert!(!err.is_usage());
}

#[test]
fn preemption_takes_the_smallest_set_lowest_priority_first_then_youngest() {
    let setup = || {
        let mut pool = pool_of(&[(DeviceKind::Gpu, 10.0)]);
        run(&mut pool, "a", 3, 10); // older
        run(&mut pool, "b", 3, 10); // younger
        run(&mut pool, "c", 4, 20);
        pool
    };
    let pool = setup();
    let victims = |n: u64| -> Vec<String> {
        let plan = pool.admit(&request("r", n, 50, KindFilter::Any)).unwrap();
        plan.suspend().iter().map(|s| s.id.clone()).collect()
    };
    assert_eq!(victims(3), ["b"], "the younger of the lowest priority");
    assert_eq!(victims(6), ["b", "a"]);
    // 4 blocks: c alone would do, but a and b rank lower.
    assert_eq!(victims(4), ["b", "a"]);
    // 7 blocks: c must go; with it, b suffices and the older a keeps running.
    assert_eq!(victims(7), ["b", "c"]);
    assert_eq!(victims(10), ["b", "a", "c"]);
    // Strictly lower only: at priority 10 nobody can be preempted; at 20 only a and b.
    assert!(matches!(pool.admit(&request("r", 1, 10, KindFilter::Any)), Err(PoolError::NoRoom { .. })));
    assert!(matches!(pool.admit(&request("r", 7, 20, KindFilter::Any)), Err(PoolError::NoRoom { .. })));
    let plan = pool.admit(&request("r", 6, 20, KindFilter::Any)).unwrap();
    assert_eq!(suspended_ids(&plan), ["b", "a"]);
}

#[test]
fn preemption_prefers_one_device_with_the_least_important_victims() {
    let mut pool = pool_of(&[(DeviceKind::Gpu, 6.0), (DeviceKind::Gpu, 6.0)]);
    run(&mut pool, "p30", 6, 30); // device 0
    run(&mut pool, "p20", 6, 20); // device 1
    let plan = pool.admit(&request("r", 4, 90, KindFilter::Any)).unwrap();
    assert_eq!(suspended_ids(&plan), ["p20"]);
    assert_eq!(plan.granted().unwrap().shares, [Share { device: 1, blocks: 4 }]);
    // Larger than either device: spans, preempting both.
    let plan = pool.admit(&request("r", 8, 90, KindFilter::Any)).unwrap();
    assert_eq!(suspended_ids(&plan), ["p20", "p30"]);
    assert_eq!(plan.granted().unwrap().held(), 8);
}

#[test]
fn planning_changes_nothing_so_a_failed_freeze_rolls_back() {
    let mut pool = pool_of(&[(DeviceKind::Gpu, 10.0)]);
    run(&mut pool, "low", 8, 10);
    let before = serde_json::to_string(&pool).unwrap();
    let plan = pool.admit(&request("high", 5, 90, KindFilter::Any)).unwrap();
    // The caller's freeze of "low" fails: it drops the plan.
    drop(plan);
    assert_eq!(serde_json::to_string(&pool).unwrap(), before);
    assert_eq!(state(&pool, "low"), AllocState::Running);
    // A plan made before a change is refused.
    let plan = pool.admit(&request("high", 5, 90, KindFilter::Any)).unwrap();
    run(&mut pool, "tiny", 1, 50);
    assert_eq!(pool.apply(plan), Err(PoolError::StalePlan));
    assert_eq!(state(&pool, "low"), AllocState::Running);
}

// ---- resumption ----

#[test]
fn resume_highest_priority_first_each_only_when_it_fits() {
    let mut pool = pool_of(&[(DeviceKind::Gpu, 10.0)]);
    run(&mut pool, "a40", 8, 40);
    run(&mut pool, "b30", 2, 30);
    let plan = run(&mut pool, "h90", 10, 90);
    assert_eq!(suspended_ids(&plan), ["b30", "a40"]);
    // A newcomer that cannot preempt the 90 queues.
    let err = pool.admit(&request("c35", 3, 35, KindFilter::Any)).unwrap_err();
    assert!(matches!(err, PoolError::NoRoom { .. }));
    pool.enqueue(&request("c35", 3, 35, KindFilter::Any)).unwrap();
    assert_eq!(state(&pool, "c35"), AllocState::Waiting);
    assert!(pool.settle().is_empty());

    let plan = exit(&mut pool, "h90");
    // a40 first (8 of 10); c35 needs 3 of the 2 left and may not preempt b30 (suspended, not
    // running); b30 fits in the 2.
    assert_eq!(ids(plan.resume()), ["a40", "b30"]);
    assert!(plan.start().is_empty());
    assert_eq!(state(&pool, "c35"), AllocState::Waiting);
    assert_eq!(pool.free_blocks(), 0);

    // When b30 exits, c35 (35) still lacks a block: 2 free, and a40 ranks above it.
    let plan = exit(&mut pool, "b30");
    assert!(plan.is_empty());
    let plan = exit(&mut pool, "a40");
    assert_eq!(ids(plan.start()), ["c35"]);
    assert_eq!(state(&pool, "c35"), AllocState::Running);
}

#[test]
fn resuming_may_preempt_strictly_lower_priority_work() {
    let mut pool = pool_of(&[(DeviceKind::Gpu, 10.0)]);
    run(&mut pool, "l10", 8, 10);
    run(&mut pool, "h90", 5, 90); // suspends l10
    run(&mut pool, "m5", 5, 5); // the 5 free blocks
    let plan = exit(&mut pool, "h90");
    // l10 outranks m5: 5 free + m5's 5 make its 8.
    assert_eq!(suspended_ids(&plan), ["m5"]);
    assert_eq!(plan.suspend()[0].by, "l10");
    assert_eq!(ids(plan.resume()), ["l10"]);
    assert_eq!(state(&pool, "m5"), AllocState::Suspended);
    assert_eq!(state(&pool, "l10"), AllocState::Running);
}

#[test]
fn a_suspended_workload_resumes_on_its_own_devices() {
    let mut pool = pool_of(&[(DeviceKind::Gpu, 4.0), (DeviceKind::Gpu, 4.0)]);
    run(&mut pool, "low", 4, 10); // device 0
    run(&mut pool, "high", 4, 90); // device 1
    run(&mut pool, "top", 4, 95); // preempts low on device 0
    assert_eq!(state(&pool, "low"), AllocState::Suspended);
    // Device 1 frees up, but low's process lives on device 0.
    let plan = exit(&mut pool, "high");
    assert!(plan.resume().is_empty());
    let plan = exit(&mut pool, "top");
    assert_eq!(ids(plan.resume()), ["low"]);
    assert_eq!(pool.allocation("low").unwrap().shares, [Share { device: 0, blocks: 4 }]);
}

// ---- what the workload is handed ----

#[test]
fn gpu_compute_share_is_blocks_over_device_blocks() {
    let gpus = [
        NvmlGpu { index: 0, uuid: "GPU-aaa".into(), name: "NVIDIA L4".into() },
        NvmlGpu { index: 1, uuid: "GPU-bbb".into(), name: "NVIDIA A100-SXM4-40GB".into() },
    ];
    let config = PoolConfig {
        devices: vec![DeclaredDevice {
            kind: DeviceKind::Npu,
            name: "Ascend 910B".into(),
            tflops: 20.0,
            id: Some("3".into()),
            env: Some("ASCEND_RT_VISIBLE_DEVICES".into()),
        }],
        ..PoolConfig::default()
    };
    let mut pool = Pool::new(Inventory::build(&gpus, &config).unwrap());
    let plan = pool.admit(&request("w", 30, 50, KindFilter::Only(DeviceKind::Gpu))).unwrap();
    pool.apply(plan).unwrap();
    let shares = pool.gpu_shares("w");
    assert_eq!(shares.len(), 1);
    assert_eq!(shares[0].device.uuid(), Some("GPU-aaa"), "best fit: the L4 (121 blocks) over the A100 (312)");
    assert!((shares[0].percent() - 30.0 * 100.0 / 121.0).abs() < 1e-9);
    assert_eq!(shares[0].compute_percent(), 25);
    assert!(pool.declared_env("w").is_empty());

    let plan = pool.admit(&request("n", 2, 50, KindFilter::Only(DeviceKind::Npu))).unwrap();
    pool.apply(plan).unwrap();
    assert!(pool.gpu_shares("n").is_empty());
    assert_eq!(pool.declared_env("n"), [("ASCEND_RT_VISIBLE_DEVICES".to_string(), "3".to_string())]);
    assert_eq!(pool.shares("n")[0].compute_percent(), 10);
}

// ---- persistence ----

#[test]
fn the_pool_survives_json_and_a_damaged_file_is_an_error() {
    let mut pool = Pool::new(node0());
    run(&mut pool, "a", 30, 10);
    run(&mut pool, "b", 40, 90);
    pool.enqueue(&request("c", 60, 20, KindFilter::Any)).unwrap();
    let text = serde_json::to_string(&pool).unwrap();
    let back: Pool = serde_json::from_str(&text).unwrap();
    assert_eq!(back, pool);
    assert_eq!(back.allocation("c").unwrap().state, AllocState::Waiting);

    let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
    value["map"][0][0]["len"] = serde_json::json!(7);
    let err = serde_json::from_value::<Pool>(value).unwrap_err().to_string();
    assert!(err.contains("damaged pool state"), "{err}");
    let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
    value["allocations"][0]["priority"] = serde_json::json!(500);
    assert!(serde_json::from_value::<Pool>(value).is_err());
}

#[test]
fn counts_that_overflow_are_a_damaged_file_not_a_panic() {
    // Found by fuzzing (`pool_state`): each of these overflowed a u64 sum in `check`.
    let mut pool = pool_of(&[(DeviceKind::Gpu, 4.0), (DeviceKind::Npu, 4.0)]);
    run(&mut pool, "a", 2, 10);
    pool.enqueue(&request("w", 60, 20, KindFilter::Any)).unwrap_err();
    let text = serde_json::to_string(&pool).unwrap();
    let damaged = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
        edit(&mut value);
        let err = serde_json::from_value::<Pool>(value).unwrap_err().to_string();
        assert!(err.contains("damaged pool state"), "{err}");
        err
    };
    let huge = serde_json::json!(u64::MAX);
    let err = damaged(&|v| v["inventory"]["devices"][0]["blocks"] = huge.clone());
    assert!(err.contains("more than can be numbered"), "{err}");
    let err = damaged(&|v| {
        v["map"][0][1]["len"] = huge.clone();
        v["map"][0].as_array_mut().unwrap().push(serde_json::json!({"len": 2, "owner": null}));
    });
    assert!(err.contains("more than can be counted"), "{err}");
    let err = damaged(&|v| {
        let share = v["allocations"][0]["shares"][0].clone();
        let mut second = share.clone();
        second["device"] = serde_json::json!(1);
        second["blocks"] = huge.clone();
        v["allocations"][0]["shares"] = serde_json::json!([share, second]);
    });
    assert!(err.contains("more than can be counted"), "{err}");
    // A pool whose counters cannot grow would overflow at its next change.
    damaged(&|v| v["next_seq"] = huge.clone());
    damaged(&|v| v["generation"] = huge.clone());
}

#[test]
fn the_json_view_has_ranges_as_pairs() {
    let mut pool = pool_of(&[(DeviceKind::Gpu, 10.0)]);
    run(&mut pool, "app1", 3, 50);
    let json = serde_json::to_value(pool.view()).unwrap();
    assert_eq!(json["allocations"][0]["id"], "app1");
    assert_eq!(json["allocations"][0]["state"], "running");
    assert_eq!(json["allocations"][0]["priority"], 50);
    assert_eq!(json["allocations"][0]["ranges"], serde_json::json!([[1, 3]]));
    assert_eq!(json["free"], serde_json::json!([[4, 10]]));
    assert_eq!(json["regions"][0]["kind"], "gpu");
}

#[test]
fn a_new_inventory_keeps_what_still_fits() {
    let gpu = |i: u32, uuid: &str| NvmlGpu { index: i, uuid: uuid.into(), name: "NVIDIA L4".into() };
    let config = PoolConfig::default();
    let mut pool = Pool::new(Inventory::build(&[gpu(0, "GPU-a"), gpu(1, "GPU-b")], &config).unwrap());
    let plan = pool.admit(&request("on-a", 100, 50, KindFilter::Any)).unwrap();
    pool.apply(plan).unwrap();
    let plan = pool.admit(&request("on-b", 110, 50, KindFilter::Any)).unwrap();
    pool.apply(plan).unwrap();
    assert_eq!(pool.allocation("on-b").unwrap().shares[0].device, 1);
    pool.enqueue(&request("queued", 200, 50, KindFilter::Any)).unwrap();
    // GPU-a is gone; GPU-b is now NVML index 0, and 121 blocks can never serve "queued".
    let dropped = pool.adopt(Inventory::build(&[gpu(0, "GPU-b")], &config).unwrap());
    assert_eq!(dropped.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), ["on-a", "queued"]);
    assert_eq!(pool.allocation("on-b").unwrap().shares, [Share { device: 0, blocks: 110 }]);
    assert_eq!(ranges(&pool, "on-b"), [[1, 110]]);
    pool.check().unwrap();
}

// ---- properties over random histories ----

mod properties {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        /// `vgpu run`: on refusal, queue if `wait`; `freeze_fails` drops the plan instead
        /// of recording it.
        Run {
            blocks: u64,
            priority: i64,
            kind: u8,
            wait: bool,
            freeze_fails: bool,
        },
        /// The workload exits, is killed, or its supervisor is found dead.
        Exit(usize),
        Compact,
        /// `vgpu update --tflops`: a live workload to `blocks`; `freeze_fails` as for Run.
        Resize { pick: usize, blocks: u64, freeze_fails: bool },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1u64..=14, 0i64..=4, 0u8..5, any::<bool>(), proptest::bool::weighted(0.1)).prop_map(
                |(blocks, p, kind, wait, freeze_fails)| Op::Run { blocks, priority: p * 25, kind, wait, freeze_fails }
            ),
            3 => any::<usize>().prop_map(Op::Exit),
            1 => Just(Op::Compact),
            2 => (any::<usize>(), 0u64..=16, proptest::bool::weighted(0.1))
                .prop_map(|(pick, blocks, freeze_fails)| Op::Resize { pick, blocks, freeze_fails }),
        ]
    }

    fn devices() -> impl Strategy<Value = Vec<(DeviceKind, f64)>> {
        proptest::collection::vec(
            (prop_oneof![Just(DeviceKind::Gpu), Just(DeviceKind::Npu), Just(DeviceKind::Fpga)], 0u32..=9)
                // 0.5 TFLOPS: a device worth no block.
                .prop_map(|(k, t)| (k, if t == 0 { 0.5 } else { f64::from(t) })),
            1..=4,
        )
    }

    fn kind(k: u8) -> KindFilter {
        match k {
            0 => KindFilter::Only(DeviceKind::Gpu),
            1 => KindFilter::Only(DeviceKind::Npu),
            2 => KindFilter::Only(DeviceKind::Fpga),
            _ => KindFilter::Any,
        }
    }

    /// Everything that must hold whenever the pool is at rest.
    fn check_invariants(pool: &Pool) -> Result<(), TestCaseError> {
        pool.check().map_err(|e| TestCaseError::fail(e.to_string()))?;
        // Every block has exactly one state: expand the runs.
        let mut owner_of: Vec<Option<u64>> = Vec::new();
        for (device, runs) in pool.inventory.devices.iter().zip(pool.map.devices()) {
            prop_assert_eq!(owner_of.len() as u64 + 1, device.first_block);
            for run in runs.runs() {
                owner_of.extend(std::iter::repeat_n(run.owner, run.len as usize));
            }
        }
        prop_assert_eq!(owner_of.len() as u64, pool.total_blocks(), "no lost blocks");
        let used = owner_of.iter().filter(|o| o.is_some()).count() as u64;
        prop_assert_eq!(pool.free_blocks() + pool.used_blocks(), pool.total_blocks());
        prop_assert_eq!(used, pool.used_blocks());
        let running_held: u64 =
            pool.allocations().filter(|a| a.state == AllocState::Running).map(Allocation::held).sum();
        prop_assert_eq!(running_held, used, "blocks in use are exactly the running workloads' blocks");
        for block_owner in owner_of.iter().flatten() {
            prop_assert_eq!(pool.allocations.get(block_owner).map(|a| a.state), Some(AllocState::Running));
        }
        // Compaction: every owner one run per device, free blocks one run at the end.
        prop_assert!(pool.map.is_compact(), "{:?}", pool.map);

        // Priorities: nobody waits or stays suspended while the free blocks and those of
        // strictly lower-priority running workloads would serve it.
        let free = pool.map.free_per_device();
        let lower_on = |p: Priority, d: usize| -> u64 {
            pool.allocations()
                .filter(|a| a.state == AllocState::Running && a.priority < p)
                .flat_map(|a| &a.shares)
                .filter(|s| s.device == d)
                .map(|s| s.blocks)
                .sum()
        };
        for a in pool.allocations() {
            match a.state {
                AllocState::Suspended => {
                    let could = a.shares.iter().all(|s| free[s.device] + lower_on(a.priority, s.device) >= s.blocks);
                    prop_assert!(!could, "{} is suspended but could resume: {:?}", a.id, pool.view());
                }
                AllocState::Waiting => {
                    let eligible = pool.inventory.eligible(a.kind);
                    let room: u64 = eligible.iter().map(|&d| free[d] + lower_on(a.priority, d)).sum();
                    prop_assert!(room < a.blocks, "{} waits but could run: {:?}", a.id, pool.view());
                }
                AllocState::Running => {}
            }
        }
        prop_assert!(pool.settle().is_empty(), "settling twice changes nothing");
        Ok(())
    }

    fn settle(pool: &mut Pool) -> Result<(), TestCaseError> {
        let plan = pool.settle();
        pool.apply(plan).map_err(|e| TestCaseError::fail(e.to_string()))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn random_histories_keep_the_pool_sound(devices in devices(), ops in proptest::collection::vec(op(), 1..40)) {
            let mut pool = pool_of(&devices);
            let mut live: Vec<String> = Vec::new();
            // Once placed, a workload's devices and block counts never change.
            let mut placed: HashMap<String, Vec<Share>> = HashMap::new();
            for (i, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Run { blocks, priority, kind: k, wait, freeze_fails } => {
                        let id = format!("w{i}");
                        let req = request(&id, blocks, priority, kind(k));
                        match pool.admit(&req) {
                            Ok(plan) => {
                                for s in plan.suspend() {
                                    let victim = pool.allocation(&s.id).unwrap();
                                    let by = if s.by == id {
                                        req.priority
                                    } else {
                                        pool.allocation(&s.by).unwrap().priority
                                    };
                                    prop_assert!(victim.priority < by, "only strictly lower priorities are preempted");
                                    prop_assert_eq!(victim.state, AllocState::Running);
                                }
                                if freeze_fails {
                                    let before = pool.clone();
                                    drop(plan);
                                    prop_assert_eq!(&pool, &before);
                                    continue;
                                }
                                prop_assert_eq!(plan.granted().unwrap().held(), blocks);
                                pool.apply(plan).unwrap();
                                live.push(id);
                            }
                            Err(PoolError::TooLarge { requested, available, .. }) => {
                                prop_assert!(requested > available);
                                let devices = &pool.inventory.devices;
                                let eligible: u64 =
                                    pool.inventory.eligible(kind(k)).iter().map(|&d| devices[d].blocks).sum();
                                prop_assert_eq!(available, eligible);
                            }
                            Err(PoolError::NoRoom { .. }) => {
                                if wait {
                                    pool.enqueue(&req).unwrap();
                                    settle(&mut pool)?;
                                    live.push(id);
                                }
                            }
                            Err(e) => prop_assert!(false, "unexpected error {e}"),
                        }
                    }
                    Op::Exit(pick) => {
                        if live.is_empty() {
                            continue;
                        }
                        let id = live.swap_remove(pick % live.len());
                        pool.release(&id).unwrap();
                        settle(&mut pool)?;
                    }
                    Op::Compact => {
                        let before = pool.view();
                        pool.compact();
                        prop_assert_eq!(pool.view(), before, "an at-rest pool is already compact");
                    }
                    Op::Resize { pick, blocks, freeze_fails } => {
                        if live.is_empty() {
                            continue;
                        }
                        let id = live[pick % live.len()].clone();
                        let before = pool.clone();
                        let old = pool.allocation(&id).unwrap().clone();
                        match pool.resize(&id, blocks) {
                            Ok(plan) => {
                                prop_assert_eq!(old.state, AllocState::Running);
                                prop_assert_eq!(&pool, &before, "planning changes nothing");
                                for s in plan.suspend() {
                                    let victim = pool.allocation(&s.id).unwrap();
                                    let by = pool.allocation(&s.by).unwrap().priority;
                                    prop_assert!(victim.priority < by, "only strictly lower priorities are preempted");
                                    prop_assert!(s.id != id, "a resize never suspends its own workload");
                                }
                                if blocks > old.held() {
                                    prop_assert!(plan.resume().is_empty() || !plan.suspend().is_empty(), "a raise resumes only what its preemption freed");
                                } else {
                                    prop_assert!(plan.suspend().iter().all(|s| s.by != id), "a lower preempts nobody for itself");
                                }
                                if freeze_fails {
                                    drop(plan);
                                    prop_assert_eq!(&pool, &before);
                                    continue;
                                }
                                pool.apply(plan).unwrap();
                                let now = pool.allocation(&id).unwrap();
                                prop_assert_eq!(now.state, AllocState::Running);
                                prop_assert_eq!(now.held(), blocks);
                                prop_assert_eq!(now.blocks, blocks);
                                let devices = |a: &Allocation| a.shares.iter().map(|s| s.device).collect::<Vec<_>>();
                                prop_assert_eq!(devices(now), devices(&old), "same devices");
                                prop_assert!(now.shares.iter().all(|s| s.blocks >= 1));
                                // Its devices keep their sizes; the others keep theirs.
                                placed.insert(id.clone(), now.shares.clone());
                            }
                            Err(e) => {
                                prop_assert_eq!(&pool, &before, "a refused resize changes nothing");
                                match e {
                                    PoolError::NotRunning { .. } => prop_assert!(old.state != AllocState::Running),
                                    PoolError::ResizeBelowDevices { devices, .. } => prop_assert!((blocks as usize) < devices),
                                    PoolError::ResizeTooLarge { available, .. } => prop_assert!(blocks > available),
                                    PoolError::NoRoom { holders, .. } => {
                                        prop_assert!(blocks > old.held());
                                        prop_assert!(holders.iter().all(|h| h.id != id && h.priority >= old.priority.get()));
                                    }
                                    other => prop_assert!(false, "unexpected error {other}"),
                                }
                            }
                        }
                    }
                }
                for a in pool.allocations().filter(|a| a.state != AllocState::Waiting) {
                    let first = placed.entry(a.id.clone()).or_insert_with(|| a.shares.clone());
                    prop_assert_eq!(&*first, &a.shares, "{} moved", a.id);
                }
                check_invariants(&pool)?;
            }
            let back: Pool = serde_json::from_str(&serde_json::to_string(&pool).unwrap()).unwrap();
            prop_assert_eq!(&back, &pool);
            // Everyone leaves: every block comes back.
            for id in live {
                pool.release(&id).unwrap();
                settle(&mut pool)?;
            }
            prop_assert_eq!(pool.allocations().count(), 0);
            prop_assert_eq!(pool.free_blocks(), pool.total_blocks());
        }

        #[test]
        fn compaction_makes_every_owner_contiguous(
            sizes in proptest::collection::vec(1u64..6, 1..30),
            drop_mask in any::<u64>(),
        ) {
            // Fill one device, free an arbitrary subset without compacting, then compact.
            let total: u64 = sizes.iter().sum();
            let mut pool = pool_of(&[(DeviceKind::Gpu, total as f64)]);
            for (i, &n) in sizes.iter().enumerate() {
                run(&mut pool, &format!("w{i}"), n, 50);
            }
            for i in 0..sizes.len() {
                if drop_mask >> (i % 64) & 1 == 1 {
                    let seq = pool.allocation(&format!("w{i}")).unwrap().seq;
                    pool.map.device_mut(0).release(seq);
                    pool.allocations.remove(&seq);
                    pool.by_id.remove(&format!("w{i}"));
                }
            }
            let order_before: Vec<u64> = pool.map.device(0).runs().iter().filter_map(|r| r.owner).collect();
            pool.compact();
            prop_assert!(pool.map.is_compact());
            pool.check().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let view = pool.view();
            for a in &view.allocations {
                prop_assert_eq!(a.ranges.len(), 1, "{} is not one run", a.id);
            }
            prop_assert!(view.free.len() <= 1);
            if let Some(free) = view.free.first() {
                prop_assert_eq!(free[1], total, "free blocks end the device");
            }
            let order_after: Vec<u64> = pool.map.device(0).runs().iter().filter_map(|r| r.owner).collect();
            prop_assert_eq!(order_after, order_before, "owners keep their order");
        }
    }
}
