//! The driver as loaded into this process: the config, read once, and each device's shared
//! state, mapped once. CUDA and NVML share it, like the real kernel driver underneath both.

use std::sync::OnceLock;

use crate::config::{self, DeviceConfig};
use crate::ffi::now_ns;
use crate::model;
use crate::state::{self, DeviceState};

pub(crate) struct Driver {
    pub devices: Vec<Device>,
    /// The checkpoint API is offered (config key `checkpoint`).
    pub checkpoint: bool,
    /// Checkpoint/restore copy rate in GB/s (config key `checkpoint_gbps`).
    pub checkpoint_gbps: f64,
}

pub(crate) struct Device {
    pub index: usize,
    pub config: DeviceConfig,
    pub state: DeviceState,
}

static DRIVER: OnceLock<Option<Driver>> = OnceLock::new();

/// The driver, loading it on first use. A bad config or an unusable state directory is
/// reported once on stderr (one line naming the file and key) and makes every later call
/// fail too, as a broken installation would.
pub(crate) fn load() -> Option<&'static Driver> {
    DRIVER
        .get_or_init(|| match Driver::load() {
            Ok(driver) => Some(driver),
            Err(message) => {
                eprintln!("{message}");
                None
            }
        })
        .as_ref()
}

/// The driver if something already loaded it.
pub(crate) fn loaded() -> Option<&'static Driver> {
    DRIVER.get().and_then(Option::as_ref)
}

impl Driver {
    fn load() -> Result<Driver, String> {
        let config = config::load().map_err(|e| e.to_string())?;
        let checkpoint = config.checkpoint;
        let checkpoint_gbps = config.checkpoint_gbps;
        let dir = state::state_dir();
        let mut devices = Vec::with_capacity(config.devices.len());
        for (index, device) in config.devices.into_iter().enumerate() {
            let state = DeviceState::open(&dir, &device.uuid, device.memory)
                .map_err(|e| format!("fakegpu: state directory {}: {e}", dir.display()))?;
            devices.push(Device {
                index,
                config: device,
                state,
            });
        }
        Ok(Driver {
            devices,
            checkpoint,
            checkpoint_gbps,
        })
    }

    pub fn device(&self, index: usize) -> Option<&Device> {
        self.devices.get(index)
    }

    /// Reclaim the memory of dead processes on every device.
    pub fn reclaim_dead(&self) {
        for d in &self.devices {
            d.state.reclaim_dead();
        }
    }
}

impl Device {
    /// The power limit in force, in mW.
    pub fn power_limit_mw(&self) -> u32 {
        self.state
            .power_limit_mw()
            .unwrap_or(self.config.power_limit_default_mw)
    }

    /// The clock kernels run at now, in MHz.
    pub fn busy_clock_mhz(&self) -> u32 {
        let locked_max = self.state.locked_clocks().map(|(_, max)| max);
        model::busy_clock_mhz(&self.config, locked_max, self.power_limit_mw())
    }

    /// GPU utilization over the last sample window, 0..=1: exactly the part of it covered
    /// by kernels.
    pub fn utilization(&self, now: u64) -> f64 {
        let since = now.saturating_sub(model::SAMPLE_WINDOW_NS);
        let intervals = self.state.timeline_since(since);
        model::utilization(intervals.iter().map(|b| (b.start_ns, b.end_ns, b.busy_ns)), now)
    }

    /// Busy time of each process in `[from, to)`, in ns (processes with none are left out).
    pub fn process_busy_ns(&self, from: u64, to: u64) -> Vec<(u32, u64)> {
        let intervals = self.state.timeline_since(from);
        let mut pids: Vec<u32> = intervals
            .iter()
            .map(|b| b.pid)
            .filter(|&p| p != 0)
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids.into_iter()
            .map(|pid| {
                let own = intervals
                    .iter()
                    .filter(|b| b.pid == pid)
                    .map(|b| (b.start_ns, b.end_ns, b.busy_ns));
                (pid, model::timeline_busy_ns(own, from, to))
            })
            .filter(|&(_, busy)| busy > 0)
            .collect()
    }

    /// The graphics/SM clock now: the busy clock if a kernel ran within the sample window,
    /// else the idle clock.
    pub fn current_clock_mhz(&self, now: u64) -> u32 {
        if self.utilization(now) > 0.0 {
            self.busy_clock_mhz()
        } else {
            model::idle_clock_mhz(&self.config, self.state.locked_clocks().map(|(min, _)| min))
        }
    }

    /// Power draw now, in mW.
    pub fn power_mw(&self, now: u64) -> u32 {
        model::power_mw(
            &self.config,
            self.utilization(now),
            self.busy_clock_mhz(),
            self.power_limit_mw(),
        )
    }

    /// Energy since the state file was created, in mJ: idle power all along, plus the
    /// above-idle energy of every kernel, less the part of queued kernels not yet run.
    pub fn energy_mj(&self, now: u64) -> u64 {
        let (_, busy_until, dyn_uj) = self.state.energy_counters();
        let elapsed = now.saturating_sub(self.state.created_ns());
        let idle_uj = model::energy_uj(u64::from(self.config.power_idle_mw), elapsed);
        let busy_dyn_mw = u64::from(
            model::power_mw(
                &self.config,
                1.0,
                self.busy_clock_mhz(),
                self.power_limit_mw(),
            )
            .saturating_sub(self.config.power_idle_mw),
        );
        let pending_uj = model::energy_uj(busy_dyn_mw, busy_until.saturating_sub(now));
        let total_uj = idle_uj.saturating_add(dyn_uj.saturating_sub(pending_uj));
        self.state.monotonic_energy_mj(total_uj / 1000)
    }

    /// Queue a kernel of `blocks` thread blocks launched now by the process holding `slot`,
    /// not before `not_before`; one wave takes `wave_ns` at the maximum clock (`None`: the
    /// device's `kernel_wave_us`). Returns when it starts and ends (ns since the epoch).
    pub fn launch(
        &self,
        slot: Option<usize>,
        not_before: u64,
        wave_ns: Option<u64>,
        blocks: u64,
    ) -> (u64, u64) {
        let clock = self.busy_clock_mhz();
        let duration = match wave_ns {
            Some(wave) => model::kernel_duration_with_wave_ns(&self.config, blocks, clock, wave),
            None => model::kernel_duration_ns(&self.config, blocks, clock),
        };
        let busy_mw = model::power_mw(&self.config, 1.0, clock, self.power_limit_mw());
        let dyn_uj = model::energy_uj(
            u64::from(busy_mw.saturating_sub(self.config.power_idle_mw)),
            duration,
        );
        self.state
            .record_launch(slot, now_ns(), not_before, duration, dyn_uj, model::Slicing::of(&self.config))
    }

    /// When an event recorded now by the process holding `slot` on a stream ready at
    /// `ready_ns` is stamped: when the device reaches it in that context, after a switch if
    /// another context's work is queued (as a kernel queued there would start).
    pub fn event_stamp(&self, slot: Option<usize>, ready_ns: u64) -> u64 {
        self.state
            .item_start(slot, now_ns().max(ready_ns), model::Slicing::of(&self.config))
    }

    /// Temperature now, in °C.
    pub fn temperature_c(&self, now: u64) -> u32 {
        model::temperature_c(&self.config, self.power_mw(now))
    }
}
