//! The NVML meter: corrects the compute governor's charges when the GPU is shared.
//!
//! Events measure a launch from start to end, and while other contexts hold time slices of
//! the GPU, that span includes their slices. The governor already charges a stretched
//! launch the exclusive time learned for its kernel, but a launch stretched by less than
//! the learned band still counts the others' time. NVML's per-process utilization sees
//! only this process's own time on the GPU, but a second late and in whole percents: too
//! coarse to drive admission, right on average.
//!
//! **Opt-in** (`VGPU_NVML_CORRECT=1`, or `VGPU_DEBUG_METER=1`, which also logs each
//! comparison): on an H100 with two time-sliced tenants (30 % + 70 %), NVML's per-process
//! figures came in 20-point steps (20/40/60/80 % each second), the factor jittered between
//! 0.80 and 1.13, and the split was no closer to its target than without it (0.309/0.620
//! without, 0.318/0.594 and 0.302/0.623 with). The tenant below its share there was not
//! throttled at all (0.03 s of waits in 16 s): the GPU's own time-slicing between two
//! contexts lost ~7 % of the GPU, which no correction of charges can give back.
//!
//! When enabled, a thread of the process (started at its first limited launch, never at
//! load time) compares, once a second and per device, this process's NVML busy time with what its
//! events charged over the same second. Only while NVML shows other processes busy on the
//! GPU (alone, events are exact and NVML's integer figures would only add noise) does it
//! move the correction factor towards `nvml / charged`, smoothed over a few seconds and
//! clamped to [`MIN_PPM`]..=[`MAX_PPM`]. The governor multiplies every charge by it.

use std::ffi::{c_uint, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use vgpu_abi::compute::PPM;
use vgpu_abi::layout::{now_mono_ns, now_unix_ns, MAX_DEVICES};

use crate::ffi::*;
use crate::log::vgpu_log_once;
use crate::real;
use crate::state::Vgpu;

/// Bounds of the correction factor (ppm).
pub const MIN_PPM: u64 = PPM / 2;
pub const MAX_PPM: u64 = PPM + PPM / 5;
/// How often the meter compares.
const PERIOD: Duration = Duration::from_secs(1);
/// Weight of a new comparison (1/SMOOTH).
const SMOOTH: u64 = 3;
/// Others below this busy share (percent of the GPU) do not count as sharing it.
const OTHERS_MIN_PCT: u64 = 3;
/// This process below this busy share (percent, by its events) is too idle to compare.
const SELF_MIN_PCT: u64 = 3;

/// Per device: the factor (ppm) charges are multiplied by.
static CORRECTION: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(PPM) }; MAX_DEVICES];
/// Per device: GPU time this process's events measured and the governor charged before
/// correction (ns), for the meter to compare with NVML.
static RAW_CHARGED: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
static STARTED: AtomicBool = AtomicBool::new(false);

/// Charge `ns` (measured) on `device`: returns the corrected charge.
#[inline]
pub fn correct(device: usize, ns: u64) -> u64 {
    let Some(slot) = RAW_CHARGED.get(device) else { return ns };
    slot.fetch_add(ns, Ordering::Relaxed);
    let factor = CORRECTION[device].load(Ordering::Relaxed);
    ((u128::from(ns) * u128::from(factor)) / u128::from(PPM)) as u64
}

/// Whether the meter is enabled for this process (read once).
fn enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| {
        ["VGPU_NVML_CORRECT", "VGPU_DEBUG_METER"]
            .iter()
            .any(|k| std::env::var_os(k).is_some_and(|v| v == "1"))
    })
}

/// Start the meter thread once per process if enabled (idempotent; cheap after the first
/// call).
#[inline]
pub fn ensure_started(vgpu: &'static Vgpu) {
    if STARTED.load(Ordering::Relaxed) || STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    if !enabled() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("vgpu-meter".into())
        .spawn(move || run(vgpu));
    if let Err(e) = spawned {
        vgpu_log_once!("cannot start the compute meter thread ({e}); charges are not corrected under contention");
    }
}

/// Fork child: the thread did not come along; the child starts its own when it launches.
pub fn reset_in_child() {
    STARTED.store(false, Ordering::Release);
    for (c, r) in CORRECTION.iter().zip(RAW_CHARGED.iter()) {
        c.store(PPM, Ordering::Relaxed);
        r.store(0, Ordering::Relaxed);
    }
}

/// One device as NVML knows it.
struct Metered {
    handle: nvmlDevice_t,
    last_raw: u64,
}

fn run(vgpu: &'static Vgpu) {
    // SAFETY: NVML's initialisation is reference-counted and safe from any thread.
    if unsafe { real::nvmlInit_v2() } != NVML_SUCCESS {
        vgpu_log_once!("NVML is not available; compute charges are not corrected under contention");
        return;
    }
    let pid = std::process::id();
    let count = vgpu.usage.device_count().min(MAX_DEVICES);
    let mut devices: Vec<Option<Metered>> = (0..count)
        .map(|d| {
            let uuid = CString::new(vgpu.usage.device_uuid(d)).ok()?;
            let mut handle: nvmlDevice_t = std::ptr::null_mut();
            // SAFETY: a C string and a valid out-pointer.
            let rc = unsafe { real::nvmlDeviceGetHandleByUUID(uuid.as_ptr(), &mut handle) };
            (rc == NVML_SUCCESS).then_some(Metered {
                handle,
                last_raw: RAW_CHARGED[d].load(Ordering::Relaxed),
            })
        })
        .collect();
    // `VGPU_DEBUG_METER=1`: one stderr line per device and second (for diagnosis on real GPUs).
    let debug = std::env::var_os("VGPU_DEBUG_METER").is_some_and(|v| v == "1");
    let mut samples: Vec<nvmlProcessUtilizationSample_t> = Vec::new();
    let mut last_us = now_unix_ns() / 1000;
    let mut last_mono = now_mono_ns();
    loop {
        std::thread::sleep(PERIOD);
        let now_us = now_unix_ns() / 1000;
        let now_mono = now_mono_ns();
        let wall = now_mono.saturating_sub(last_mono).max(1);
        for (d, metered) in devices.iter_mut().enumerate() {
            let Some(m) = metered else { continue };
            let raw = RAW_CHARGED[d].load(Ordering::Relaxed);
            let charged = raw.saturating_sub(m.last_raw);
            m.last_raw = raw;
            let found = utilization(m.handle, pid, last_us, &mut samples);
            let charged_pct = charged.saturating_mul(100) / wall;
            if debug {
                crate::log::vgpu_log!(
                    "meter: device {d}: events charged {charged_pct}%, NVML (mine, others) {found:?}%, factor {} ppm",
                    CORRECTION[d].load(Ordering::Relaxed)
                );
            }
            let Some((mine_pct, others_pct)) = found else { continue };
            if others_pct < OTHERS_MIN_PCT || charged_pct < SELF_MIN_PCT {
                // Alone (or idle): events are exact; drift back to no correction.
                nudge(d, PPM);
                continue;
            }
            let observed = (mine_pct.saturating_mul(PPM) / charged_pct.max(1)).clamp(MIN_PPM, MAX_PPM);
            nudge(d, observed);
        }
        last_us = now_us;
        last_mono = now_mono;
    }
}

/// Move device `d`'s factor a step towards `target`.
fn nudge(d: usize, target: u64) {
    let old = CORRECTION[d].load(Ordering::Relaxed);
    let new = (old * (SMOOTH - 1) + target) / SMOOTH;
    CORRECTION[d].store(new.clamp(MIN_PPM, MAX_PPM), Ordering::Relaxed);
}

/// This process's and the other processes' busy share (percent) of device `handle` since
/// `since_us`, from NVML's samples (average of each process's samples). `None` if NVML has
/// no samples for this process.
fn utilization(handle: nvmlDevice_t, pid: u32, since_us: u64, buf: &mut Vec<nvmlProcessUtilizationSample_t>) -> Option<(u64, u64)> {
    let mut count: c_uint = 0;
    // SAFETY: NULL samples with a count asks for the number of samples.
    let rc = unsafe { real::nvmlDeviceGetProcessUtilization(handle, std::ptr::null_mut(), &mut count, since_us) };
    if (rc != NVML_SUCCESS && rc != NVML_ERROR_INSUFFICIENT_SIZE) || count == 0 {
        return None;
    }
    let want = (count as usize).min(4096) + 16;
    buf.clear();
    // SAFETY: plain C data; zero is a valid value of every field.
    buf.resize(want, unsafe { std::mem::zeroed() });
    let mut count = want as c_uint;
    // SAFETY: a buffer of `count` samples and a valid count pointer.
    let rc = unsafe { real::nvmlDeviceGetProcessUtilization(handle, buf.as_mut_ptr(), &mut count, since_us) };
    if rc != NVML_SUCCESS {
        return None;
    }
    let samples = &buf[..(count as usize).min(buf.len())];
    let mut mine = (0u64, 0u64);
    let mut others: std::collections::HashMap<u32, (u64, u64)> = std::collections::HashMap::new();
    for s in samples {
        let entry = if s.pid == pid { &mut mine } else { others.entry(s.pid).or_default() };
        entry.0 += u64::from(s.smUtil.min(100));
        entry.1 += 1;
    }
    if mine.1 == 0 {
        return None;
    }
    let others_pct: u64 = others.values().map(|(sum, n)| sum / (*n).max(1)).sum();
    Some((mine.0 / mine.1, others_pct))
}
