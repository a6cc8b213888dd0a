-- vgpu's history database (`<lib_dir>/history.db`, default /var/lib/vgpu/history.db),
-- schema version 2 (`PRAGMA user_version`). The one definition of the layout: vgpu creates
-- the database from this text, and docs/history.md explains it for admins using sqlite3.
-- Version 1 had neither the rollup tables and their triggers nor workloads_ended: vgpu adds
-- them when it opens one (its rows stay as they are).
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
-- (gpu_samples, workload_gpu_time, intensity, decisions) older than the horizon, the
-- rollups of the hours and days before it, and workloads that ended before it. power_models
-- and workload_sensitivity are kept.

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

CREATE INDEX IF NOT EXISTS workloads_ended ON workloads (ended_ms);

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

-- Rollups: the accounting `vgpu carbon report` makes of each whole hour and each whole day
-- of the Unix epoch (UTC), [start_ms, start_ms + span_ms), kept so that reports and `vgpu ps
-- -a` read a few rows per GPU-day instead of the rows of the day. A cache that is exact:
-- `vgpu watch` makes the rollup of an hour from its rows, and of a day from its hours', once
-- it is over; a row of gpu_samples or workload_gpu_time inserted, changed or deleted drops
-- the rollups of every hour and day it overlaps (the triggers below, in the same
-- transaction); a reader uses one only where the intensity figures in force over its span
-- and each GPU's idle power are the ones it would use, and reads the rows of every other
-- hour. Summing these tables yourself, take one span_ms (the days hold the sums of their
-- hours).
CREATE TABLE IF NOT EXISTS rollups (
    span_ms   INTEGER NOT NULL CHECK (span_ms IN (3600000, 86400000)),
    -- A multiple of span_ms.
    start_ms  INTEGER NOT NULL,
    -- The intensity figures in force over the span, as the accounting used them: 'none'
    -- (none known: emissions unknown), or the figure at start_ms followed by
    -- ' @TS_MS FIGURE' for each time in the span a new one starts.
    intensity TEXT    NOT NULL,
    made_ms   INTEGER NOT NULL,
    PRIMARY KEY (span_ms, start_ms)
) WITHOUT ROWID;

-- Each GPU with rows in the span: its energy in it (every interval clipped to it pro rata)
-- and the idle power the accounting took.
CREATE TABLE IF NOT EXISTS rollup_gpus (
    span_ms     INTEGER NOT NULL,
    start_ms    INTEGER NOT NULL,
    gpu_uuid    TEXT    NOT NULL,
    -- The index and name of the span's last interval.
    gpu_index   INTEGER NOT NULL,
    gpu_name    TEXT,
    energy_mj   INTEGER NOT NULL CHECK (energy_mj >= 0),
    idle_w      REAL    NOT NULL,
    idle_source TEXT    NOT NULL CHECK (idle_source IN ('measured', 'configured', 'power_limit', 'lowest_observed')),
    -- What the accounting said of the GPU (no power model), or NULL.
    note        TEXT,
    PRIMARY KEY (span_ms, start_ms, gpu_uuid)
) WITHOUT ROWID;

-- Who the GPU's energy in the span went to: each workload, idle and unattributed, with the
-- GPU time (ms) and grams of CO2 as the accounting summed them (NULL: no intensity known).
-- Per GPU and span, the parts' energy_mj add up to its rollup_gpus.energy_mj.
CREATE TABLE IF NOT EXISTS rollup_parts (
    span_ms     INTEGER NOT NULL,
    start_ms    INTEGER NOT NULL,
    gpu_uuid    TEXT    NOT NULL,
    party       TEXT    NOT NULL CHECK (party IN ('workload', 'idle', 'unattributed')),
    -- The workload; '' for idle and unattributed.
    workload_id TEXT    NOT NULL,
    energy_mj   INTEGER NOT NULL CHECK (energy_mj >= 0),
    gpu_time_ms REAL    NOT NULL,
    g_co2       REAL,
    PRIMARY KEY (span_ms, start_ms, gpu_uuid, party, workload_id)
) WITHOUT ROWID;

-- A row of gpu_samples or workload_gpu_time that comes, changes or goes drops the rollups of
-- the hours and days it overlaps ([t0_ms, t1_ms) meets [start_ms, start_ms + span_ms)).
CREATE TRIGGER IF NOT EXISTS gpu_samples_insert_drops_rollups AFTER INSERT ON gpu_samples
WHEN EXISTS (SELECT 1 FROM rollups
             WHERE (span_ms = 3600000 AND start_ms > NEW.t0_ms - 3600000 AND start_ms < NEW.t1_ms)
                OR (span_ms = 86400000 AND start_ms > NEW.t0_ms - 86400000 AND start_ms < NEW.t1_ms))
BEGIN
    DELETE FROM rollup_parts
    WHERE (span_ms = 3600000 AND start_ms > NEW.t0_ms - 3600000 AND start_ms < NEW.t1_ms)
       OR (span_ms = 86400000 AND start_ms > NEW.t0_ms - 86400000 AND start_ms < NEW.t1_ms);
    DELETE FROM rollup_gpus
    WHERE (span_ms = 3600000 AND start_ms > NEW.t0_ms - 3600000 AND start_ms < NEW.t1_ms)
       OR (span_ms = 86400000 AND start_ms > NEW.t0_ms - 86400000 AND start_ms < NEW.t1_ms);
    DELETE FROM rollups
    WHERE (span_ms = 3600000 AND start_ms > NEW.t0_ms - 3600000 AND start_ms < NEW.t1_ms)
       OR (span_ms = 86400000 AND start_ms > NEW.t0_ms - 86400000 AND start_ms < NEW.t1_ms);
END;

CREATE TRIGGER IF NOT EXISTS gpu_samples_delete_drops_rollups AFTER DELETE ON gpu_samples
WHEN EXISTS (SELECT 1 FROM rollups
             WHERE (span_ms = 3600000 AND start_ms > OLD.t0_ms - 3600000 AND start_ms < OLD.t1_ms)
                OR (span_ms = 86400000 AND start_ms > OLD.t0_ms - 86400000 AND start_ms < OLD.t1_ms))
BEGIN
    DELETE FROM rollup_parts
    WHERE (span_ms = 3600000 AND start_ms > OLD.t0_ms - 3600000 AND start_ms < OLD.t1_ms)
       OR (span_ms = 86400000 AND start_ms > OLD.t0_ms - 86400000 AND start_ms < OLD.t1_ms);
    DELETE FROM rollup_gpus
    WHERE (span_ms = 3600000 AND start_ms > OLD.t0_ms - 3600000 AND start_ms < OLD.t1_ms)
       OR (span_ms = 86400000 AND start_ms > OLD.t0_ms - 86400000 AND start_ms < OLD.t1_ms);
    DELETE FROM rollups
    WHERE (span_ms = 3600000 AND start_ms > OLD.t0_ms - 3600000 AND start_ms < OLD.t1_ms)
       OR (span_ms = 86400000 AND start_ms > OLD.t0_ms - 86400000 AND start_ms < OLD.t1_ms);
END;

CREATE TRIGGER IF NOT EXISTS gpu_samples_update_drops_rollups AFTER UPDATE ON gpu_samples
BEGIN
    DELETE FROM rollup_parts
    WHERE (span_ms = 3600000 AND start_ms > OLD.t0_ms - 3600000 AND start_ms < OLD.t1_ms)
       OR (span_ms = 86400000 AND start_ms > OLD.t0_ms - 86400000 AND start_ms < OLD.t1_ms)
       OR (span_ms = 3600000 AND start_ms > NEW.t0_ms - 3600000 AND start_ms < NEW.t1_ms)
       OR (span_ms = 86400000 AND start_ms > NEW.t0_ms - 86400000 AND start_ms < NEW.t1_ms);
    DELETE FROM rollup_gpus
    WHERE (span_ms = 3600000 AND start_ms > OLD.t0_ms - 3600000 AND start_ms < OLD.t1_ms)
       OR (span_ms = 86400000 AND start_ms > OLD.t0_ms - 86400000 AND start_ms < OLD.t1_ms)
       OR (span_ms = 3600000 AND start_ms > NEW.t0_ms - 3600000 AND start_ms < NEW.t1_ms)
       OR (span_ms = 86400000 AND start_ms > NEW.t0_ms - 86400000 AND start_ms < NEW.t1_ms);
    DELETE FROM rollups
    WHERE (span_ms = 3600000 AND start_ms > OLD.t0_ms - 3600000 AND start_ms < OLD.t1_ms)
       OR (span_ms = 86400000 AND start_ms > OLD.t0_ms - 86400000 AND start_ms < OLD.t1_ms)
       OR (span_ms = 3600000 AND start_ms > NEW.t0_ms - 3600000 AND start_ms < NEW.t1_ms)
       OR (span_ms = 86400000 AND start_ms > NEW.t0_ms - 86400000 AND start_ms < NEW.t1_ms);
END;

CREATE TRIGGER IF NOT EXISTS workload_gpu_time_insert_drops_rollups AFTER INSERT ON workload_gpu_time
WHEN EXISTS (SELECT 1 FROM rollups
             WHERE (span_ms = 3600000 AND start_ms > NEW.t0_ms - 3600000 AND start_ms < NEW.t1_ms)
                OR (span_ms = 86400000 AND start_ms > NEW.t0_ms - 86400000 AND start_ms < NEW.t1_ms))
BEGIN
    DELETE FROM rollup_parts
    WHERE (span_ms = 3600000 AND start_ms > NEW.t0_ms - 3600000 AND start_ms < NEW.t1_ms)
       OR (span_ms = 86400000 AND start_ms > NEW.t0_ms - 86400000 AND start_ms < NEW.t1_ms);
    DELETE FROM rollup_gpus
    WHERE (span_ms = 3600000 AND start_ms > NEW.t0_ms - 3600000 AND start_ms < NEW.t1_ms)
       OR (span_ms = 86400000 AND start_ms > NEW.t0_ms - 86400000 AND start_ms < NEW.t1_ms);
    DELETE FROM rollups
    WHERE (span_ms = 3600000 AND start_ms > NEW.t0_ms - 3600000 AND start_ms < NEW.t1_ms)
       OR (span_ms = 86400000 AND start_ms > NEW.t0_ms - 86400000 AND start_ms < NEW.t1_ms);
END;

CREATE TRIGGER IF NOT EXISTS workload_gpu_time_delete_drops_rollups AFTER DELETE ON workload_gpu_time
WHEN EXISTS (SELECT 1 FROM rollups
             WHERE (span_ms = 3600000 AND start_ms > OLD.t0_ms - 3600000 AND start_ms < OLD.t1_ms)
                OR (span_ms = 86400000 AND start_ms > OLD.t0_ms - 86400000 AND start_ms < OLD.t1_ms))
BEGIN
    DELETE FROM rollup_parts
    WHERE (span_ms = 3600000 AND start_ms > OLD.t0_ms - 3600000 AND start_ms < OLD.t1_ms)
       OR (span_ms = 86400000 AND start_ms > OLD.t0_ms - 86400000 AND start_ms < OLD.t1_ms);
    DELETE FROM rollup_gpus
    WHERE (span_ms = 3600000 AND start_ms > OLD.t0_ms - 3600000 AND start_ms < OLD.t1_ms)
       OR (span_ms = 86400000 AND start_ms > OLD.t0_ms - 86400000 AND start_ms < OLD.t1_ms);
    DELETE FROM rollups
    WHERE (span_ms = 3600000 AND start_ms > OLD.t0_ms - 3600000 AND start_ms < OLD.t1_ms)
       OR (span_ms = 86400000 AND start_ms > OLD.t0_ms - 86400000 AND start_ms < OLD.t1_ms);
END;

CREATE TRIGGER IF NOT EXISTS workload_gpu_time_update_drops_rollups AFTER UPDATE ON workload_gpu_time
BEGIN
    DELETE FROM rollup_parts
    WHERE (span_ms = 3600000 AND start_ms > OLD.t0_ms - 3600000 AND start_ms < OLD.t1_ms)
       OR (span_ms = 86400000 AND start_ms > OLD.t0_ms - 86400000 AND start_ms < OLD.t1_ms)
       OR (span_ms = 3600000 AND start_ms > NEW.t0_ms - 3600000 AND start_ms < NEW.t1_ms)
       OR (span_ms = 86400000 AND start_ms > NEW.t0_ms - 86400000 AND start_ms < NEW.t1_ms);
    DELETE FROM rollup_gpus
    WHERE (span_ms = 3600000 AND start_ms > OLD.t0_ms - 3600000 AND start_ms < OLD.t1_ms)
       OR (span_ms = 86400000 AND start_ms > OLD.t0_ms - 86400000 AND start_ms < OLD.t1_ms)
       OR (span_ms = 3600000 AND start_ms > NEW.t0_ms - 3600000 AND start_ms < NEW.t1_ms)
       OR (span_ms = 86400000 AND start_ms > NEW.t0_ms - 86400000 AND start_ms < NEW.t1_ms);
    DELETE FROM rollups
    WHERE (span_ms = 3600000 AND start_ms > OLD.t0_ms - 3600000 AND start_ms < OLD.t1_ms)
       OR (span_ms = 86400000 AND start_ms > OLD.t0_ms - 86400000 AND start_ms < OLD.t1_ms)
       OR (span_ms = 3600000 AND start_ms > NEW.t0_ms - 3600000 AND start_ms < NEW.t1_ms)
       OR (span_ms = 86400000 AND start_ms > NEW.t0_ms - 86400000 AND start_ms < NEW.t1_ms);
END;
