//! What `vgpu watch` did about workloads that broke their slice, counted for the metrics
//! (`vgpu_enforcements_total{action, reason, id, name, user}`). The watch's audits call
//! [`Enforcements::record`] once per process they signal (`Kill`; not again for the SIGKILL
//! that may follow the SIGTERM) or report (`Report`), once per throttling they begin
//! (`Throttle`), and once per workload ended whole at its second offence (`End`); the counters live as long as the watch (Prometheus sees a restart as a
//! counter reset).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use vgpu_store::state::Workload;

/// What the watch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Logged it (and counted it here) only, as `report` policies say.
    Report,
    /// Duty-cycled its cgroup freezer down to its share.
    Throttle,
    /// SIGKILL to a process (SIGTERM, then SIGKILL, for one in no vGPU).
    Kill,
    /// The whole workload killed: its second offence within `[watch] offence_window`.
    End,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Report => "report",
            Action::Throttle => "throttle",
            Action::Kill => "kill",
            Action::End => "end",
        }
    }
}

/// Whose: the workload's labels; all empty for a process in no vGPU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct WorkloadLabels {
    pub id: String,
    pub name: String,
    pub user: String,
}

impl WorkloadLabels {
    pub fn of(w: &Workload) -> WorkloadLabels {
        WorkloadLabels { id: w.id.clone(), name: w.name.clone(), user: w.user.name.clone() }
    }

    /// Workload `id`'s labels from the records (only its id when it has none).
    pub fn find(workloads: &[Workload], id: &str) -> WorkloadLabels {
        match workloads.iter().find(|w| w.id == id) {
            Some(w) => WorkloadLabels::of(w),
            None => WorkloadLabels { id: id.to_string(), ..WorkloadLabels::default() },
        }
    }

    /// A process that belongs to no workload (`reason = "unmanaged"`).
    pub fn none() -> WorkloadLabels {
        WorkloadLabels::default()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct EnforcementLabels {
    pub action: String,
    /// The audit that acted: `memory`, `compute`, `unmanaged`.
    pub reason: String,
    pub id: String,
    pub name: String,
    pub user: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct HistoryLabels {
    /// The kind of failure: `disk-full`, `busy`, `damaged`, `open`, `sqlite`, `snapshot`.
    pub kind: String,
}

/// The counters, shared (cloning shares them) between the audits and the rendering; with
/// them, the history writes that failed (`vgpu_history_write_failures_total{kind}`).
#[derive(Debug, Clone, Default)]
pub struct Enforcements {
    family: Family<EnforcementLabels, Counter>,
    history: Family<HistoryLabels, Counter>,
}

impl Enforcements {
    /// Count one action of the audit `reason` (`memory`, `compute`, `unmanaged`) on `who`.
    pub fn record(&self, action: Action, reason: &str, who: &WorkloadLabels) {
        self.family.get_or_create(&labels(action, reason, who)).inc();
    }

    /// How many were counted so far.
    pub fn count(&self, action: Action, reason: &str, who: &WorkloadLabels) -> u64 {
        self.family.get(&labels(action, reason, who)).map(|c| c.get()).unwrap_or(0)
    }

    pub(crate) fn family(&self) -> &Family<EnforcementLabels, Counter> {
        &self.family
    }

    /// Count one history write that failed, by its kind (`WriteError::kind`).
    pub fn history_failure(&self, kind: &str) {
        self.history.get_or_create(&HistoryLabels { kind: kind.to_string() }).inc();
    }

    pub fn history_failures(&self, kind: &str) -> u64 {
        self.history.get(&HistoryLabels { kind: kind.to_string() }).map(|c| c.get()).unwrap_or(0)
    }

    pub(crate) fn history_family(&self) -> &Family<HistoryLabels, Counter> {
        &self.history
    }
}

fn labels(action: Action, reason: &str, who: &WorkloadLabels) -> EnforcementLabels {
    EnforcementLabels {
        action: action.as_str().to_string(),
        reason: reason.to_string(),
        id: who.id.clone(),
        name: who.name.clone(),
        user: who.user.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_action_reason_and_workload_and_clones_share_them() {
        let e = Enforcements::default();
        let a = WorkloadLabels { id: "a1".into(), name: "train".into(), user: "alice".into() };
        let shared = e.clone();
        shared.record(Action::Kill, "memory", &a);
        shared.record(Action::Kill, "memory", &a);
        e.record(Action::Throttle, "compute", &a);
        e.record(Action::Report, "unmanaged", &WorkloadLabels::none());
        assert_eq!(e.count(Action::Kill, "memory", &a), 2);
        assert_eq!(e.count(Action::Throttle, "compute", &a), 1);
        assert_eq!(e.count(Action::Kill, "compute", &a), 0);
        assert_eq!(e.count(Action::Report, "unmanaged", &WorkloadLabels::none()), 1);
    }
}
