//! What devices the simulated driver has: a TOML file named by `FAKEGPU_CONFIG`, or one
//! H100 when it is unset.
//!
//! ```toml
//! [[device]]
//! name = "NVIDIA A100-SXM4-40GB"
//! memory = "40GiB"            # or an integer number of bytes
//! ```
//!
//! Every other key is optional. Defaults come from a built-in preset chosen by the name
//! (`A100` in the name: A100-SXM4 figures; anything else: H100-SXM figures); README.md has
//! the full table. Two optional keys stand before the tables: `checkpoint = false` (a
//! driver without the checkpoint API) and `checkpoint_gbps = 25.0` (the rate at which
//! checkpoint and restore copy device memory, GB/s). Unknown keys and inconsistent values
//! are errors that name the file, the device and the key.

use std::fmt;
use std::path::{Path, PathBuf};

use nvml_wrapper_sys::bindings as nvml;

/// Environment variable naming the config file.
pub const CONFIG_ENV: &str = "FAKEGPU_CONFIG";

/// The default `checkpoint_gbps`: the practical rate of PCIe Gen4 x16.
pub const DEFAULT_CHECKPOINT_GBPS: f64 = 25.0;

/// Most devices a config may declare.
pub const MAX_DEVICES: usize = 64;

/// The simulated devices, in NVML / PCI order.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub devices: Vec<DeviceConfig>,
    /// The checkpoint API (`cuCheckpointProcess*`, driver 570 / CUDA 12.8) is offered
    /// (top-level key `checkpoint`, default true). False models an older driver: the
    /// functions return `CUDA_ERROR_NOT_SUPPORTED` and `cuGetProcAddress` does not find them.
    pub checkpoint: bool,
    /// How fast checkpoint and restore copy a process's device memory to and from the host,
    /// in GB/s (1e9 bytes/s; top-level key `checkpoint_gbps`, default
    /// [`DEFAULT_CHECKPOINT_GBPS`]): each takes bytes / rate of simulated (wall-clock) time.
    pub checkpoint_gbps: f64,
    /// The file it came from; `None` for the built-in default.
    pub source: Option<PathBuf>,
}

/// One simulated GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceConfig {
    pub name: String,
    /// Device memory in bytes.
    pub memory: u64,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    pub sm_count: u32,
    pub architecture: Architecture,
    /// (major, minor).
    pub compute_capability: (u32, u32),
    /// Supported graphics clocks in MHz, highest first.
    pub graphics_clocks: Vec<u32>,
    pub max_clock_mhz: u32,
    pub min_clock_mhz: u32,
    /// The default applications clock.
    pub default_clock_mhz: u32,
    pub memory_clock_mhz: u32,
    pub power_idle_mw: u32,
    pub power_max_mw: u32,
    pub power_limit_min_mw: u32,
    pub power_limit_max_mw: u32,
    pub power_limit_default_mw: u32,
    /// Whether `nvmlDeviceSetGpuLockedClocks` is supported.
    pub clock_locking: bool,
    /// Whether `nvmlDeviceSetPowerManagementLimit` is supported.
    pub power_limit_settable: bool,
    /// Peak dense tensor TFLOPS.
    pub tflops: f64,
    /// Device memory a context takes when created, in bytes.
    pub context_overhead: u64,
    pub pci: PciAddress,
    /// Simulated duration of one wave of thread blocks (one block per SM) at the maximum
    /// clock, in microseconds.
    pub kernel_wave_us: u32,
    /// Exponent γ of the power model `P = P_idle + (P_max − P_idle)·u·(f/f_max)^γ`.
    pub power_exponent: f64,
    /// σ of the speed curve, 0..=1: a kernel at clock `f` runs at speed
    /// `(1 − σ) + σ·f/f_max` of its speed at `f_max` (1: proportional to the clock).
    pub clock_sensitivity: f64,
    /// Time-slicing between contexts: how long the device runs one context's queued work
    /// while another's waits before it switches (ns; the hardware's time slice).
    pub timeslice_ns: u64,
    /// What one switch between contexts costs while another context's work is queued (ns;
    /// 0: switches are free). See `model::slice_start`.
    pub context_switch_ns: u64,
    /// Fans NVML reports (`nvmlDeviceGetNumFans`); 0, as on SXM boards, makes every fan
    /// query NVML_ERROR_NOT_SUPPORTED.
    pub fans: u32,
    /// Board serial number (`nvmlDeviceGetSerial`).
    pub serial: String,
    /// `nvmlDeviceGetVbiosVersion`.
    pub vbios_version: String,
    /// `nvmlDeviceGetBoardPartNumber`.
    pub board_part_number: String,
    /// Highest PCIe generation of the GPU and its slot.
    pub pcie_generation: u32,
    /// PCIe link width (lanes).
    pub pcie_width: u32,
    /// ECC enabled (current and pending mode).
    pub ecc: bool,
    /// Size of the BAR1 aperture in bytes.
    pub bar1_memory: u64,
    /// Rate of copies between host and device memory and between devices (`cuMemcpyHtoD`,
    /// `DtoH`, `Peer`, …), in GB/s (1e9 bytes/s).
    pub copy_gbps: f64,
    /// Rate of copies and fills within the device's memory (`cuMemcpyDtoD`, `cuMemset*`),
    /// in GB/s.
    pub device_copy_gbps: f64,
}

/// GPU architecture, with NVML's `nvmlDeviceArchitecture_t` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Kepler,
    Maxwell,
    Pascal,
    Volta,
    Turing,
    Ampere,
    Ada,
    Hopper,
    Blackwell,
}

impl Architecture {
    const ALL: [Architecture; 9] = [
        Architecture::Kepler,
        Architecture::Maxwell,
        Architecture::Pascal,
        Architecture::Volta,
        Architecture::Turing,
        Architecture::Ampere,
        Architecture::Ada,
        Architecture::Hopper,
        Architecture::Blackwell,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Architecture::Kepler => "kepler",
            Architecture::Maxwell => "maxwell",
            Architecture::Pascal => "pascal",
            Architecture::Volta => "volta",
            Architecture::Turing => "turing",
            Architecture::Ampere => "ampere",
            Architecture::Ada => "ada",
            Architecture::Hopper => "hopper",
            Architecture::Blackwell => "blackwell",
        }
    }

    pub fn parse(name: &str) -> Option<Architecture> {
        Architecture::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(name.trim()))
    }

    /// NVML's `NVML_DEVICE_ARCH_*` value.
    pub fn nvml_value(self) -> u32 {
        match self {
            Architecture::Kepler => nvml::NVML_DEVICE_ARCH_KEPLER,
            Architecture::Maxwell => nvml::NVML_DEVICE_ARCH_MAXWELL,
            Architecture::Pascal => nvml::NVML_DEVICE_ARCH_PASCAL,
            Architecture::Volta => nvml::NVML_DEVICE_ARCH_VOLTA,
            Architecture::Turing => nvml::NVML_DEVICE_ARCH_TURING,
            Architecture::Ampere => nvml::NVML_DEVICE_ARCH_AMPERE,
            Architecture::Ada => nvml::NVML_DEVICE_ARCH_ADA,
            Architecture::Hopper => nvml::NVML_DEVICE_ARCH_HOPPER,
            Architecture::Blackwell => nvml::NVML_DEVICE_ARCH_BLACKWELL,
        }
    }

    /// The compute capability of the architecture's data-centre part.
    pub fn default_compute_capability(self) -> (u32, u32) {
        match self {
            Architecture::Kepler => (3, 7),
            Architecture::Maxwell => (5, 2),
            Architecture::Pascal => (6, 0),
            Architecture::Volta => (7, 0),
            Architecture::Turing => (7, 5),
            Architecture::Ampere => (8, 0),
            Architecture::Ada => (8, 9),
            Architecture::Hopper => (9, 0),
            Architecture::Blackwell => (10, 0),
        }
    }

    /// FP32 CUDA cores per SM of the data-centre part (`nvmlDeviceGetNumGpuCores`).
    pub fn cores_per_sm(self) -> u32 {
        match self {
            Architecture::Kepler => 192,
            Architecture::Maxwell | Architecture::Ada | Architecture::Hopper => 128,
            Architecture::Blackwell => 128,
            Architecture::Pascal
            | Architecture::Volta
            | Architecture::Turing
            | Architecture::Ampere => 64,
        }
    }
}

/// PCI location of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
}

impl PciAddress {
    /// `00000000:18:00.0`, NVML's `busId` form.
    pub fn bus_id(&self) -> String {
        format!("{:08X}:{:02X}:{:02X}.0", self.domain, self.bus, self.device)
    }

    /// `0000:18:00.0`, NVML's `busIdLegacy` and CUDA's `cuDeviceGetPCIBusId` form.
    pub fn bus_id_legacy(&self) -> String {
        format!("{:04X}:{:02X}:{:02X}.0", self.domain, self.bus, self.device)
    }

    /// Reads `DDDDDDDD:BB:DD.F`, `DDDD:BB:DD.F` or `BB:DD.F` (hex, any case).
    pub fn parse(text: &str) -> Option<PciAddress> {
        let text = text.trim();
        let (rest, _function) = text.rsplit_once('.')?;
        let parts: Vec<&str> = rest.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [d, b, v] => (*d, *b, *v),
            [b, v] => ("0", *b, *v),
            _ => return None,
        };
        let hex = |s: &str, max: u32| u32::from_str_radix(s, 16).ok().filter(|v| *v <= max);
        Some(PciAddress {
            domain: hex(domain, u32::MAX)?,
            bus: hex(bus, 0xff)?,
            device: hex(device, 0x1f)?,
        })
    }
}

/// Why a config could not be used; its Display is the one stderr line the driver prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, or `$FAKEGPU_CONFIG` when it could not be read at all.
    pub origin: String,
    /// Index of the `[[device]]` entry, when the problem is inside one.
    pub device: Option<usize>,
    /// The offending key, when there is one.
    pub key: Option<String>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fakegpu: config {}", self.origin)?;
        if let Some(device) = self.device {
            write!(f, ": device[{device}]")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": key `{key}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// The config the driver uses: `$FAKEGPU_CONFIG`, or the built-in single H100.
pub fn load() -> Result<Config, ConfigError> {
    match std::env::var_os(CONFIG_ENV) {
        Some(path) if !path.is_empty() => load_from(Path::new(&path)),
        _ => Ok(default_config()),
    }
}

/// Read and check one config file.
pub fn load_from(path: &Path) -> Result<Config, ConfigError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        origin: origin.clone(),
        device: None,
        key: None,
        message: format!("cannot read: {e}"),
    })?;
    let mut config = parse(&text, &origin)?;
    config.source = Some(path.to_path_buf());
    Ok(config)
}

/// One "NVIDIA H100 80GB HBM3" with 80 GiB: what runs when no config is given.
pub fn default_config() -> Config {
    Config {
        devices: vec![Preset::H100.device("NVIDIA H100 80GB HBM3", 80 << 30, 0)],
        checkpoint: true,
        checkpoint_gbps: DEFAULT_CHECKPOINT_GBPS,
        source: None,
    }
}

/// Parse config text; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
    let err = |device: Option<usize>, key: Option<&str>, message: String| ConfigError {
        origin: origin.to_string(),
        device,
        key: key.map(str::to_string),
        message,
    };
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        err(None, None, format!("not valid TOML: {}", e.message()))
    })?;
    for key in table.keys() {
        if !["device", "checkpoint", "checkpoint_gbps"].contains(&key.as_str()) {
            return Err(err(
                None,
                Some(key),
                "unknown key (expected `checkpoint`, `checkpoint_gbps` and [[device]] tables)"
                    .into(),
            ));
        }
    }
    let checkpoint = match table.get("checkpoint") {
        None => true,
        Some(toml::Value::Boolean(on)) => *on,
        Some(_) => {
            return Err(err(
                None,
                Some("checkpoint"),
                "must be true or false".into(),
            ))
        }
    };
    let checkpoint_gbps = match table.get("checkpoint_gbps") {
        None => DEFAULT_CHECKPOINT_GBPS,
        Some(v) => number(v).filter(|x| *x > 0.0).ok_or_else(|| {
            err(
                None,
                Some("checkpoint_gbps"),
                "must be a positive number of GB/s".into(),
            )
        })?,
    };
    let entries = match table.get("device") {
        Some(toml::Value::Array(entries)) if !entries.is_empty() => entries,
        Some(_) => {
            return Err(err(
                None,
                Some("device"),
                "must be a non-empty array of [[device]] tables".into(),
            ))
        }
        None => {
            return Err(err(
                None,
                Some("device"),
                "missing: declare at least one [[device]]".into(),
            ))
        }
    };
    if entries.len() > MAX_DEVICES {
        return Err(err(
            None,
            Some("device"),
            format!(
                "{} devices; at most {MAX_DEVICES} are simulated",
                entries.len()
            ),
        ));
    }
    let mut devices = Vec::with_capacity(entries.len());
    for (index, entry) in entries.iter().enumerate() {
        let toml::Value::Table(entry) = entry else {
            return Err(err(Some(index), None, "must be a table".into()));
        };
        let device =
            parse_device(index, entry).map_err(|(key, message)| err(Some(index), key, message))?;
        devices.push(device);
    }
    check_unique(&devices).map_err(|(index, key, message)| err(Some(index), Some(key), message))?;
    Ok(Config {
        devices,
        checkpoint,
        checkpoint_gbps,
        source: None,
    })
}

type KeyError = (Option<&'static str>, String);

const KEYS: &[&str] = &[
    "name",
    "memory",
    "uuid",
    "sm_count",
    "architecture",
    "compute_capability",
    "graphics_clocks",
    "max_clock_mhz",
    "min_clock_mhz",
    "default_clock_mhz",
    "memory_clock_mhz",
    "power_idle_w",
    "power_max_w",
    "power_limit_min_w",
    "power_limit_max_w",
    "power_limit_default_w",
    "clock_locking",
    "power_limit_settable",
    "tflops",
    "context_overhead",
    "pci_bus",
    "kernel_wave_us",
    "power_exponent",
    "clock_sensitivity",
    "timeslice",
    "context_switch",
    "fans",
    "serial",
    "vbios_version",
    "board_part_number",
    "pcie_generation",
    "pcie_width",
    "ecc",
    "bar1_memory",
    "copy_gbps",
    "device_copy_gbps",
];

fn parse_device(index: usize, t: &toml::Table) -> Result<DeviceConfig, KeyError> {
    for key in t.keys() {
        if !KEYS.contains(&key.as_str()) {
            return Err((
                None,
                format!("unknown key `{key}` (known: {})", KEYS.join(", ")),
            ));
        }
    }
    let name = match t.get("name") {
        Some(toml::Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(_) => return Err((Some("name"), "must be a non-empty string".into())),
        None => return Err((Some("name"), "missing (required)".into())),
    };
    let memory = match t.get("memory") {
        Some(v) => size(v).map_err(|m| (Some("memory"), m))?,
        None => return Err((Some("memory"), "missing (required)".into())),
    };
    if memory == 0 {
        return Err((Some("memory"), "must be more than 0 bytes".into()));
    }
    let mut d = Preset::for_name(&name).device(&name, memory, index);

    if let Some(v) = t.get("uuid") {
        d.uuid = string(v).map_err(|m| (Some("uuid"), m))?;
        if !valid_uuid(&d.uuid) {
            return Err((
                Some("uuid"),
                format!(
                    "{:?} is not of the form GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (hex)",
                    d.uuid
                ),
            ));
        }
    }
    if let Some(v) = t.get("sm_count") {
        d.sm_count = positive_u32(v).map_err(|m| (Some("sm_count"), m))?;
    }
    if let Some(v) = t.get("architecture") {
        let s = string(v).map_err(|m| (Some("architecture"), m))?;
        d.architecture = Architecture::parse(&s).ok_or_else(|| {
            let known: Vec<&str> = Architecture::ALL.iter().map(|a| a.name()).collect();
            (
                Some("architecture"),
                format!("unknown architecture {s:?} (known: {})", known.join(", ")),
            )
        })?;
        d.compute_capability = d.architecture.default_compute_capability();
    }
    if let Some(v) = t.get("compute_capability") {
        let s = string(v).map_err(|m| (Some("compute_capability"), m))?;
        d.compute_capability = parse_cc(&s).ok_or_else(|| {
            (
                Some("compute_capability"),
                format!("{s:?} is not MAJOR.MINOR, e.g. \"9.0\""),
            )
        })?;
    }

    let clocks_given = t.get("graphics_clocks").is_some();
    if let Some(v) = t.get("graphics_clocks") {
        let toml::Value::Array(items) = v else {
            return Err((
                Some("graphics_clocks"),
                "must be an array of MHz values".into(),
            ));
        };
        let mut clocks = Vec::with_capacity(items.len());
        for item in items {
            clocks.push(positive_u32(item).map_err(|m| (Some("graphics_clocks"), m))?);
        }
        if clocks.is_empty() {
            return Err((Some("graphics_clocks"), "must not be empty".into()));
        }
        clocks.sort_unstable_by(|a, b| b.cmp(a));
        clocks.dedup();
        d.max_clock_mhz = clocks[0];
        d.min_clock_mhz = clocks[clocks.len() - 1];
        d.graphics_clocks = clocks;
    }
    for (key, field) in [
        ("max_clock_mhz", &mut d.max_clock_mhz),
        ("min_clock_mhz", &mut d.min_clock_mhz),
    ] {
        if let Some(v) = t.get(key) {
            *field = positive_u32(v).map_err(|m| (Some(key), m))?;
        }
    }
    if d.min_clock_mhz > d.max_clock_mhz {
        return Err((
            Some("min_clock_mhz"),
            format!(
                "{} MHz is above max_clock_mhz {} MHz",
                d.min_clock_mhz, d.max_clock_mhz
            ),
        ));
    }
    if clocks_given {
        if d.graphics_clocks
            .iter()
            .any(|&c| c > d.max_clock_mhz || c < d.min_clock_mhz)
        {
            return Err((
                Some("graphics_clocks"),
                "lies outside min_clock_mhz..=max_clock_mhz".into(),
            ));
        }
    } else {
        d.graphics_clocks = clock_steps(d.max_clock_mhz, d.min_clock_mhz);
    }
    d.default_clock_mhz = d.default_clock_mhz.clamp(d.min_clock_mhz, d.max_clock_mhz);
    if let Some(v) = t.get("default_clock_mhz") {
        d.default_clock_mhz = positive_u32(v).map_err(|m| (Some("default_clock_mhz"), m))?;
        if !d.graphics_clocks.contains(&d.default_clock_mhz) {
            return Err((
                Some("default_clock_mhz"),
                format!("{} MHz is not one of graphics_clocks", d.default_clock_mhz),
            ));
        }
    }
    if let Some(v) = t.get("memory_clock_mhz") {
        d.memory_clock_mhz = positive_u32(v).map_err(|m| (Some("memory_clock_mhz"), m))?;
    }

    let power_keys: [(&'static str, &mut u32); 5] = [
        ("power_idle_w", &mut d.power_idle_mw),
        ("power_max_w", &mut d.power_max_mw),
        ("power_limit_min_w", &mut d.power_limit_min_mw),
        ("power_limit_max_w", &mut d.power_limit_max_mw),
        ("power_limit_default_w", &mut d.power_limit_default_mw),
    ];
    let explicit_limit_max = t.contains_key("power_limit_max_w");
    let explicit_limit_default = t.contains_key("power_limit_default_w");
    for (key, field) in power_keys {
        if let Some(v) = t.get(key) {
            *field = watts_to_mw(v).map_err(|m| (Some(key), m))?;
        }
    }
    // A device that only changes power_max_w keeps its limits consistent with it.
    if t.contains_key("power_max_w") {
        if !explicit_limit_max {
            d.power_limit_max_mw = d.power_max_mw;
        }
        if !explicit_limit_default {
            d.power_limit_default_mw = d.power_limit_max_mw;
        }
        d.power_limit_min_mw = d.power_limit_min_mw.min(d.power_limit_max_mw);
    }
    if d.power_idle_mw > d.power_max_mw {
        return Err((Some("power_idle_w"), "is above power_max_w".into()));
    }
    if d.power_limit_min_mw > d.power_limit_max_mw {
        return Err((
            Some("power_limit_min_w"),
            "is above power_limit_max_w".into(),
        ));
    }
    if !(d.power_limit_min_mw..=d.power_limit_max_mw).contains(&d.power_limit_default_mw) {
        return Err((
            Some("power_limit_default_w"),
            "lies outside power_limit_min_w..=power_limit_max_w".into(),
        ));
    }

    for (key, field) in [
        ("clock_locking", &mut d.clock_locking),
        ("power_limit_settable", &mut d.power_limit_settable),
    ] {
        if let Some(v) = t.get(key) {
            *field = v
                .as_bool()
                .ok_or((Some(key), "must be true or false".to_string()))?;
        }
    }
    if let Some(v) = t.get("tflops") {
        d.tflops = number(v)
            .filter(|x| *x > 0.0)
            .ok_or((Some("tflops"), "must be a positive number".to_string()))?;
    }
    if let Some(v) = t.get("context_overhead") {
        d.context_overhead = size(v).map_err(|m| (Some("context_overhead"), m))?;
        if d.context_overhead > d.memory {
            return Err((
                Some("context_overhead"),
                "is more than the device memory".into(),
            ));
        }
    }
    if let Some(v) = t.get("pci_bus") {
        d.pci = match v {
            toml::Value::Integer(bus) if (0..=0xff).contains(bus) => PciAddress {
                domain: 0,
                bus: *bus as u32,
                device: 0,
            },
            toml::Value::String(s) => PciAddress::parse(s).ok_or((
                Some("pci_bus"),
                format!("{s:?} is not a PCI address like \"0000:18:00.0\""),
            ))?,
            _ => {
                return Err((
                    Some("pci_bus"),
                    "must be a bus number 0..=255 or a string like \"0000:18:00.0\"".into(),
                ))
            }
        };
    }
    if let Some(v) = t.get("kernel_wave_us") {
        d.kernel_wave_us = positive_u32(v).map_err(|m| (Some("kernel_wave_us"), m))?;
    }
    if let Some(v) = t.get("power_exponent") {
        d.power_exponent = number(v).filter(|x| (0.5..=5.0).contains(x)).ok_or((
            Some("power_exponent"),
            "must be a number in 0.5..=5".to_string(),
        ))?;
    }
    if let Some(v) = t.get("clock_sensitivity") {
        d.clock_sensitivity = number(v).filter(|x| (0.0..=1.0).contains(x)).ok_or((
            Some("clock_sensitivity"),
            "must be a number in 0..=1".to_string(),
        ))?;
    }
    if let Some(v) = t.get("timeslice") {
        d.timeslice_ns = duration(v, false).map_err(|m| (Some("timeslice"), m))?;
    }
    if let Some(v) = t.get("context_switch") {
        d.context_switch_ns = duration(v, true).map_err(|m| (Some("context_switch"), m))?;
    }
    parse_monitoring_keys(&mut d, t)?;
    for (key, field) in [
        ("copy_gbps", &mut d.copy_gbps),
        ("device_copy_gbps", &mut d.device_copy_gbps),
    ] {
        if let Some(v) = t.get(key) {
            *field = number(v)
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or((Some(key), "must be a positive number of GB/s".to_string()))?;
        }
    }
    Ok(d)
}

/// The keys only monitoring queries read: fans, board strings, PCIe link, ECC, BAR1.
fn parse_monitoring_keys(d: &mut DeviceConfig, t: &toml::Table) -> Result<(), KeyError> {
    if let Some(v) = t.get("fans") {
        d.fans = match v {
            toml::Value::Integer(n) if (0..=MAX_FANS).contains(n) => *n as u32,
            _ => {
                return Err((
                    Some("fans"),
                    format!("must be a number of fans 0..={MAX_FANS}"),
                ))
            }
        };
    }
    for (key, field, max_len, allowed) in [
        (
            "serial",
            &mut d.serial,
            SERIAL_MAX_LEN,
            "letters and digits",
        ),
        (
            "vbios_version",
            &mut d.vbios_version,
            VBIOS_MAX_LEN,
            "printable ASCII without spaces",
        ),
        (
            "board_part_number",
            &mut d.board_part_number,
            PART_NUMBER_MAX_LEN,
            "printable ASCII without spaces",
        ),
    ] {
        if let Some(v) = t.get(key) {
            let text = string(v).map_err(|m| (Some(key), m))?;
            let ok_char = |c: char| {
                if key == "serial" {
                    c.is_ascii_alphanumeric()
                } else {
                    c.is_ascii_graphic()
                }
            };
            if text.is_empty() || text.len() > max_len || !text.chars().all(ok_char) {
                return Err((
                    Some(key),
                    format!("{text:?} must be 1..={max_len} characters, {allowed}"),
                ));
            }
            *field = text;
        }
    }
    if let Some(v) = t.get("pcie_generation") {
        d.pcie_generation = match v {
            toml::Value::Integer(g) if (1..=6).contains(g) => *g as u32,
            _ => return Err((Some("pcie_generation"), "must be 1..=6".into())),
        };
    }
    if let Some(v) = t.get("pcie_width") {
        d.pcie_width = match v {
            toml::Value::Integer(w) if [1, 2, 4, 8, 16, 32].contains(w) => *w as u32,
            _ => {
                return Err((
                    Some("pcie_width"),
                    "must be a link width of 1, 2, 4, 8, 16 or 32 lanes".into(),
                ))
            }
        };
    }
    if let Some(v) = t.get("ecc") {
        d.ecc = v
            .as_bool()
            .ok_or((Some("ecc"), "must be true or false".to_string()))?;
    }
    if let Some(v) = t.get("bar1_memory") {
        d.bar1_memory = size(v).map_err(|m| (Some("bar1_memory"), m))?;
        if d.bar1_memory == 0 {
            return Err((Some("bar1_memory"), "must be more than 0 bytes".into()));
        }
    }
    Ok(())
}

fn check_unique(devices: &[DeviceConfig]) -> Result<(), (usize, &'static str, String)> {
    for (i, d) in devices.iter().enumerate() {
        for earlier in &devices[..i] {
            if earlier.uuid.eq_ignore_ascii_case(&d.uuid) {
                return Err((i, "uuid", format!("{} is used by two devices", d.uuid)));
            }
            if earlier.serial == d.serial {
                return Err((i, "serial", format!("{} is used by two devices", d.serial)));
            }
            if earlier.pci == d.pci {
                return Err((
                    i,
                    "pci_bus",
                    format!("{} is used by two devices", d.pci.bus_id_legacy()),
                ));
            }
        }
    }
    Ok(())
}

fn string(v: &toml::Value) -> Result<String, String> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| "must be a string".to_string())
}

fn number(v: &toml::Value) -> Option<f64> {
    match v {
        toml::Value::Integer(i) => Some(*i as f64),
        toml::Value::Float(f) if f.is_finite() => Some(*f),
        _ => None,
    }
}

/// A duration: a string like `"1ms"`, `"75us"` (`model::parse_duration_ns`) or whole
/// nanoseconds; 0 only where `zero` allows it.
fn duration(v: &toml::Value, zero: bool) -> Result<u64, String> {
    let what = if zero {
        "must be a duration like \"75us\" or \"1ms\", or 0"
    } else {
        "must be a positive duration like \"75us\" or \"1ms\""
    };
    let ns = match v {
        toml::Value::Integer(i) if *i >= 0 && *i as u64 <= crate::duration::MAX_NS => *i as u64,
        toml::Value::String(s) if zero && s.trim() == "0" => 0,
        toml::Value::String(s) => crate::duration::parse_duration_ns(s)?,
        _ => return Err(what.into()),
    };
    if ns == 0 && !zero {
        return Err(what.into());
    }
    Ok(ns)
}

fn positive_u32(v: &toml::Value) -> Result<u32, String> {
    match v {
        toml::Value::Integer(i) if *i > 0 && *i <= i64::from(u32::MAX) => Ok(*i as u32),
        _ => Err("must be a positive integer".into()),
    }
}

fn size(v: &toml::Value) -> Result<u64, String> {
    match v {
        toml::Value::Integer(i) if *i >= 0 => Ok(*i as u64),
        toml::Value::String(s) => vgpu_abi::size::parse_size(s).map_err(|e| e.to_string()),
        _ => Err("must be a size like \"16GiB\" or a number of bytes".into()),
    }
}

fn watts_to_mw(v: &toml::Value) -> Result<u32, String> {
    number(v)
        .filter(|w| *w > 0.0 && *w < 1_000_000.0)
        .map(|w| (w * 1000.0).round() as u32)
        .ok_or_else(|| "must be a positive number of watts".into())
}

fn parse_cc(s: &str) -> Option<(u32, u32)> {
    let (major, minor) = s.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

fn valid_uuid(uuid: &str) -> bool {
    let Some(hex) = uuid.strip_prefix("GPU-") else {
        return false;
    };
    let groups: Vec<&str> = hex.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Highest to lowest in 15 MHz steps (the lowest is always included).
fn clock_steps(max: u32, min: u32) -> Vec<u32> {
    let mut clocks: Vec<u32> = (0..)
        .map(|i| max.saturating_sub(15 * i))
        .take_while(|&c| c > min)
        .collect();
    clocks.push(min);
    clocks
}

/// The deterministic default UUID of device `index` called `name`.
pub fn default_uuid(index: usize, name: &str) -> String {
    // FNV-1a, twice with different offsets: stable across Rust versions, unlike std's hasher.
    let fnv = |offset: u64| {
        let mut h = offset;
        for b in index.to_le_bytes().iter().chain(name.as_bytes()) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    };
    let (a, b) = (fnv(0xcbf2_9ce4_8422_2325), fnv(0x6c62_272e_07bb_0142));
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

/// Most fans a device may declare.
pub const MAX_FANS: i64 = 8;
/// Longest serial: NVML_DEVICE_SERIAL_BUFFER_SIZE (30) less the NUL.
const SERIAL_MAX_LEN: usize = 29;
/// Longest VBIOS version: NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE (32) less the NUL.
const VBIOS_MAX_LEN: usize = 31;
/// Longest board part number: NVML_DEVICE_PART_NUMBER_BUFFER_SIZE (80) less the NUL.
const PART_NUMBER_MAX_LEN: usize = 79;

/// The default serial of device `index`: 13 digits, as NVIDIA's boards have, distinct for
/// every index (the index is the last two digits).
pub fn default_serial(index: usize, name: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!(
        "{}",
        1_650_000_000_000 + (h % 10_000_000) * 100 + (index as u64 % 100)
    )
}

/// PCI buses of an 8-GPU HGX board.
const DEFAULT_BUSES: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

/// The figures a device gets for every key the config leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Preset {
    H100,
    A100,
}

impl Preset {
    fn for_name(name: &str) -> Preset {
        if name.to_ascii_uppercase().contains("A100") {
            Preset::A100
        } else {
            Preset::H100
        }
    }

    fn device(self, name: &str, memory: u64, index: usize) -> DeviceConfig {
        // Eight GPUs per PCI domain, on the buses of an HGX board.
        let pci = PciAddress {
            domain: (index / 8) as u32,
            bus: DEFAULT_BUSES[index % 8],
            device: 0,
        };
        let common = DeviceConfig {
            name: name.to_string(),
            memory,
            uuid: default_uuid(index, name),
            sm_count: 132,
            architecture: Architecture::Hopper,
            compute_capability: (9, 0),
            graphics_clocks: clock_steps(1980, 345),
            max_clock_mhz: 1980,
            min_clock_mhz: 345,
            default_clock_mhz: 1980,
            memory_clock_mhz: 2619,
            power_idle_mw: 70_000,
            power_max_mw: 700_000,
            power_limit_min_mw: 200_000,
            power_limit_max_mw: 700_000,
            power_limit_default_mw: 700_000,
            clock_locking: true,
            power_limit_settable: true,
            tflops: 989.0,
            context_overhead: 0,
            pci,
            kernel_wave_us: 100,
            power_exponent: 2.5,
            clock_sensitivity: 1.0,
            // Calibrated from an H100 SXM (issue 27): two tenants of matmuls side by side,
            // one throttled to 30 % of busy time, delivered 0.30 + 0.62 of what each does
            // alone: ~7 % of the GPU lost to switching. Two saturating contexts of 1 ms
            // kernels here switch at every kernel (75 µs / 1.075 ms = 7.0 %); contexts with
            // long queued runs are cut every time slice (75 µs per 1 ms slice, ~7 %).
            timeslice_ns: 1_000_000,
            context_switch_ns: 75_000,
            // SXM boards are cooled by the chassis: no fans of their own.
            fans: 0,
            serial: default_serial(index, name),
            vbios_version: "96.00.99.00.01".into(),
            board_part_number: "692-2G520-0200-000".into(),
            pcie_generation: 5,
            pcie_width: 16,
            ecc: true,
            // The aperture is the device memory rounded up to a power of two (128 GiB on an
            // 80 GB H100, 64 GiB on a 40 GB A100).
            bar1_memory: memory.checked_next_power_of_two().unwrap_or(memory),
            // PCIe Gen5 x16 in practice; about half of HBM3's 3.35 TB/s (read + write).
            copy_gbps: 50.0,
            device_copy_gbps: 1500.0,
        };
        match self {
            Preset::H100 => common,
            Preset::A100 => DeviceConfig {
                sm_count: 108,
                architecture: Architecture::Ampere,
                compute_capability: (8, 0),
                graphics_clocks: clock_steps(1410, 210),
                max_clock_mhz: 1410,
                min_clock_mhz: 210,
                default_clock_mhz: 1410,
                memory_clock_mhz: 1215,
                power_idle_mw: 50_000,
                power_max_mw: 400_000,
                power_limit_min_mw: 100_000,
                power_limit_max_mw: 400_000,
                power_limit_default_mw: 400_000,
                tflops: 312.0,
                vbios_version: "92.00.45.00.03".into(),
                board_part_number: "692-2G506-0200-003".into(),
                pcie_generation: 4,
                // PCIe Gen4 x16 in practice; about half of HBM2e's 1.55 TB/s.
                copy_gbps: 25.0,
                device_copy_gbps: 700.0,
                ..common
            },
        }
    }
}

impl DeviceConfig {
    /// The PCI device id NVML reports (`device << 16 | vendor`).
    pub fn pci_device_id(&self) -> u32 {
        let device: u32 = match self.architecture {
            Architecture::Hopper => 0x2330,
            Architecture::Ampere => 0x20b0,
            _ => 0x1db1,
        };
        (device << 16) | 0x10de
    }

    /// The lowest supported graphics clock.
    pub fn lowest_clock_mhz(&self) -> u32 {
        self.graphics_clocks
            .last()
            .copied()
            .unwrap_or(self.min_clock_mhz)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_one_h100() {
        let c = default_config();
        assert_eq!(c.devices.len(), 1);
        let d = &c.devices[0];
        assert_eq!(d.name, "NVIDIA H100 80GB HBM3");
        assert_eq!(d.memory, 80 << 30);
        assert_eq!(
            (d.sm_count, d.compute_capability, d.architecture),
            (132, (9, 0), Architecture::Hopper)
        );
        assert_eq!(
            (d.max_clock_mhz, d.lowest_clock_mhz(), d.memory_clock_mhz),
            (1980, 345, 2619)
        );
        assert_eq!(d.graphics_clocks.len(), 110);
        assert!(d.graphics_clocks.windows(2).all(|w| w[0] - w[1] == 15));
        assert_eq!(
            (d.power_limit_min_mw, d.power_limit_max_mw),
            (200_000, 700_000)
        );
        assert!(valid_uuid(&d.uuid), "{}", d.uuid);
    }

    #[test]
    fn two_devices_with_presets() {
        let c = parse(
            r#"
            [[device]]
            name = "NVIDIA A100-SXM4-40GB"
            memory = "40GiB"
            [[device]]
            name = "NVIDIA A100-SXM4-40GB"
            memory = 42949672960
            uuid = "GPU-00000000-1111-2222-3333-444444444444"
            graphics_clocks = [1410, 1200, 800]
            power_max_w = 300
            "#,
            "test.toml",
        )
        .unwrap();
        assert_eq!(c.devices.len(), 2);
        let (a, b) = (&c.devices[0], &c.devices[1]);
        assert_eq!(a.memory, 40 << 30);
        assert_eq!(
            (a.architecture, a.sm_count, a.max_clock_mhz),
            (Architecture::Ampere, 108, 1410)
        );
        assert_ne!(a.uuid, b.uuid);
        assert_ne!(a.pci, b.pci);
        assert_eq!(b.uuid, "GPU-00000000-1111-2222-3333-444444444444");
        assert_eq!(b.graphics_clocks, vec![1410, 1200, 800]);
        assert_eq!(
            (
                b.min_clock_mhz,
                b.power_limit_max_mw,
                b.power_limit_default_mw
            ),
            (800, 300_000, 300_000)
        );
    }

    #[test]
    fn errors_name_device_and_key() {
        let e = parse("[[device]]\nname = \"x\"\nmemory = \"lots\"\n", "f.toml").unwrap_err();
        assert_eq!((e.device, e.key.as_deref()), (Some(0), Some("memory")));
        assert!(
            e.to_string()
                .starts_with("fakegpu: config f.toml: device[0]: key `memory`:"),
            "{e}"
        );

        let e = parse(
            "[[device]]\nname = \"x\"\nmemory = 1\nmemry = 2\n",
            "f.toml",
        )
        .unwrap_err();
        assert!(e.to_string().contains("unknown key `memry`"), "{e}");

        let e = parse("[[device]]\nmemory = 1\n", "f.toml").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("name"));

        let e = parse("gpus = 1\n", "f.toml").unwrap_err();
        assert_eq!(e.key.as_deref(), Some("gpus"));

        let e = parse("[[device]\n", "f.toml").unwrap_err();
        assert!(e.message.contains("not valid TOML"));

        let e = parse(
            "[[device]]\nname = \"x\"\nmemory = 1\nmin_clock_mhz = 5000\n",
            "f.toml",
        )
        .unwrap_err();
        assert_eq!(e.key.as_deref(), Some("min_clock_mhz"));

        let dup = "[[device]]\nname = \"x\"\nmemory = 1\npci_bus = 3\n[[device]]\nname = \"y\"\nmemory = 1\npci_bus = 3\n";
        assert_eq!(parse(dup, "f").unwrap_err().device, Some(1));
    }

    #[test]
    fn many_devices_get_distinct_default_addresses() {
        let text: String = (0..64)
            .map(|i| format!("[[device]]\nname = \"gpu{i}\"\nmemory = 1\n"))
            .collect();
        let c = parse(&text, "f").unwrap();
        assert_eq!(c.devices[9].pci.bus_id(), "00000001:2A:00.0");
        let too_many: String = (0..65)
            .map(|i| format!("[[device]]\nname = \"gpu{i}\"\nmemory = 1\n"))
            .collect();
        assert_eq!(
            parse(&too_many, "f").unwrap_err().key.as_deref(),
            Some("device")
        );
    }

    #[test]
    fn pci_addresses() {
        let p = PciAddress::parse("00000000:1A:00.0").unwrap();
        assert_eq!(
            p,
            PciAddress {
                domain: 0,
                bus: 0x1a,
                device: 0
            }
        );
        assert_eq!(p.bus_id(), "00000000:1A:00.0");
        assert_eq!(p.bus_id_legacy(), "0000:1A:00.0");
        assert_eq!(PciAddress::parse("0000:1a:00.0"), Some(p));
        assert_eq!(PciAddress::parse("1a:00.0"), Some(p));
        assert_eq!(PciAddress::parse("zz:00.0"), None);
        assert_eq!(PciAddress::parse("0000:100:00.0"), None);
    }

    #[test]
    fn default_uuid_is_stable_and_distinct() {
        assert_eq!(default_uuid(0, "a"), default_uuid(0, "a"));
        assert_ne!(default_uuid(0, "a"), default_uuid(1, "a"));
        assert!(valid_uuid(&default_uuid(3, "NVIDIA H100 80GB HBM3")));
    }

    #[test]
    fn monitoring_keys() {
        let h100 = &default_config().devices[0];
        assert_eq!((h100.fans, h100.ecc), (0, true));
        assert_eq!((h100.pcie_generation, h100.pcie_width), (5, 16));
        assert_eq!(h100.bar1_memory, 128 << 30);
        assert_eq!(h100.serial.len(), 13);
        assert_eq!(h100.board_part_number, "692-2G520-0200-000");
        let c = parse(
            r#"
            [[device]]
            name = "NVIDIA A100-SXM4-40GB"
            memory = "40GiB"
            [[device]]
            name = "NVIDIA A100-SXM4-40GB"
            memory = "40GiB"
            fans = 2
            serial = "1320421000123"
            vbios_version = "92.00.00.00.01"
            board_part_number = "699-X"
            pcie_generation = 3
            pcie_width = 8
            ecc = false
            bar1_memory = "32GiB"
            "#,
            "t",
        )
        .unwrap();
        let (a, b) = (&c.devices[0], &c.devices[1]);
        assert_eq!((a.pcie_generation, a.bar1_memory, a.fans), (4, 64 << 30, 0));
        assert_ne!(a.serial, b.serial);
        assert_eq!(
            (b.fans, b.serial.as_str(), b.vbios_version.as_str()),
            (2, "1320421000123", "92.00.00.00.01")
        );
        assert_eq!(b.board_part_number, "699-X");
        assert_eq!(
            (b.pcie_generation, b.pcie_width, b.ecc, b.bar1_memory),
            (3, 8, false, 32 << 30)
        );

        let device = "[[device]]\nname = \"x\"\nmemory = 1\n";
        for (line, key) in [
            ("fans = 9", "fans"),
            ("fans = -1", "fans"),
            ("fans = \"2\"", "fans"),
            ("serial = \"\"", "serial"),
            ("serial = \"12 34\"", "serial"),
            ("serial = \"123456789012345678901234567890\"", "serial"),
            ("serial = 12", "serial"),
            ("vbios_version = \"\"", "vbios_version"),
            ("vbios_version = \"9 6\"", "vbios_version"),
            ("board_part_number = \"\"", "board_part_number"),
            ("pcie_generation = 0", "pcie_generation"),
            ("pcie_generation = 7", "pcie_generation"),
            ("pcie_width = 3", "pcie_width"),
            ("pcie_width = 0", "pcie_width"),
            ("ecc = 1", "ecc"),
            ("bar1_memory = 0", "bar1_memory"),
            ("bar1_memory = \"lots\"", "bar1_memory"),
        ] {
            let e = parse(&format!("{device}{line}\n"), "f.toml").unwrap_err();
            assert_eq!(
                (e.device, e.key.as_deref()),
                (Some(0), Some(key)),
                "{line}: {e}"
            );
        }
        let dup = format!("{device}serial = \"7\"\n{device}serial = \"7\"\npci_bus = 9\n");
        let e = parse(&dup, "f").unwrap_err();
        assert_eq!(
            (e.device, e.key.as_deref()),
            (Some(1), Some("serial")),
            "{e}"
        );
    }

    #[test]
    fn clock_sensitivity_key() {
        let h100 = "[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\n";
        assert_eq!(parse(h100, "t").unwrap().devices[0].clock_sensitivity, 1.0);
        let set = parse(&format!("{h100}clock_sensitivity = 0.6\n"), "t").unwrap();
        assert_eq!(set.devices[0].clock_sensitivity, 0.6);
        for bad in ["1.5", "-0.1", "\"fast\""] {
            let e = parse(&format!("{h100}clock_sensitivity = {bad}\n"), "t").unwrap_err();
            assert_eq!(e.key.as_deref(), Some("clock_sensitivity"), "{bad}");
        }
    }

    #[test]
    fn time_slicing_keys() {
        let h100 = "[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\n";
        let d = &parse(h100, "t").unwrap().devices[0];
        assert_eq!((d.timeslice_ns, d.context_switch_ns), (1_000_000, 75_000));
        let set = parse(&format!("{h100}timeslice = \"2ms\"\ncontext_switch = \"40us\"\n"), "t").unwrap();
        assert_eq!((set.devices[0].timeslice_ns, set.devices[0].context_switch_ns), (2_000_000, 40_000));
        let off = parse(&format!("{h100}context_switch = 0\n"), "t").unwrap();
        assert_eq!(off.devices[0].context_switch_ns, 0);
        for (key, bad) in [("timeslice", "0"), ("timeslice", "\"0\""), ("timeslice", "\"1 fortnight\""), ("context_switch", "-1"), ("context_switch", "1.5")] {
            let e = parse(&format!("{h100}{key} = {bad}\n"), "t").unwrap_err();
            assert_eq!(e.key.as_deref(), Some(key), "{key} = {bad}");
        }
    }

    #[test]
    fn checkpoint_key() {
        let devices = "[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\n";
        assert!(parse(devices, "t").unwrap().checkpoint);
        assert!(default_config().checkpoint);
        let off = format!("checkpoint = false\n{devices}");
        assert!(!parse(&off, "t").unwrap().checkpoint);
        let bad = parse(&format!("checkpoint = 1\n{devices}"), "t").unwrap_err();
        assert_eq!(bad.key.as_deref(), Some("checkpoint"));
    }

    #[test]
    fn checkpoint_gbps_key() {
        let devices = "[[device]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory = \"80GiB\"\n";
        assert_eq!(parse(devices, "t").unwrap().checkpoint_gbps, 25.0);
        assert_eq!(default_config().checkpoint_gbps, 25.0);
        for (text, gbps) in [("0.5", 0.5), ("64", 64.0), ("1e-3", 1e-3)] {
            let c = parse(&format!("checkpoint_gbps = {text}\n{devices}"), "t").unwrap();
            assert_eq!(c.checkpoint_gbps, gbps, "{text}");
        }
        for bad in ["0", "-1", "-0.5", "inf", "nan", "\"fast\"", "true"] {
            let e = parse(&format!("checkpoint_gbps = {bad}\n{devices}"), "f.toml").unwrap_err();
            assert_eq!(e.key.as_deref(), Some("checkpoint_gbps"), "{bad}");
            assert!(
                e.to_string()
                    .starts_with("fakegpu: config f.toml: key `checkpoint_gbps`:"),
                "{e}"
            );
        }
        let typo = parse(&format!("checkpoint_gpbs = 1\n{devices}"), "t").unwrap_err();
        assert_eq!(typo.key.as_deref(), Some("checkpoint_gpbs"));
    }
}
