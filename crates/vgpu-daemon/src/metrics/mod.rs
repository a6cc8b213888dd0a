//! Prometheus metrics of `vgpu watch`: per GPU, per workload, the enforcement counters, the
//! compute pool and the carbon budget, served on `[watch] listen` and written to the
//! node_exporter textfile `[watch] textfile` after every round.
//!
//! * [`collect`]: one round's figures as plain data ([`model::Metrics`]), from the NVML
//!   snapshot, the records (through `listing::row`, so they are `vgpu ps --json`'s), the
//!   pool, the applied caps ([`caps`]) and the carbon intensity ([`intensity`]).
//! * [`exposition`]: rendered with `prometheus-client` (OpenMetrics, and the classic text
//!   format for everybody else).
//! * [`server`]: the HTTP endpoint (hyper on a thread of its own; connections capped and
//!   timed, never waited for); [`textfile`]: the atomic textfile.
//! * [`enforcements`]: the counters the watch's audits bump.
//!
//! [`Exporter`] ties them together for the watch; it returns what went wrong, the watch
//! logs it.

pub mod caps;
pub mod collect;
pub mod enforcements;
pub mod exposition;
pub mod intensity;
pub mod model;
pub mod server;
pub mod textfile;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

pub use enforcements::{Action, Enforcements, WorkloadLabels};
pub use exposition::Exposition;

use vgpu_gpu::snapshot::Snapshot;
use vgpu_carbon::apply::APPLIED_FILE;
use vgpu_cgroups::Layout;
use vgpu_host::context::Context;
use vgpu_store::state::Store;
use vgpu_host::config::watch::WatchConfig;
use server::{BindError, Endpoint, Latest, Limits};
use textfile::TextfileError;

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error(transparent)]
    Textfile(#[from] TextfileError),
    #[error(transparent)]
    Intensity(#[from] intensity::IntensityError),
    /// `[watch] listen` is not an address (the config's validation says so first).
    #[error("{0}")]
    Listen(String),
    #[error("compute pool metrics left out: {0}")]
    Pool(String),
    #[error("cannot render the metrics: {0}")]
    Render(std::fmt::Error),
    /// What the endpoint's thread found (a cap reached, accepts failing for want of
    /// descriptors).
    #[error("{0}")]
    Endpoint(String),
}

/// What a new config changed.
#[derive(Debug)]
pub enum Change {
    /// Serving on this (newly bound) address.
    Listening(SocketAddr),
    /// `listen` became empty: no endpoint any more.
    StoppedListening,
    /// The new address could not be bound; the old endpoint, if any, keeps serving.
    KeptListening { addr: Option<SocketAddr>, error: MetricsError },
    /// The textfile is now this one (None: none); the old one was removed.
    Textfile(Option<PathBuf>),
    /// The old textfile could not be removed.
    OldTextfileLeft(TextfileError),
}

/// The metrics of one watch: its endpoint, its textfile, its counters.
pub struct Exporter {
    latest: Latest,
    endpoint: Option<Endpoint>,
    /// `[watch] listen` as configured (the endpoint's own address may differ: port 0).
    listen: Option<SocketAddr>,
    textfile: Option<PathBuf>,
    enforcements: Enforcements,
    intensity: intensity::IntensityFeed,
    caps: Option<caps::Caps>,
    layout: Option<Layout>,
    /// Problems logged already (each is logged when it appears, not every round).
    reported: HashSet<String>,
}

impl Exporter {
    /// Bind the endpoint when `listen` is set.
    pub fn start(config: &WatchConfig) -> Result<Exporter, MetricsError> {
        let listen = config.listen_addr().map_err(MetricsError::Listen)?;
        let latest = Latest::default();
        let endpoint = listen.map(|addr| Endpoint::bind(addr, latest.clone(), Limits::of(config, vgpu_host::fdlimit::current()))).transpose()?;
        Ok(Exporter {
            latest,
            endpoint,
            listen,
            textfile: config.textfile.clone(),
            enforcements: Enforcements::default(),
            intensity: intensity::IntensityFeed::default(),
            caps: None,
            layout: Layout::detect(),
            reported: HashSet::new(),
        })
    }

    /// Where the endpoint serves (the bound address: `listen = "127.0.0.1:0"` gets a port).
    pub fn addr(&self) -> Option<SocketAddr> {
        self.endpoint.as_ref().map(Endpoint::addr)
    }

    pub fn textfile(&self) -> Option<&Path> {
        self.textfile.as_deref()
    }

    /// The counters the audits bump (clones share them).
    pub fn enforcements(&self) -> &Enforcements {
        &self.enforcements
    }

    /// The latest rendering (None before the first round).
    pub fn latest(&self) -> Option<Arc<Exposition>> {
        self.latest.get()
    }

    /// The endpoint's caps and timeouts in force (None: no endpoint).
    pub fn limits(&self) -> Option<Limits> {
        self.endpoint.as_ref().map(Endpoint::limits)
    }

    /// Follow a new `[watch]` table: bind a changed `listen` (the old endpoint serves until
    /// the new one is bound, and keeps serving if it cannot be: moving to another address on
    /// the same port needs a restart; the old one is stopped without waiting for it), take
    /// the new caps and timeouts, and switch the textfile (removing the old one, whose
    /// figures would otherwise go stale).
    pub fn reconfigure(&mut self, config: &WatchConfig) -> Vec<Change> {
        let mut changes = Vec::new();
        match config.listen_addr() {
            Err(message) => changes.push(Change::KeptListening { addr: self.addr(), error: MetricsError::Listen(message) }),
            Ok(listen) if listen == self.listen => {}
            Ok(None) => {
                self.endpoint = None;
                self.listen = None;
                changes.push(Change::StoppedListening);
            }
            Ok(Some(addr)) => match Endpoint::bind(addr, self.latest.clone(), Limits::of(config, vgpu_host::fdlimit::current())) {
                Ok(endpoint) => {
                    changes.push(Change::Listening(endpoint.addr()));
                    self.endpoint = Some(endpoint);
                    self.listen = Some(addr);
                }
                Err(e) => changes.push(Change::KeptListening { addr: self.addr(), error: e.into() }),
            },
        }
        if let Some(endpoint) = &self.endpoint {
            endpoint.set_limits(Limits::of(config, vgpu_host::fdlimit::current()));
        }
        if config.textfile != self.textfile {
            if let Some(old) = self.textfile.take() {
                if let Err(e) = textfile::remove(&old) {
                    changes.push(Change::OldTextfileLeft(e));
                }
            }
            self.textfile = config.textfile.clone();
            changes.push(Change::Textfile(self.textfile.clone()));
        }
        changes
    }

    /// Gather, render and publish one round's figures (when there is anywhere to publish
    /// them). Returns the problems not returned at the previous round.
    pub fn publish(&mut self, ctx: &Context, store: &Store, snapshot: Option<&Snapshot>, services: &[model::ServiceMetrics]) -> Vec<MetricsError> {
        if self.endpoint.is_none() && self.textfile.is_none() {
            return Vec::new();
        }
        let mut problems: Vec<MetricsError> = self.endpoint.iter().flat_map(Endpoint::take_problems).map(MetricsError::Endpoint).collect();
        let intensity = match self.intensity.poll(&ctx.config.carbon, &ctx.lib_dir, Instant::now()) {
            Ok(found) => found.cloned(),
            Err(e) => {
                problems.push(e.into());
                None
            }
        };
        let applied = self.caps.get_or_insert_with(|| caps::Caps::new(ctx.state_path(APPLIED_FILE))).current().to_vec();
        let sources = collect::Sources {
            store,
            layout: self.layout.as_ref(),
            snapshot,
            pool_config: &ctx.config.pool,
            applied: &applied,
            intensity: intensity.as_ref(),
            budget_g_per_hour: ctx.config.carbon.budget_g_per_hour,
            now_unix_ms: vgpu_store::clock::now_ms(),
            services,
        };
        let (metrics, left_out) = collect::collect(&sources);
        problems.extend(left_out);
        match exposition::render(&metrics, &self.enforcements) {
            Ok(rendered) => {
                if let Some(path) = &self.textfile {
                    if let Err(e) = textfile::write(path, &rendered.text) {
                        problems.push(e.into());
                    }
                }
                self.latest.set(rendered);
            }
            Err(e) => problems.push(MetricsError::Render(e)),
        }
        self.new_ones(problems)
    }

    fn new_ones(&mut self, problems: Vec<MetricsError>) -> Vec<MetricsError> {
        let now: HashSet<String> = problems.iter().map(ToString::to_string).collect();
        let fresh = problems.into_iter().filter(|p| !self.reported.contains(&p.to_string())).collect();
        self.reported = now;
        fresh
    }
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter").field("addr", &self.addr()).field("textfile", &self.textfile).finish_non_exhaustive()
    }
}
