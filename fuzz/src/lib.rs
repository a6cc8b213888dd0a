//! What every fuzz target checks, one function per parser of outside input.
//!
//! Shared by the libFuzzer targets (`fuzz/fuzz_targets/*.rs`, long runs with
//! `cargo +nightly fuzz run TARGET`) and by the test suite (`tests/cli/fuzz_parsers.rs`, short
//! proptest runs, which includes this file as a module). Each function takes arbitrary bytes
//! and panics only when the code under test misbehaves: it panicked itself, accepted what
//! it must refuse, or gave back something it would not accept again.
//!
//! Only the standard library, `vgpu`, `vgpu_abi`, `serde`, `serde_json`, `chrono`, `tempfile`
//! and `libc` are used (all dependencies of `vgpu`), so that the test suite can include this
//! file unchanged.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use chrono::{DateTime, TimeZone as _, Utc};

use vgpu_carbon::intensity;

use vgpu_carbon::intensity::cache::Cache;

use vgpu_carbon::intensity::Reading;

use vgpu_carbon::intensity::Source;

use vgpu_carbon::intensity::SourceError;
use vgpu_store::state::StateError;
use vgpu_store::state::Workload;

/// A target's check.
pub type Check = fn(&[u8]);

/// Every target: its name (the file under `fuzz/fuzz_targets/`) and its check.
pub const TARGETS: &[(&str, Check)] = &[
    ("config", config),
    ("size", size),
    ("workload_record", workload_record),
    ("partitions", partitions),
    ("intent_record", intent_record),
    ("pool_state", pool_state),
    ("carbon_state", carbon_state),
    ("intensity_response", intensity_response),
    ("file_source", file_source),
    ("usage_file", usage_file),
    ("proc_file", proc_file),
    ("board_file", board_file),
    ("vgpu_dir", vgpu_dir),
];

/// A fixed "now" for the sources that read at a time: mid-2024.
pub fn now() -> DateTime<Utc> {
    Utc.timestamp_opt(1_720_000_000, 0).single().expect("a valid timestamp")
}

fn one_line(what: &str, message: &str) {
    assert!(!message.contains('\n'), "{what}: an error must be one line, got {message:?}");
}

// ---- config ----

/// `/etc/vgpu/config.toml`: parsed, then validated the way the commands do.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let config = match vgpu_host::config::Config::parse(&text) {
        Ok(config) => config,
        Err(message) => return one_line("config", &message),
    };
    // `[pool]` is checked while it is parsed: what parses is valid.
    if let Err(e) = config.pool.validate() {
        panic!("a parsed [pool] table fails validation: {e}");
    }
    let carbon = &config.carbon;
    for result in [carbon.max_age().map(drop), carbon.timeout().map(drop), carbon.model_defaults().map(drop)] {
        if let Err(e) = result {
            one_line("config", &e.to_string());
        }
    }
    match carbon.validate() {
        Ok(()) => {
            let tunables = carbon.model_defaults().expect("validate() checked the model's tunables");
            assert!((1.0..=4.0).contains(&tunables.gamma), "gamma {} passed validation", tunables.gamma);
            assert!(!carbon.timeout().expect("validated").is_zero());
            for v in [carbon.value, carbon.fallback, carbon.budget_g_per_hour].into_iter().flatten() {
                assert!(v.is_finite() && v >= 0.0, "{v} passed validation");
            }
            // Building the source reads nothing; a validated config always builds one (or
            // says that none is configured).
            match intensity::from_config(carbon) {
                Ok(source) => one_line("config", &source.describe()),
                Err(SourceError::NotConfigured) => assert!(carbon.source.is_none()),
                Err(e) => panic!("a validated [carbon] table builds no source: {e}"),
            }
        }
        Err(e) => one_line("config", &e.to_string()),
    }
}

// ---- sizes and other command-line values ----

/// `--mem SIZE|PCT%`, `--memory SIZE`, `--tflops`, `kill --signal`.
pub fn size(data: &[u8]) {
    use vgpu_store::admission::MemSpec;
    use vgpu_abi::size::{format_size, parse_size};
    let text = String::from_utf8_lossy(data);
    if let Ok(bytes) = parse_size(&text) {
        assert!(!text.trim().starts_with('-'), "{text:?} is negative but parsed as {bytes}");
    }
    // What vgpu prints, it reads back (to the 2 decimals it prints); the largest sizes print
    // rounded up to 16384 PiB (2^64), one more than fits.
    if let Some(bytes) = parse_size(&text).ok().filter(|&b| !format_size(b).starts_with("16384")) {
        let shown = format_size(bytes);
        let back = parse_size(&shown).unwrap_or_else(|e| panic!("format_size({bytes}) = {shown:?} does not parse: {e}"));
        let error = back.abs_diff(bytes) as f64;
        assert!(error <= bytes as f64 * 0.005 + 1.0, "{bytes} shown as {shown:?} reads back as {back}");
    } else if let Err(e) = parse_size(&text) {
        assert_eq!(e.input, text, "the error names the input");
    }
    match MemSpec::parse(&text) {
        Ok(MemSpec::Bytes(bytes)) => assert!(bytes > 0, "{text:?}: a zero --mem was accepted"),
        Ok(MemSpec::Percent(p)) => assert!(p > 0.0 && p <= 100.0, "{text:?}: {p}% was accepted"),
        Err(message) => one_line("--mem", &message),
    }
    if let Ok(tflops) = vgpu_pool::parse_tflops(&text) {
        assert!(tflops.is_finite() && tflops > 0.0, "{text:?}: --tflops {tflops} was accepted");
    }
    let _ = vgpu::commands::control::parse_signal(&text);
    // Any figure can be shown.
    let mut raw = [0u8; 8];
    let n = data.len().min(8);
    raw[..n].copy_from_slice(&data[..n]);
    let shown = format_size(u64::from_le_bytes(raw));
    assert!(shown.is_ascii() && !shown.is_empty());
}

// ---- state records ----

/// `a` and `b` serialise to the same JSON, but for floats within a relative 1e-15: serde_json
/// (without its `float_roundtrip` feature) may read a long float back one ulp off.
fn assert_same<T: serde::Serialize + std::fmt::Debug>(what: &str, a: &T, b: &T) {
    fn same(a: &serde_json::Value, b: &serde_json::Value) -> bool {
        use serde_json::Value;
        match (a, b) {
            (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
                let (x, y) = (x.as_f64().unwrap_or(f64::NAN), y.as_f64().unwrap_or(f64::NAN));
                x == y || (x - y).abs() <= 1e-15 * x.abs().max(y.abs())
            }
            (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y)),
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
            }
            _ => a == b,
        }
    }
    let json = |v: &T| serde_json::to_value(v).expect("it serialises");
    assert!(same(&json(a), &json(b)), "{what} reads back different: {a:?} is not {b:?}");
}

fn record_path() -> &'static Path {
    // Its name is the record's id (Workload::parse checks it).
    Path::new("/fuzz/workloads/a1b2c3d4.json")
}

fn assert_damaged(what: &str, error: &StateError, path: &Path) {
    match error {
        StateError::Damaged { path: named, .. } => {
            assert_eq!(named, path, "{what}: the error names the file");
            one_line(what, &error.to_string());
        }
        other => panic!("{what}: bytes gave {other:?}, not a Damaged error"),
    }
}

/// A workload record, `<state-dir>/workloads/<id>.json`, and what admission makes of it.
pub fn workload_record(data: &[u8]) {
    let path = record_path();
    let workload = match Workload::parse(data, path) {
        Ok(w) => w,
        Err(e) => return assert_damaged("workload record", &e, path),
    };
    assert_eq!(workload.format, vgpu_store::state::workload::WORKLOAD_FORMAT);
    for name in [&workload.id, &workload.vgpu, &workload.cgroup].into_iter().chain(workload.partition.as_ref()) {
        assert!(vgpu_store::state::is_plain_name(name), "record accepted with the name {name:?}");
    }
    // What it writes back, it reads back.
    let bytes = serde_json::to_vec_pretty(&workload).expect("a record serialises");
    let again = Workload::parse(&bytes, path).unwrap_or_else(|e| panic!("a record written back is refused: {e}"));
    assert_same("a record written back", &again, &workload);
    // Admission sums the reservations of every record: two copies of this one (a damaged
    // file may claim anything) must not break it.
    let records = [workload.clone(), workload.clone()];
    for gpu in &workload.gpus {
        let device = vgpu_store::admission::AdmissionGpu {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
            name: "fuzz".into(),
            memory: gpu.device_bytes,
        };
        let _ = vgpu_store::admission::reserved(&gpu.uuid, &records, &[]);
        let _ = vgpu_store::admission::check_fits(&device, gpu.mem_bytes, &records, &[]);
        let _ = vgpu_store::admission::pick_default(std::slice::from_ref(&device), &records, &[]);
    }
    let _ = workload.matches(&workload.name);
}

/// `<lib-dir>/partitions.json`.
pub fn partitions(data: &[u8]) {
    use vgpu_store::state::Partitions;
    let path = Path::new("/fuzz/lib/partitions.json");
    let parts = match Partitions::parse(data, path) {
        Ok(parts) => parts,
        Err(e) => return assert_damaged("partitions", &e, path),
    };
    assert_eq!(parts.format, vgpu_store::state::partition::PARTITIONS_FORMAT);
    for p in &parts.partitions {
        assert!(vgpu_store::state::partition::valid_name(&p.name), "partition name {:?} accepted", p.name);
    }
    let bytes = serde_json::to_vec(&parts).expect("partitions serialise");
    assert_eq!(Partitions::parse(&bytes, path).expect("partitions written back are read back"), parts);
    let records: [Workload; 0] = [];
    for p in &parts.partitions {
        let _ = vgpu_store::admission::reserved(&p.gpu_uuid, &records, &parts.partitions);
        let _ = p.vgpu_id();
    }
}

/// An intent record, `<state-dir>/intents/<op>-<pid>-<start>.json`, as reconcile lists them.
pub fn intent_record(data: &[u8]) {
    let dir = scratch_dir();
    let store = vgpu_store::state::Store::new(&dir.path().join("state"), &dir.path().join("lib"));
    let intents = store.intents_dir();
    std::fs::create_dir_all(&intents).expect("intents/ is made");
    let path = intents.join("suspend-1-1.json");
    std::fs::write(&path, data).expect("the intent is written");
    let (good, bad) = vgpu_store::state::intent::list(&store);
    assert_eq!(good.len() + bad.len(), 1, "one intent file, {} read and {} refused", good.len(), bad.len());
    for (_, intent) in &good {
        for id in &intent.workloads {
            assert!(vgpu_store::state::is_plain_name(id), "intent accepted with the workload {id:?}");
        }
        let _ = intent.writer_alive();
    }
    for e in &bad {
        assert_damaged("intent", e, &path);
    }
}

/// `<state-dir>/pool.json`: a pool that loads is consistent, and every operation on it
/// keeps it so.
pub fn pool_state(data: &[u8]) {
    use vgpu_pool::KindFilter;
    use vgpu_pool::Pool;
    use vgpu_pool::Priority;
    use vgpu_pool::Request;
    let mut pool: Pool = match serde_json::from_slice(data) {
        Ok(pool) => pool,
        // As `vgpu` reports it (pool_effects::load reads it as a state file).
        Err(e) => {
            let path = PathBuf::from("/fuzz/pool.json");
            return assert_damaged("pool.json", &StateError::Damaged { path: path.clone(), message: e.to_string() }, &path);
        }
    };
    let consistent = |pool: &Pool, after: &str| {
        if let Err(e) = pool.check() {
            panic!("pool inconsistent after {after}: {e}");
        }
    };
    consistent(&pool, "loading");
    let text = serde_json::to_string(&pool).expect("a pool serialises");
    let again: Pool = serde_json::from_str(&text).unwrap_or_else(|e| panic!("a pool written back is refused: {e}"));
    assert_same("a pool written back", &again, &pool);
    let _ = (pool.total_blocks(), pool.free_blocks(), pool.used_blocks(), pool.generation());
    let ids: Vec<String> = pool.allocations().map(|a| a.id.clone()).collect();
    for id in &ids {
        for share in pool.shares(id) {
            let pct = share.compute_percent();
            assert!((1..=100).contains(&pct));
        }
        let _ = (pool.gpu_shares(id), pool.declared_env(id));
    }
    let _ = pool.view();
    let plan = pool.settle();
    if pool.apply(plan).is_ok() {
        consistent(&pool, "settle");
    }
    let blocks = u64::from(data.first().copied().unwrap_or(1)) % 8 + 1;
    let request = Request::new("fuzz-new", "fuzz", blocks, Priority::new(100).expect("in range"), KindFilter::Any);
    if let Ok(plan) = pool.admit(&request) {
        if pool.apply(plan).is_ok() {
            consistent(&pool, "admit");
        }
    }
    pool.compact();
    consistent(&pool, "compact");
    if let Some(id) = ids.first() {
        if pool.release(id).is_ok() {
            consistent(&pool, "release");
        }
    }
    let waiting = Request::new("fuzz-wait", "fuzz", blocks, Priority::DEFAULT, KindFilter::Any);
    if pool.enqueue(&waiting).is_ok() {
        consistent(&pool, "enqueue");
    }
}

// ---- scratch files ----

thread_local! {
    /// One directory per thread (the test suite runs checks on several threads at once).
    static SCRATCH: RefCell<Option<tempfile::TempDir>> = const { RefCell::new(None) };
}

/// A fresh directory for one check, removed when the guard is dropped.
fn scratch_dir() -> tempfile::TempDir {
    SCRATCH.with(|cell| {
        let mut cell = cell.borrow_mut();
        let base = cell.get_or_insert_with(|| tempfile::tempdir().expect("a temporary directory"));
        tempfile::tempdir_in(base.path()).expect("a scratch directory")
    })
}

/// `data` written to `name` in a fresh directory.
fn scratch_file(name: &str, data: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = scratch_dir();
    let path = dir.path().join(name);
    std::fs::write(&path, data).expect("the scratch file is written");
    (dir, path)
}

// ---- carbon state ----

/// A source that fails, named like the remembered reading it should find.
struct Failing(String);

impl Source for Failing {
    fn describe(&self) -> String {
        self.0.clone()
    }
    fn read(&self, _now: DateTime<Utc>) -> Result<Reading, SourceError> {
        Err(SourceError::NotConfigured)
    }
}

/// A source that gives what a parser made of a response.
struct Answer(Result<Reading, String>);

impl Source for Answer {
    fn describe(&self) -> String {
        "fuzz".into()
    }
    fn read(&self, _now: DateTime<Utc>) -> Result<Reading, SourceError> {
        self.0.clone().map_err(|message| SourceError::Malformed { url: "http://fuzz".into(), message })
    }
}

/// Whatever `resolve` hands to the planner is a usable intensity.
fn assert_usable(intensity: &intensity::Intensity, how: &str) {
    assert!(
        intensity.intensity.is_finite() && intensity.intensity >= 0.0,
        "{how}: resolve gave {} gCO2/kWh",
        intensity.intensity
    );
}

/// The carbon files vgpu reads back: the remembered intensity
/// (`<lib-dir>/carbon-intensity.json`), the caps it set (`<state-dir>/carbon-applied.json`)
/// and the decision log (`<lib-dir>/carbon-log.jsonl`).
pub fn carbon_state(data: &[u8]) {
    let (_dir, path) = scratch_file("carbon.json", data);
    let cache = Cache::new(&path);
    if let Ok(Some(entry)) = cache.load() {
        // The source fails now: the remembered reading is what resolve falls back on.
        let policy = intensity::Policy {
            cache: &cache,
            max_age: std::time::Duration::from_secs(u64::from(u32::MAX)),
            fallback: None,
            remember: false,
        };
        if let Ok(found) = intensity::resolve(&Failing(entry.source.clone()), &policy, now()) {
            assert_usable(&found, "a remembered reading");
        }
    }
    let _ = vgpu_carbon::apply::AppliedStore::new(&path).load();
    // Read by tests and report-style readers only: any error will do, but no panic.
    let _ = vgpu_carbon::log::read(&path);
}

// ---- intensity sources ----

/// What the Electricity Maps and UK grid APIs answer, a `command` source's output and an
/// API's error body. The first byte picks the parser.
pub fn intensity_response(data: &[u8]) {
    use vgpu_carbon::intensity::command;
    use vgpu_carbon::intensity::electricitymaps;
    use vgpu_carbon::intensity::uk_grid;
    let Some((&pick, body)) = data.split_first() else { return };
    let body = String::from_utf8_lossy(body);
    // Forecasts (`fw48h`, `carbon-intensity/forecast`): a list of figures or a one-line error.
    for forecast in [
        electricitymaps::parse_forecast_body(&body, "DE"),
        uk_grid::parse_forecast_body(&body, &uk_grid::Area::National),
        uk_grid::parse_forecast_body(&body, &uk_grid::Area::Region(13)),
    ] {
        match forecast {
            Ok(readings) => assert!(!readings.is_empty(), "a forecast without figures: {body:?}"),
            Err(message) => one_line("intensity forecast", &message),
        }
    }
    let parsed = match pick % 6 {
        0 => electricitymaps::parse_body(&body, "DE"),
        1 => uk_grid::parse_body(&body, &uk_grid::Area::National),
        2 => uk_grid::parse_body(&body, &uk_grid::Area::Postcode("RG10".into())),
        3 => uk_grid::parse_body(&body, &uk_grid::Area::Region(13)),
        4 => command::parse_output(&body).map(|g_per_kwh| Reading { g_per_kwh, timestamp: now() }).map_err(|e| e.to_string()),
        _ => {
            let detail = intensity::error_detail(&body);
            assert!(detail.chars().count() <= 200, "an error detail of {} characters", detail.chars().count());
            assert!(!detail.contains(char::is_control), "control characters in {detail:?}");
            one_line("an API's error body", &detail);
            // RFC 3339 has 4-digit years; Unix seconds reach beyond.
            if let Some(t) = intensity::parse_timestamp(&body).filter(|t| (0..=9999).contains(&chrono::Datelike::year(t))) {
                assert_eq!(intensity::parse_timestamp(&t.to_rfc3339()), Some(t), "{body:?}");
            }
            return;
        }
    };
    if let Err(message) = &parsed {
        one_line("intensity response", message);
    }
    // Through resolve, as the commands see it: a usable value or an error, never a negative
    // or infinite intensity.
    // No remembered reading: a cache that is not there (nothing is written).
    let cache = Cache::new("/nonexistent/vgpu-fuzz/carbon-intensity.json");
    let policy = intensity::Policy { cache: &cache, max_age: std::time::Duration::ZERO, fallback: None, remember: false };
    if let Ok(found) = intensity::resolve(&Answer(parsed), &policy, now()) {
        assert_usable(&found, "a response");
    }
}

/// `source = "file"`: a CSV or JSON time series.
pub fn file_source(data: &[u8]) {
    use vgpu_carbon::intensity::file;
    let text = String::from_utf8_lossy(data);
    let series = match file::parse_series(&text) {
        Ok(series) => series,
        Err(message) => return one_line("file source", &message),
    };
    for r in &series {
        assert!(r.g_per_kwh.is_finite() && r.g_per_kwh >= 0.0, "a series with {} was accepted", r.g_per_kwh);
    }
    for at in [now(), DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MAX_UTC] {
        if let Some(r) = file::at(&series, at) {
            assert!(r.timestamp <= at && series.contains(&r));
        }
    }
}

// ---- the shim's shared files ----

/// The GPUs of the fixture's vGPUs.
const GPU0: &str = "GPU-00000000-0000-0000-0000-000000000001";
const GPU1: &str = "MIG-00000000-0000-0000-0000-000000000002";
/// The monotonic time at which the fixture's other vGPU published on its board slot (ns).
const NOW_MONO: u64 = 10_000_000_000;

/// A state directory made by the real code, once per thread: `vgpus/me` (on GPU0 and GPU1)
/// and `vgpus/other` (on GPU0: 40 %, fair, priority 70) with their `usage` and `limits`,
/// and their slots on GPU0's board (the other's published at [`NOW_MONO`]); the valid bytes
/// of each file, to restore what a check overwrote.
struct Fixture {
    _dir: tempfile::TempDir,
    state: PathBuf,
    usage: Vec<u8>,
    limits: Vec<u8>,
    other_limits: Vec<u8>,
    slot: Vec<u8>,
    other_slot: Vec<u8>,
}

impl Fixture {
    fn new() -> Fixture {
        use vgpu_abi::compute::{Competitor, Policy};
        use vgpu_abi::usage::{DeviceQuota, UsageFile};
        let dir = tempfile::tempdir().expect("a temporary directory");
        let state = dir.path().join("state");
        // SAFETY: geteuid and getegid cannot fail and touch no memory.
        let owner = unsafe { (libc::geteuid(), libc::getegid()) };
        let vgpu = |id: &str, devices: &[(&str, u32, Policy, u32)]| {
            let vgpu_dir = state.join("vgpus").join(id);
            std::fs::create_dir_all(vgpu_dir.join("procs")).expect("a vGPU directory is made");
            let quotas: Vec<DeviceQuota> = devices
                .iter()
                .map(|&(uuid, compute_pct, policy, priority)| DeviceQuota { uuid: uuid.into(), quota_bytes: 8 << 30, compute_pct, policy, priority, turn_max_us: 0 })
                .collect();
            UsageFile::create(&vgpu_dir.join("usage"), &quotas).expect("a usage file is created");
            vgpu_abi::board::ensure_slot(&state, GPU0, id, owner, false).expect("a board slot is made");
            vgpu_dir
        };
        let me = vgpu("me", &[(GPU0, 50, Policy::Fair, 50), (GPU1, 100, Policy::Strict, 50)]);
        let other = vgpu("other", &[(GPU0, 40, Policy::Fair, 70)]);
        let figures = Competitor { share_ppm: 1, priority: 1, policy: Policy::Strict, hungry: true, usage_ppm: 5 };
        vgpu_abi::board::Board::open(&other, GPU0).expect("the other's slot opens").publish(figures, NOW_MONO + 1, NOW_MONO);
        let read = |path: PathBuf| std::fs::read(path).expect("a fixture file is read");
        let gpu = state.join("gpus").join(GPU0);
        Fixture {
            usage: read(me.join("usage")),
            limits: read(me.join("limits")),
            other_limits: read(other.join("limits")),
            slot: read(gpu.join("me")),
            other_slot: read(gpu.join("other")),
            state,
            _dir: dir,
        }
    }

    fn me(&self) -> PathBuf {
        self.state.join("vgpus/me")
    }

    /// The fixture's files as made, but `which` holds `data`.
    fn write(&self, which: SharedFile, data: &[u8]) {
        let gpu = self.state.join("gpus").join(GPU0);
        for (file, path, valid) in [
            (SharedFile::Usage, self.me().join("usage"), &self.usage),
            (SharedFile::Limits, self.me().join("limits"), &self.limits),
            (SharedFile::OtherLimits, self.state.join("vgpus/other/limits"), &self.other_limits),
            (SharedFile::Slot, gpu.join("me"), &self.slot),
            (SharedFile::OtherSlot, gpu.join("other"), &self.other_slot),
        ] {
            std::fs::write(path, if file == which { data } else { valid }).expect("a fixture file is written");
        }
    }
}

thread_local! {
    static FIXTURE: RefCell<Option<std::rc::Rc<Fixture>>> = const { RefCell::new(None) };
}

fn fixture() -> std::rc::Rc<Fixture> {
    FIXTURE.with(|cell| cell.borrow_mut().get_or_insert_with(|| std::rc::Rc::new(Fixture::new())).clone())
}

/// A file of the shared state that the shim and the CLI open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedFile {
    /// A vGPU's `usage` (its tenant writes it).
    Usage,
    /// A vGPU's `limits` (root's).
    Limits,
    /// Another vGPU's `limits`, read through the board.
    OtherLimits,
    /// The vGPU's own slot on a GPU's board (its tenant writes it).
    Slot,
    /// Another vGPU's slot (another tenant writes it).
    OtherSlot,
}

/// The valid bytes of `which`, as vgpu makes it.
pub fn valid_shared_file(which: SharedFile) -> Vec<u8> {
    let f = fixture();
    match which {
        SharedFile::Usage => f.usage.clone(),
        SharedFile::Limits => f.limits.clone(),
        SharedFile::OtherLimits => f.other_limits.clone(),
        SharedFile::Slot => f.slot.clone(),
        SharedFile::OtherSlot => f.other_slot.clone(),
    }
}

/// Put `data` in place of `which` (the rest as vgpu made it) and open what reads it: the
/// usage file (with its limits) or the board (with its own slot).
pub fn open_shared(which: SharedFile, data: &[u8]) -> Result<(), vgpu_abi::usage::LayoutError> {
    let f = fixture();
    f.write(which, data);
    match which {
        SharedFile::Usage | SharedFile::Limits => vgpu_abi::usage::UsageFile::open(&f.me().join("usage")).map(drop),
        _ => vgpu_abi::board::Board::open(&f.me(), GPU0).map(drop),
    }
}

/// A vGPU's `usage` and `limits` files (the first byte picks which holds the input; the
/// other is valid): arbitrary bytes are refused with a `LayoutError`, or open into a file
/// every accessor can read and reclaim can work on.
pub fn usage_file(data: &[u8]) {
    use vgpu_abi::layout::{LIMITS_MAGIC, USAGE_MAGIC};
    use vgpu_abi::usage::UsageFile;
    let Some((&pick, data)) = data.split_first() else { return };
    let (which, magic) = if pick % 2 == 0 { (SharedFile::Usage, USAGE_MAGIC) } else { (SharedFile::Limits, LIMITS_MAGIC) };
    let f = fixture();
    f.write(which, data);
    let usage = match UsageFile::open(&f.me().join("usage")) {
        Ok(usage) => usage,
        Err(e) => return one_line("usage file", &e.to_string()),
    };
    assert!(data.starts_with(&magic), "a {which:?} file without its magic was opened");
    for i in 0..usage.device_count() {
        let uuid = usage.device_uuid(i).to_string();
        assert!(!uuid.is_empty() && uuid.bytes().all(|b| b.is_ascii_graphic()));
        assert!((1..=100).contains(&usage.compute_pct(i)));
        assert!(usage.priority(i) <= 100);
        let _ = (usage.quota_bytes(i), usage.used_bytes(i), usage.policy(i), usage.ledger(i));
        assert!(usage.find_device_str(&uuid).is_some());
    }
    assert_eq!(usage.devices().len(), usage.device_count());
    let _ = (usage.any_compute_limited(), usage.needs_reconcile(), usage.created_unix_ns(), usage.processes());
    let report = usage.reclaim_dead();
    for line in &report.errors {
        one_line("reclaim report", line);
    }
}

/// A per-process file (`$VGPU_DIR/procs/<pid>-<start>`), and the names of those files.
pub fn proc_file(data: &[u8]) {
    use vgpu_abi::layout::PROC_MAGIC;
    use vgpu_abi::procfile::{file_name, parse_file_name, ProcFile};
    use vgpu_abi::usage::{format_uuid, parse_uuid_bytes};
    let name = String::from_utf8_lossy(&data[..data.len().min(80)]).into_owned();
    if let Some(id) = parse_file_name(&name) {
        assert_eq!(parse_file_name(&file_name(id)), Some(id));
    }
    if let Some(bytes) = parse_uuid_bytes(&name) {
        assert_eq!(parse_uuid_bytes(&format_uuid("GPU", &bytes)), Some(bytes));
    }
    let (_dir, path) = scratch_file("1-1", data);
    let file = match ProcFile::open(&path) {
        Ok(file) => file,
        Err(e) => return one_line("per-process file", &e.to_string()),
    };
    assert!(data.starts_with(&PROC_MAGIC), "a per-process file without the magic was opened");
    assert!(!file.is_writable());
    let n = file.device_count();
    assert!(file.used().len() == n && file.peaks().len() == n && file.compute_ns().len() == n);
    let _ = (file.id(), file.quiescent_ops(), file.header());
}

/// A GPU's board: the first byte picks what holds the input, the vGPU's own slot, another
/// vGPU's slot (another tenant writes it) or the other's limits. The board opens only with
/// a valid own slot, and whatever another tenant writes in its slot, what the board shows of
/// it is entitled by its limits (40 %, fair, priority 70), never by its slot.
pub fn board_file(data: &[u8]) {
    use vgpu_abi::board::{Board, MAX_COMPETITORS};
    use vgpu_abi::compute::{Competitor, Policy, PPM};
    use vgpu_abi::layout::BOARD_MAGIC;
    let Some((&pick, data)) = data.split_first() else { return };
    let which = [SharedFile::Slot, SharedFile::OtherSlot, SharedFile::OtherLimits][usize::from(pick) % 3];
    let f = fixture();
    f.write(which, data);
    let mut board = match Board::open(&f.me(), GPU0) {
        Ok(board) => board,
        Err(e) => return one_line("board slot", &e.to_string()),
    };
    if which == SharedFile::Slot {
        assert!(data.starts_with(&BOARD_MAGIC), "a slot without the magic was opened");
    }
    let me = Competitor { share_ppm: 500_000, priority: 50, policy: Policy::Fair, hungry: false, usage_ppm: 0 };
    board.publish(me, 0, NOW_MONO);
    let mut out = [me; MAX_COMPETITORS];
    for now in [NOW_MONO, 0, u64::MAX] {
        let n = board.snapshot(me, now, &mut out);
        assert!((1..=2).contains(&n), "{n} competitors with one other vGPU");
        assert_eq!(out[0], me);
        for other in &out[1..n] {
            if which == SharedFile::OtherLimits {
                assert!(other.share_ppm > 0 && other.share_ppm <= PPM, "a share of {} ppm", other.share_ppm);
            } else {
                let entitled = (other.share_ppm, other.policy, other.priority);
                assert_eq!(entitled, (400_000, Policy::Fair, 70), "a tenant's slot changed its entitlement");
            }
        }
    }
}

/// A vGPU directory after its processes died: a valid usage file, per-process files of
/// dead processes (registered and reserved through the API), then damaged by arbitrary
/// writes (any tenant can write its own files), then reclaimed.
///
/// `data`: byte 0, how many processes (0–3); bytes 1–8, the quota; then 8 bytes per
/// process, what it reserves; the rest, `(file, offset, byte)` patches.
pub fn vgpu_dir(data: &[u8]) {
    use vgpu_abi::compute::Policy;
    use vgpu_abi::process::ProcessId;
    use vgpu_abi::usage::{DeviceQuota, UsageFile};
    fn take_u64(input: &mut dyn Iterator<Item = u8>) -> u64 {
        let mut raw = [0u8; 8];
        for b in raw.iter_mut() {
            *b = input.next().unwrap_or(0);
        }
        u64::from_le_bytes(raw)
    }
    let mut input = data.iter().copied();
    let processes = input.next().unwrap_or(0) % 4;
    let quota = take_u64(&mut input);
    let dir = scratch_dir();
    std::fs::create_dir(dir.path().join("procs")).expect("procs/ is made");
    let path = dir.path().join("usage");
    let quotas: Vec<DeviceQuota> = ["GPU-00000000-0000-0000-0000-000000000001", "GPU-00000000-0000-0000-0000-000000000002"]
        .iter()
        .map(|uuid| DeviceQuota { uuid: (*uuid).into(), quota_bytes: quota, compute_pct: 100, policy: Policy::Strict, priority: 50, turn_max_us: 0 })
        .collect();
    UsageFile::create(&path, &quotas).expect("a usage file is created");
    let usage = UsageFile::open(&path).expect("a fresh usage file opens");
    let mut files = vec![path.clone()];
    for i in 0..processes {
        // No process has a pid this large: every one is dead.
        let id = ProcessId { pid: 4_000_000_000 + u32::from(i), start_time: 1 };
        let proc = usage.register(id).expect("a process registers");
        let _ = usage.try_reserve(&proc, usize::from(i) % 2, take_u64(&mut input));
        files.push(proc.path().to_path_buf());
    }
    let rest: Vec<u8> = input.collect();
    for patch in rest.chunks_exact(4) {
        let file = &files[usize::from(patch[0]) % files.len()];
        let Ok(mut bytes) = std::fs::read(file) else { continue };
        if bytes.is_empty() {
            continue;
        }
        let at = usize::from(u16::from_le_bytes([patch[1], patch[2]])) % bytes.len();
        bytes[at] = patch[3];
        // In place, as a process writing its mapping would.
        use std::os::unix::fs::FileExt as _;
        let f = std::fs::OpenOptions::new().write(true).open(file).expect("the file opens for writing");
        f.write_all_at(&bytes[at..=at], at as u64).expect("the patch is written");
    }
    let before: Vec<u64> = (0..usage.device_count()).map(|d| usage.used_bytes(d)).collect();
    let _ = usage.processes();
    let report = usage.reclaim_dead();
    for line in &report.errors {
        one_line("reclaim report", line);
    }
    if UsageFile::open(&path).is_ok() {
        // Giving back never adds: a total only goes down (or is recomputed from the live
        // records, of which there are none).
        for (d, before) in before.into_iter().enumerate() {
            assert!(usage.used_bytes(d) <= before, "device {d}: {before} in use before reclaim, {} after", usage.used_bytes(d));
        }
        let _ = usage.devices();
    }
}

// ---- seeds ----

/// Valid inputs of each target: the start of a fuzzing corpus, and what the test suite
/// mutates. Every seed is accepted by its parser (the test suite checks that).
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    let text = |items: &[&str]| items.iter().map(|s| s.as_bytes().to_vec()).collect();
    match target {
        "config" => text(&[
            "",
            "simulate = true\nstate_dir = \"/run/vgpu\"\nlib_dir = \"/var/lib/vgpu\"\n\n[compute]\npolicy = \"fair\"\n\n[policy]\nrun_as_others = [\"alice\", \"%gpuadmin\"]\n",
            "[carbon]\nsource = \"uk-grid\"\npostcode = \"RG10\"\nbudget_g_per_hour = 400\nmax_age = \"1h\"\nfallback = 250\ntimeout = \"3s\"\ngamma = 2.5\ndelta_f_mhz = 30\nscaling_efficiency = 0.8\nfreq_sensitivity = 0.5\npower_idle_w = 60\npower_max_w = 300\n",
            "[carbon]\nsource = \"electricitymaps\"\nzone = \"DE\"\ntoken_file = \"/etc/vgpu/em-token\"\nbase_url = \"http://127.0.0.1:9\"\n",
            "[carbon]\nsource = \"command\"\ncommand = \"echo 300\"\ntimeout = \"2s\"\n",
            "[carbon]\nsource = \"file\"\npath = \"/var/lib/vgpu/intensity.csv\"\n",
            "[carbon]\nsource = \"static\"\nvalue = 300\n",
            "[pool]\nblock_tflops = 2.0\n[pool.tflops]\n\"NVIDIA H100 80GB HBM3\" = 989\n[pool.uuid_tflops]\n\"GPU-1234\" = 500.5\n[[pool.device]]\nkind = \"npu\"\nname = \"Ascend 910B\"\ntflops = 320\nid = \"0\"\nenv = \"ASCEND_RT_VISIBLE_DEVICES\"\n[[pool.device]]\nkind = \"fpga\"\nname = \"Alveo U280\"\ntflops = 24.5\n",
        ]),
        "size" => text(&["4G", "4GiB", "4GB", "1.5G", "512M", "4096", " 2K ", "50%", "12.5%", "2.5", "TERM", "sigkill", "9"]),
        "workload_record" => vec![WORKLOAD_SEED.as_bytes().to_vec()],
        "partitions" => text(&[
            r#"{"format":1,"partitions":[]}"#,
            r#"{"format":1,"partitions":[{"name":"svc","gpu_index":0,"gpu_uuid":"GPU-1","mem_bytes":4294967296,"compute_pct":40,"compute_policy":"fair","created_unix_ms":1,"user":"alice"},{"name":"old","gpu_index":1,"gpu_uuid":"GPU-2","mem_bytes":1,"compute_pct":100,"created_unix_ms":0,"group":"ml"}]}"#,
        ]),
        "intent_record" => text(&[
            r#"{"op":"suspend","workloads":["a1b2c3d4"],"writer":{"pid":1234,"start_time":5678},"created_unix_ms":1720000000000}"#,
            r#"{"op":"pool","workloads":["a1b2c3d4","e5f6a7b8"],"writer":{"pid":1,"start_time":1},"created_unix_ms":0}"#,
        ]),
        "pool_state" => vec![pool_seed()],
        "carbon_state" => text(&[
            r#"{"source":"uk-grid national","reading":{"g_per_kwh":212.0,"timestamp":"2024-07-03T09:30:00Z"},"fetched_at":"2024-07-03T09:40:00Z"}"#,
            r#"[{"uuid":"GPU-1","cap":{"kind":"locked-clocks","min_mhz":210,"max_mhz":1410}},{"uuid":"GPU-2","cap":{"kind":"power-limit","mw":250000},"locking_unsupported":true},{"uuid":"GPU-3","cap":{"kind":"uncapped"}}]"#,
            "{\"time\":\"2024-07-03T09:46:40Z\",\"action\":\"apply\",\"intensity\":300.0,\"intensity_source\":null,\"budget_g_per_hour\":100.0,\"predicted_g_per_hour\":90.0,\"budget_met\":true,\"notes\":[\"n\"],\"gpus\":[]}\n{\"time\":\"2024-07-03T10:00:00Z\",\"action\":\"reset\",\"intensity\":null,\"intensity_source\":null,\"budget_g_per_hour\":null,\"predicted_g_per_hour\":null,\"budget_met\":null,\"notes\":[],\"gpus\":[]}\n",
        ]),
        "intensity_response" => text(&[
            "\u{0}{\"zone\":\"DE\",\"carbonIntensity\":302,\"datetime\":\"2018-04-25T18:07:00.350Z\",\"updatedAt\":\"2018-04-25T18:07:01.000Z\"}",
            "\u{1}{\"data\":[{\"from\":\"2018-01-20T12:00Z\",\"to\":\"2018-01-20T12:30Z\",\"intensity\":{\"forecast\":266,\"actual\":263,\"index\":\"moderate\"}}]}",
            "\u{2}{\"data\":[{\"regionid\":13,\"dnoregion\":\"SSE South\",\"shortname\":\"South England\",\"postcode\":\"RG10\",\"data\":[{\"from\":\"2018-01-20T12:00Z\",\"to\":\"2018-01-20T12:30Z\",\"intensity\":{\"forecast\":266,\"index\":\"moderate\"}}]}]}",
            "\u{3}{\"data\":[{\"regionid\":13,\"data\":[{\"from\":\"2018-01-20T12:00Z\",\"intensity\":{\"forecast\":100,\"actual\":null}}]}]}",
            "\u{4}300.5 gCO2/kWh\n",
            "\u{5}{\"error\":{\"code\":\"400 Bad Request\",\"message\":\"Please enter a valid postcode.\"}}",
            "\u{5}2024-05-01T10:00:00Z",
            "\u{0}{\"zone\":\"DE\",\"forecast\":[{\"carbonIntensity\":319,\"datetime\":\"2018-04-25T18:00:00.000Z\"},{\"carbonIntensity\":301,\"datetime\":\"2018-04-25T19:00:00.000Z\"}],\"updatedAt\":\"2018-04-25T17:52:11.128Z\"}",
            "\u{3}{\"data\":{\"regionid\":13,\"shortname\":\"London\",\"data\":[{\"from\":\"2018-01-20T12:00Z\",\"to\":\"2018-01-20T12:30Z\",\"intensity\":{\"forecast\":207,\"index\":\"moderate\"}},{\"from\":\"2018-01-20T12:30Z\",\"intensity\":{\"forecast\":199}}]}}",
        ]),
        "file_source" => text(&[
            "timestamp,gco2_per_kwh\n# hourly\n2024-05-01T10:00:00Z,300\n2024-05-01T12:00:00Z,250.5\n\n2024-05-01T11:00Z,280\n1714557600,100\n2024-05-01 11:00,200\n",
            "[{\"timestamp\": \"2024-05-01T10:00:00Z\", \"gco2_per_kwh\": 300},\n {\"timestamp\": 1714561200, \"gco2_per_kwh\": 120}]",
        ]),
        "usage_file" => vec![
            [&[0u8][..], &valid_shared_file(SharedFile::Usage)].concat(),
            [&[1u8][..], &valid_shared_file(SharedFile::Limits)].concat(),
        ],
        "proc_file" => vec![proc_file_seed(), b"4000000000-1".to_vec(), b"GPU-0123abcd-0000-1111-2222-333344445555".to_vec()],
        "board_file" => vec![
            [&[0u8][..], &valid_shared_file(SharedFile::Slot)].concat(),
            [&[1u8][..], &valid_shared_file(SharedFile::OtherSlot)].concat(),
            [&[2u8][..], &valid_shared_file(SharedFile::OtherLimits)].concat(),
        ],
        "vgpu_dir" => {
            let mut seed = vec![3u8];
            seed.extend_from_slice(&(16u64 << 30).to_le_bytes());
            for reserve in [1u64 << 30, 2 << 30, 3 << 30] {
                seed.extend_from_slice(&reserve.to_le_bytes());
            }
            seed.extend_from_slice(&[1, 200, 0, 0xff, 2, 201, 0, 0x7f]);
            vec![seed]
        }
        other => panic!("no fuzz target {other:?}"),
    }
}

/// A workload record as `vgpu run` writes it.
pub const WORKLOAD_SEED: &str = r#"{
  "format": 1,
  "id": "a1b2c3d4",
  "name": "train",
  "command": ["python", "train.py"],
  "user": {"name": "alice", "uid": 1000, "gid": 1000, "groups": [1000, 44], "home": "/home/alice"},
  "gpus": [{"index": 0, "uuid": "GPU-1", "mem_bytes": 4294967296, "device_bytes": 17179869184, "compute_pct": 50}],
  "vgpu": "p-svc",
  "partition": "svc",
  "priority": 10,
  "compute_policy": "fair",
  "pool_blocks": 4,
  "pool_env": [["ASCEND_RT_VISIBLE_DEVICES", "0"]],
  "freq_sensitivity": 0.5,
  "cgroup": "a1b2c3d4",
  "supervisor": {"pid": 1234, "start_time": 5678},
  "pid": 1240,
  "state": "suspended",
  "suspended_reason": "preempted by e5f6",
  "created_unix_ms": 1720000000000
}"#;

/// A pool over two declared devices with a running, a suspended and a waiting workload.
fn pool_seed() -> Vec<u8> {
    use vgpu_pool::inventory::Inventory;
    use vgpu_pool::KindFilter;
    use vgpu_pool::Pool;
    use vgpu_pool::Priority;
    use vgpu_pool::Request;
    let config = vgpu_host::config::Config::parse(
        "[pool]\nblock_tflops = 1.0\n[[pool.device]]\nkind = \"npu\"\nname = \"a\"\ntflops = 8\nenv = \"NPUS\"\n[[pool.device]]\nkind = \"fpga\"\nname = \"b\"\ntflops = 4\n",
    )
    .expect("the seed's config parses");
    let inventory = Inventory::build(&[], &config.pool).expect("the seed's inventory builds");
    let mut pool = Pool::new(inventory);
    let request = |id: &str, blocks, priority| Request::new(id, id, blocks, Priority::new(priority).expect("in range"), KindFilter::Any);
    for (id, blocks, priority) in [("low", 10, 10), ("mid", 2, 50), ("high", 6, 90)] {
        let plan = pool.admit(&request(id, blocks, priority)).expect("the seed's request is admitted");
        pool.apply(plan).expect("the seed's plan applies");
    }
    pool.enqueue(&request("queued", 12, 50)).expect("the seed's request is queued");
    serde_json::to_vec_pretty(&pool).expect("the seed's pool serialises")
}

/// A per-process file as the shim creates it: 1 GiB reserved on the second device.
fn proc_file_seed() -> Vec<u8> {
    use vgpu_abi::compute::Policy;
    use vgpu_abi::usage::{DeviceQuota, UsageFile};
    let dir = scratch_dir();
    std::fs::create_dir(dir.path().join("procs")).expect("procs/ is made");
    let path = dir.path().join("usage");
    let quotas: Vec<DeviceQuota> = [GPU0, GPU1]
        .iter()
        .map(|uuid| DeviceQuota { uuid: (*uuid).into(), quota_bytes: 8 << 30, compute_pct: 40, policy: Policy::Fair, priority: 70, turn_max_us: 0 })
        .collect();
    UsageFile::create(&path, &quotas).expect("the seed's usage file is created");
    let usage = UsageFile::open(&path).expect("the seed's usage file opens");
    let id = vgpu_abi::process::ProcessId { pid: 4_000_000_000, start_time: 1 };
    let proc = usage.register(id).expect("the seed's process registers");
    usage.try_reserve(&proc, 1, 1 << 30).expect("the seed's reservation fits");
    std::fs::read(proc.path()).expect("the seed's per-process file is read")
}
