//! Pool operations at scale: a node of 100 000 blocks (8 devices of 12 500) shared by
//! 1 000 workloads; time per allocate, release (with settle), compact, preemption plan and
//! JSON round trip (what every `vgpu` command that touches the pool pays).
//!
//! `cargo bench --bench pool_ops`

use std::hint::black_box;
use std::time::{Duration, Instant};

use vgpu_pool::config::DeclaredDevice;

use vgpu_pool::config::PoolConfig;
use vgpu_pool::DeviceKind;
use vgpu_pool::inventory::Inventory;
use vgpu_pool::KindFilter;
use vgpu_pool::Pool;
use vgpu_pool::PoolError;
use vgpu_pool::Priority;
use vgpu_pool::Request;

#[path = "support/rng.rs"]
mod rng;
use rng::Rng;

const DEVICES: usize = 8;
const BLOCKS_PER_DEVICE: f64 = 12_500.0;
const OWNERS: usize = 1_000;
const ROUNDS: usize = 5_000;


fn request(id: usize, blocks: u64, priority: i64) -> Request {
    let priority = Priority::new(priority).expect("priority in range");
    Request::new(format!("w{id}"), format!("job-{id}"), blocks, priority, KindFilter::Any)
}

fn per_op(total: Duration, ops: usize) -> String {
    format!("{:>9.2} µs/op", total.as_secs_f64() * 1e6 / ops.max(1) as f64)
}

fn main() -> Result<(), PoolError> {
    let config = PoolConfig {
        devices: (0..DEVICES)
            .map(|i| DeclaredDevice {
                kind: DeviceKind::Gpu,
                name: format!("gpu{i}"),
                tflops: BLOCKS_PER_DEVICE,
                id: None,
                env: None,
            })
            .collect(),
        ..PoolConfig::default()
    };
    let mut pool = Pool::new(Inventory::build(&[], &config)?);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);

    // Fill: 1 000 owners of 1–189 blocks (about 95 % of the pool), priorities 0–100.
    let mut live: Vec<usize> = Vec::new();
    let mut next_id = 0;
    let started = Instant::now();
    while live.len() < OWNERS {
        let req = request(next_id, 1 + rng.below(189), rng.below(101) as i64);
        next_id += 1;
        if let Ok(plan) = pool.admit(&req) {
            pool.apply(plan)?;
            live.push(next_id - 1);
        }
    }
    let fill = started.elapsed();
    println!(
        "pool: {} blocks on {DEVICES} devices, {} owners, {} blocks used",
        pool.total_blocks(),
        live.len(),
        pool.used_blocks()
    );
    println!("fill           {}", per_op(fill, OWNERS));

    // Steady state: one workload leaves (release + settle), a new one arrives (admit +
    // apply, preempting lower priorities when the free blocks are too few), then a full
    // `pool compact`. The pool stays nearly full, so settles and preemptions have work.
    let (mut t_release, mut t_alloc, mut t_compact) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let (mut allocs, mut refused, mut preempting) = (0, 0, 0);
    for _ in 0..ROUNDS {
        let gone = live.swap_remove(rng.below(live.len() as u64) as usize);
        let t = Instant::now();
        pool.release(&format!("w{gone}"))?;
        let plan = pool.settle();
        pool.apply(plan)?;
        t_release += t.elapsed();

        // Arrivals are larger than departures on average, so the pool fills up.
        let req = request(next_id, 1 + rng.below(299), rng.below(101) as i64);
        next_id += 1;
        let t = Instant::now();
        match pool.admit(&req) {
            Ok(plan) => {
                preempting += usize::from(!plan.suspend().is_empty());
                pool.apply(plan)?;
                allocs += 1;
                live.push(next_id - 1);
            }
            Err(PoolError::NoRoom { .. }) => refused += 1,
            Err(e) => return Err(e),
        }
        t_alloc += t.elapsed();

        let t = Instant::now();
        black_box(pool.compact());
        t_compact += t.elapsed();
    }
    println!("release+settle {}  ({ROUNDS} ops)", per_op(t_release, ROUNDS));
    println!(
        "allocate       {}  ({ROUNDS} ops: {allocs} granted, {preempting} of them by preemption, {refused} refused)",
        per_op(t_alloc, ROUNDS)
    );
    println!("compact        {}  ({ROUNDS} ops, whole pool)", per_op(t_compact, ROUNDS));
    let suspended = pool.allocations().filter(|a| a.state == vgpu_pool::AllocState::Suspended).count();
    println!(
        "now: {} workloads ({suspended} suspended), {} of {} blocks used",
        pool.allocations().count(),
        pool.used_blocks(),
        pool.total_blocks()
    );

    // Preemption planning: a priority-100 request for a whole device's worth of blocks,
    // planned (not applied) against the full pool.
    let big = Request::new("big", "big", 12_000, Priority::new(100)?, KindFilter::Any);
    let t = Instant::now();
    let mut suspended = 0;
    for _ in 0..200 {
        let plan = pool.admit(black_box(&big))?;
        suspended = plan.suspend().len();
    }
    println!("preempt plan   {}  (200 plans, {suspended} workloads to suspend each)", per_op(t.elapsed(), 200));

    // The store's cost: serialise and parse the whole pool.
    let t = Instant::now();
    let mut text = String::new();
    for _ in 0..100 {
        text = serde_json::to_string(&pool).map_err(|e| PoolError::Corrupt(e.to_string()))?;
    }
    let t_save = t.elapsed();
    let t = Instant::now();
    for _ in 0..100 {
        let back: Pool = serde_json::from_str(&text).map_err(|e| PoolError::Corrupt(e.to_string()))?;
        black_box(back);
    }
    println!("json save      {}  ({} KiB)", per_op(t_save, 100), text.len() / 1024);
    println!("json load      {}  (parse + check)", per_op(t.elapsed(), 100));
    pool.check()
}
