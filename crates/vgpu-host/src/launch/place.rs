//! Where a workload runs: pool blocks, a partition's vGPU, or GPUs of its own.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use vgpu_store::admission;

use vgpu_store::admission::AdmissionGpu;

use vgpu_store::admission::MemSpec;
use crate::context::Context;
use vgpu_store::error::UsageError;
use vgpu_gpu::GpuInfo;
use vgpu_pool::AllocState;
use vgpu_pool::PoolError;
use crate::policy::MemCap;
use crate::pool_effects;
use crate::pool_effects::pool_error;
use vgpu_store::state::DamagedRecord;
use vgpu_store::state::Partition;
use vgpu_store::state::Partitions;
use vgpu_store::state::Store;
use vgpu_store::state::SuspendedMemory;
use vgpu_store::state::Workload;
use vgpu_store::state::WorkloadGpu;
use vgpu_store::state::WorkloadState;

use super::admit::{check_memory, check_memory_among};
use super::transaction::Admission;
use super::{PoolAsk, Request};

/// Blocks from the pool, preempting lower priorities; with `--wait`, queued until they are
/// free. The workload gets a slice of each GPU its blocks are on.
#[allow(clippy::too_many_arguments)]
pub fn on_pool(
    ctx: &Context,
    store: &Store,
    tx: &mut Admission,
    gpus: &[GpuInfo],
    devices: &[AdmissionGpu],
    request: &Request,
    ask: &PoolAsk,
    workload: &mut Workload,
) -> Result<()> {
    let id = workload.id.clone();
    let pool_request = vgpu_pool::Request::for_tflops(&id, &workload.name, ask.tflops, ctx.config.pool.block_tflops, request.priority, ask.kind)
        .map_err(pool_error)?;
    let started = Instant::now();
    let mut said_waiting = false;
    let pool = loop {
        let mut pool = pool_effects::current(ctx, store, gpus)?;
        match pool_effects::admit(store, &pool, &pool_request)? {
            Ok(plan) => {
                let mut trial = workload.clone();
                if !request.oversubscribe {
                    if let Err(e) = check_planned_memory(store, devices, request, ask, &pool, &plan, &mut trial) {
                        // With --wait, a request whose memory does not fit waits for it
                        // (others exiting, shrinking, or suspended to host memory); one
                        // [policy] refuses never will.
                        let Some(limit) = ask.wait.filter(|_| e.downcast_ref::<UsageError>().is_none()) else { return Err(e) };
                        if limit.is_some_and(|l| started.elapsed() >= l) {
                            return Err(e.context(format!("timed out after {} waiting for the memory", humantime::format_duration(limit.unwrap_or_default()))));
                        }
                        if !said_waiting {
                            crate::notice!("waiting for the memory: {e:#}…");
                            said_waiting = true;
                        }
                        tx.unlock();
                        std::thread::sleep(super::WAIT_POLL);
                        crate::lifecycle::reconcile_store(store, tx.lock()?);
                        continue;
                    }
                }
                tx.asked_pool();
                let moved = pool_effects::execute(store, tx.lock()?, &mut pool, plan)?;
                // A victim whose processes the driver would not checkpoint kept its memory:
                // check again as things are. Refused, the transaction gives the blocks back
                // and the victims resume.
                if !request.oversubscribe {
                    if let Some((id, SuspendedMemory::Device { why })) = moved.iter().find(|(_, m)| *m != SuspendedMemory::Host) {
                        check_memory(store, devices, &trial).map_err(|e| {
                            e.context(format!("{} TFLOPS were available, but not the memory: the memory of {id} could not be moved off the GPU ({why}); it resumes", ask.tflops))
                        })?;
                    }
                }
                break pool;
            }
            Err(PoolError::NoRoom { .. }) if ask.wait.is_some() => {
                pool.enqueue(&pool_request).map_err(pool_error)?;
                pool_effects::save(store, &pool)?;
                tx.asked_pool();
                workload.state = WorkloadState::Waiting;
                store.write_workload(workload)?;
                tx.wrote_record();
                crate::notice!("waiting for {} TFLOPS from the pool…", ask.tflops);
                wait_for_blocks(store, tx, &id, ask.wait.flatten())?;
                workload.state = WorkloadState::Starting;
                break pool_effects::load(store)?.context("the pool state disappeared while waiting")?;
            }
            Err(e) => return Err(pool_error(e)),
        }
    };
    let alloc = pool.allocation(&id).context("the pool did not record the allocation")?;
    workload.pool_blocks = Some(alloc.held());
    slices(&pool, devices, request, workload)?;
    workload.pool_env = pool.declared_env(&id);
    Ok(())
}

/// Memory is decided with the blocks, before anyone is suspended: the slices `plan` would
/// give (into `trial`), checked against every reservation as the plan would leave them (a
/// victim's memory is free if the driver can move it to host memory), on a copy of the
/// pool. Refused here, nobody was touched.
fn check_planned_memory(
    store: &Store,
    devices: &[AdmissionGpu],
    request: &Request,
    ask: &PoolAsk,
    pool: &vgpu_pool::Pool,
    plan: &vgpu_pool::Plan,
    trial: &mut Workload,
) -> Result<()> {
    // Only a plan that suspends someone needs to know (it loads the driver).
    let releases = if plan.suspend().is_empty() { Err(String::new()) } else { crate::suspension::releases_memory() };
    let mut planned = pool.clone();
    planned.apply(plan.clone()).map_err(pool_error)?;
    slices(&planned, devices, request, trial)?;
    let others = pool_effects::planned_workloads(store, plan, releases.is_ok());
    let damaged = vgpu_store::state::damaged::damaged_records(&store.workloads().1);
    check_memory_among(store, devices, trial, &others, &damaged).map_err(|e| {
        let held = match (&releases, plan.suspend().is_empty()) {
            (Err(why), false) => {
                format!(" (a suspended workload keeps its GPU memory here: {why})")
            }
            _ => String::new(),
        };
        e.context(format!("{} TFLOPS were available{}, but not the memory{held}; nobody was suspended", ask.tflops, preempting(plan)))
    })
}

/// The workload's slice of each GPU its blocks are on: a compute share of blocks/GPU blocks,
/// and memory as asked (`--mem`) or in the same proportion, within a sudo caller's
/// `[policy] max_mem` (a usage error above it).
fn slices(pool: &vgpu_pool::Pool, devices: &[AdmissionGpu], request: &Request, workload: &mut Workload) -> Result<()> {
    for share in pool.gpu_shares(&workload.id) {
        let Some(device) = share.device.uuid().and_then(|u| devices.iter().find(|d| d.uuid == u)) else {
            continue;
        };
        let fraction = share.percent() / 100.0;
        let proportional = (device.memory as f64 * fraction) as u64;
        let bytes = MemCap::slice(request.mem_cap.as_ref(), request.mem, proportional, device.index, device.memory)
            .map_err(|e| UsageError::new(e.to_string()))?;
        workload.gpus.push(WorkloadGpu {
            index: device.index,
            uuid: device.uuid.clone(),
            mem_bytes: bytes,
            device_bytes: device.memory,
            compute_pct: u32::from(share.compute_percent()),
        });
    }
    Ok(())
}

/// " by suspending low, other" when the plan preempts, else "".
fn preempting(plan: &vgpu_pool::Plan) -> String {
    let names: Vec<&str> = plan.suspend().iter().map(|s| s.name.as_str()).collect();
    if names.is_empty() {
        String::new()
    } else {
        format!(" by suspending {}", names.join(", "))
    }
}

/// Poll, releasing the store lock between polls, until the pool has started workload `id`;
/// returns with the lock held. On a timeout the admission's rollback removes its queue
/// entry and record.
fn wait_for_blocks(store: &Store, tx: &mut Admission, id: &str, limit: Option<Duration>) -> Result<()> {
    let started = Instant::now();
    loop {
        tx.unlock();
        std::thread::sleep(Duration::from_millis(200));
        let lock = tx.lock()?;
        crate::lifecycle::reconcile_store(store, lock);
        let mut pool = pool_effects::load(store)?.context("the pool state disappeared while waiting")?;
        // Whoever released blocks settled the pool; settle again in case nobody did.
        pool_effects::settle_pool(store, lock, &mut pool)?;
        match pool.allocation(id).map(|a| a.state) {
            Some(AllocState::Running) => return Ok(()),
            Some(_) => {}
            None => anyhow::bail!("the pool dropped this request while it waited"),
        }
        if limit.is_some_and(|l| started.elapsed() >= l) {
            anyhow::bail!("timed out after {} waiting for pool blocks", humantime::format_duration(limit.unwrap_or_default()));
        }
    }
}

/// A partition's vGPU, on its GPU; returns the partition.
pub fn in_partition(store: &Store, devices: &[AdmissionGpu], name: &str, workload: &mut Workload) -> Result<Partition> {
    let partitions = Partitions::load(&store.partitions_path())?;
    let Some(p) = partitions.get(name) else {
        vgpu_store::usage!("no partition {name:?} (see `vgpu partition list`)");
    };
    let device = devices
        .iter()
        .find(|d| d.uuid == p.gpu_uuid)
        .with_context(|| format!("partition {name:?} is on GPU {} which is no longer present", p.gpu_uuid))?;
    workload.gpus.push(WorkloadGpu {
        index: device.index,
        uuid: device.uuid.clone(),
        mem_bytes: p.mem_bytes,
        device_bytes: device.memory,
        compute_pct: p.compute_pct,
    });
    workload.vgpu = p.vgpu_id();
    workload.partition = Some(p.name.clone());
    workload.compute_policy = p.compute_policy;
    Ok(p.clone())
}

/// GPUs of its own: those `wanted` (by index or UUID), else the default pick; of each the
/// whole GPU, or `mem`, within `mem_cap` (a sudo caller's `[policy] max_mem`).
#[allow(clippy::too_many_arguments)]
pub fn on_gpus(
    devices: &[AdmissionGpu],
    wanted: &[String],
    compute_pct: u32,
    mem: Option<MemSpec>,
    mem_cap: Option<&MemCap>,
    workloads: &[Workload],
    partitions: &[Partition],
    damaged: &[DamagedRecord],
    workload: &mut Workload,
) -> Result<()> {
    for device in select_gpus(devices, wanted, workloads, partitions, damaged)? {
        // The whole GPU unless --mem says, within a sudo caller's [policy] max_mem.
        let bytes = MemCap::slice(mem_cap, mem, device.memory, device.index, device.memory).map_err(|e| UsageError::new(e.to_string()))?;
        workload.gpus.push(WorkloadGpu {
            index: device.index,
            uuid: device.uuid.clone(),
            mem_bytes: bytes,
            device_bytes: device.memory,
            compute_pct,
        });
    }
    Ok(())
}

fn select_gpus<'a>(
    devices: &'a [AdmissionGpu],
    wanted: &[String],
    workloads: &[Workload],
    partitions: &[Partition],
    damaged: &[DamagedRecord],
) -> Result<Vec<&'a AdmissionGpu>> {
    if devices.is_empty() {
        anyhow::bail!("the NVIDIA driver reports no GPU");
    }
    if wanted.is_empty() {
        // A GPU a damaged record may hold memory on is picked only when every GPU is (and
        // admission then refuses it, naming the record).
        let open: Vec<AdmissionGpu> = devices.iter().filter(|d| admission::check_not_blocked(d, damaged).is_ok()).cloned().collect();
        let candidates = if open.is_empty() { devices } else { &open[..] };
        let pick = admission::pick_default(candidates, workloads, partitions).context("no GPU")?;
        let device = devices.iter().find(|d| d.index == pick.index).context("no GPU")?;
        return Ok(vec![device]);
    }
    let mut out: Vec<&AdmissionGpu> = Vec::new();
    for query in wanted {
        let device = admission::find_device(devices, query).map_err(|e| UsageError::new(format!("--gpu {query}: {e}")))?;
        if let Some(earlier) = out.iter().find(|d| d.index == device.index) {
            vgpu_store::usage!("--gpu {query}: GPU {} ({}) is already selected", earlier.index, earlier.uuid);
        }
        out.push(device);
    }
    Ok(out)
}
