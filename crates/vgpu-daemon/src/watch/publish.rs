//! The watch's metrics (`crate::metrics`): published after every round, followed on reload,
//! and the counters its audits bump.

use std::net::SocketAddr;

use super::{Event, Watch};
use crate::metrics::Change;
use crate::metrics::Enforcements;

impl Watch {
    /// Where the metrics endpoint serves (the bound address), if it does.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.addr()
    }

    /// The enforcement counters (`vgpu_enforcements_total`): the audits call
    /// `record(action, reason, who)` for each process they act on.
    pub fn enforcements(&self) -> &Enforcements {
        self.metrics.enforcements()
    }

    /// Gather, render and publish this round's figures.
    pub(super) fn publish(&mut self, events: &mut Vec<Event>) {
        let services = self.services().metrics();
        for problem in self.metrics.publish(&self.ctx, &self.store, self.snapshot.as_ref(), &services) {
            events.push(Event::warn(problem.to_string()));
        }
    }

    /// Follow the reloaded `[watch] listen` and `textfile`.
    pub(super) fn reload_metrics(&mut self, events: &mut Vec<Event>) {
        for change in self.metrics.reconfigure(&self.ctx.config.watch) {
            events.push(match change {
                Change::Listening(addr) => Event::info(format!("metrics on http://{addr}/metrics")),
                Change::StoppedListening => Event::info("metrics endpoint stopped ([watch] listen is empty)"),
                Change::KeptListening { addr: Some(addr), error } => {
                    Event::warn(format!("{error}; still serving on http://{addr}/metrics (a restart moves it)"))
                }
                Change::KeptListening { addr: None, error } => Event::warn(error.to_string()),
                Change::Textfile(Some(path)) => Event::info(format!("metrics textfile {}", path.display())),
                Change::Textfile(None) => Event::info("no metrics textfile any more"),
                Change::OldTextfileLeft(error) => Event::warn(error.to_string()),
            });
        }
    }
}
