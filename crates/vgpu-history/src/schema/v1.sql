-- vgpu's history database (`<lib_dir>/history.db`, default /var/lib/vgpu/history.db),
-- schema version 1 (`PRAGMA user_version`). The one definition of the layout: vgpu creates
-- the database from this text, and docs/history.md explains it for admins using sqlite3.
--
-- Conventions:
--   * times are INTEGER milliseconds since the Unix epoch (UTC): `*_ms`;
--     `datetime(t_ms / 1000, 'unixepoch')` shows one in sqlite3;
--   * an interval is [t0_ms, t1_ms): a row covers the time since the previous sample;
--   * energy is INTEGER millijoules (`energy_mj`; 3.6e9 mJ = 1 kWh);
--   * GPU time is INTEGER milliseconds (`busy_ms`);
--   * intensity is REAL gCO2/kWh;
--   * GPUs are named by UUID (`GPU-…`, stable across reboots), with the NVML index of the
--     time as well.
-- Retention (`[history] keep`, default 90 days) deletes rows of the time-series tables
-- (gpu_samples, workload_gpu_time, intensity, decisions) older than the horizon, and
-- workloads that ended before it. power_models and workload_sensitivity are kept.

-- One row per GPU per `vgpu watch` tick: what the GPU did since the previous tick.
CREATE TABLE IF NOT EXISTS gpu_samples (
    t0_ms         INTEGER NOT NULL,
    t1_ms         INTEGER NOT NULL CHECK (t1_ms > t0_ms),
    gpu_uuid      TEXT    NOT NULL,
    gpu_index     INTEGER NOT NULL,
    gpu_name      TEXT,
    -- Energy the GPU used in the interval: the delta of NVML's total-energy counter
    -- (energy_source 'counter'), or power × duration where the device has no counter
    -- ('power').
    energy_mj     INTEGER NOT NULL CHECK (energy_mj >= 0),
    energy_source TEXT    NOT NULL CHECK (energy_source IN ('counter', 'power')),
    -- Time the GPU was busy in the interval (NVML device utilization × duration); NULL:
    -- unknown.
    busy_ms       INTEGER CHECK (busy_ms >= 0),
    -- SM clock and power draw at the end of the interval; NULL: unknown.
    sm_clock_mhz  INTEGER,
    power_w       REAL,
    -- NVML's total-energy counter at t1_ms (mJ since the driver loaded); NULL: none. A
    -- restarted `vgpu watch` continues from the last row's counter, bridging a gap of up to
    -- 10 minutes.
    energy_counter_mj INTEGER,
    PRIMARY KEY (gpu_uuid, t1_ms)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS gpu_samples_t1 ON gpu_samples (t1_ms);

-- One row per workload per GPU per tick: the GPU time the workload's processes used on the
-- GPU in the interval. source 'ledger': the shim's compute ledger (`charged_ns` deltas of a
-- vGPU with a compute limit); 'nvml': NVML's per-process SM utilization × duration (no
-- limit, or no shim in the process).
CREATE TABLE IF NOT EXISTS workload_gpu_time (
    t0_ms       INTEGER NOT NULL,
    t1_ms       INTEGER NOT NULL CHECK (t1_ms > t0_ms),
    workload_id TEXT    NOT NULL,
    gpu_uuid    TEXT    NOT NULL,
    busy_ms     INTEGER NOT NULL CHECK (busy_ms >= 0),
    source      TEXT    NOT NULL CHECK (source IN ('ledger', 'nvml')),
    PRIMARY KEY (workload_id, gpu_uuid, t1_ms)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS workload_gpu_time_t1 ON workload_gpu_time (t1_ms);

-- Every workload the history has seen, for grouping by user and service and for names.
CREATE TABLE IF NOT EXISTS workloads (
    id         TEXT PRIMARY KEY,
    name       TEXT,
    uid        INTEGER,
    user       TEXT,
    service    TEXT,
    command    TEXT,
    -- GPU UUIDs, comma-separated.
    gpus       TEXT,
    started_ms INTEGER,
    -- NULL while it runs.
    ended_ms   INTEGER,
    -- How it ended, as `vgpu ps` says it ("exit 0", "signal 9", "killed: …").
    outcome    TEXT
);

-- Every grid carbon-intensity figure vgpu used or was given. kind 'reading': the source's
-- figure for ts_ms (a remembered one is recorded again only if it is new); 'fallback': the
-- configured fallback used for lack of a reading; 'forecast': a future figure for ts_ms
-- fetched at fetched_ms (a later fetch for the same ts_ms replaces it).
CREATE TABLE IF NOT EXISTS intensity (
    ts_ms      INTEGER NOT NULL,
    kind       TEXT    NOT NULL CHECK (kind IN ('reading', 'fallback', 'forecast')),
    g_per_kwh  REAL    NOT NULL CHECK (g_per_kwh >= 0),
    source     TEXT    NOT NULL,
    fetched_ms INTEGER NOT NULL,
    PRIMARY KEY (ts_ms, kind)
) WITHOUT ROWID;

-- Every clock decision (`carbon apply`/`reset`, re-plans when a workload starts or ends):
-- the same JSON object as a line of carbon.jsonl, with its main figures as columns.
CREATE TABLE IF NOT EXISTS decisions (
    ts_ms                INTEGER NOT NULL,
    action               TEXT    NOT NULL,
    reason               TEXT,
    intensity            REAL,
    budget_g_per_hour    REAL,
    predicted_g_per_hour REAL,
    budget_met           INTEGER,
    record               TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS decisions_ts ON decisions (ts_ms);

-- `vgpu carbon profile`'s fit per GPU: P(f) = idle_w + (max_w − idle_w)·(f/f_max)^gamma and
-- speed s(f) = (1 − speed_sigma) + speed_sigma·f/f_max, measured at the clocks in `points`
-- (JSON: [{"clock_mhz", "power_w", "throughput"}]).
CREATE TABLE IF NOT EXISTS power_models (
    gpu_uuid      TEXT PRIMARY KEY,
    gpu_name      TEXT    NOT NULL,
    measured_ms   INTEGER NOT NULL,
    max_clock_mhz INTEGER NOT NULL,
    idle_w        REAL    NOT NULL,
    max_w         REAL    NOT NULL,
    gamma         REAL    NOT NULL,
    speed_sigma   REAL    NOT NULL,
    -- Root-mean-square error of the power fit, watts.
    rms_error_w   REAL    NOT NULL,
    points        TEXT    NOT NULL
);

-- A workload's learned frequency sensitivity σ (speed vs clock), keyed by what identifies
-- it across runs: `service:NAME`, `name:NAME`, or `id:ID`.
CREATE TABLE IF NOT EXISTS workload_sensitivity (
    key        TEXT PRIMARY KEY,
    sigma      REAL    NOT NULL CHECK (sigma >= 0 AND sigma <= 1),
    samples    INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
