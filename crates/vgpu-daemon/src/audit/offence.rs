//! Offences (pure): the watch judges workloads, not processes. Every kill verdict of the
//! audits against a workload's processes — memory over its quota, memory or kernels on a GPU
//! outside its vGPU, compute that throttling could not bring down or that `compute = "kill"`
//! condemns — is an **offence of the workload** those processes belong to (by cgroup: in a
//! partition's vGPU, of the workload whose processes offended, not of its neighbours).
//!
//! - A workload's **first** offence kills the offending processes (the watch freezes the
//!   whole cgroup first, so nothing in it runs, allocates or spawns a replacement meanwhile).
//! - A **second** offence within `window` of the first ends the whole workload.
//! - An offence more than `window` after the previous first one is a first offence again.
//!
//! One round's verdicts against one workload are one offence (the caller gathers them), and
//! a process already condemned does not make a new offence when a later round still sees it
//! (NVML may list a dying process for a moment): only processes not condemned before do.
//! Times are wall-clock milliseconds, so that a restarted watch can carry on from the
//! offences the records say happened (`seed`).

use std::collections::{HashMap, HashSet};

use vgpu_abi::process::ProcessId;

/// One offence: when, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offence {
    pub at_unix_ms: u64,
    pub reason: String,
}

/// What an offence means for its workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// Its first within the window: kill `processes`.
    First { processes: Vec<ProcessId> },
    /// Another within the window of `first`: end the whole workload.
    Second { first: Offence, processes: Vec<ProcessId> },
}

/// What the watch remembers of each workload's offences.
#[derive(Debug, Default)]
pub struct Offences {
    /// Each workload's last first offence.
    first: HashMap<String, Offence>,
    /// Each workload's condemned processes, with when they were condemned.
    condemned: HashMap<String, Vec<(ProcessId, u64)>>,
}

impl Offences {
    /// Workload `id`'s processes `processes` are condemned at `now_unix_ms` for `reason`.
    /// None when every one of them was condemned already (no new offence); else whether it
    /// is the workload's first offence within `window_ms` or a second one, with the
    /// processes not condemned before.
    pub fn offend(&mut self, id: &str, processes: &[ProcessId], reason: &str, now_unix_ms: u64, window_ms: u64) -> Option<Judgement> {
        let condemned = self.condemned.entry(id.to_string()).or_default();
        // Forget what is long past (a pid is not reused within a window: start times differ
        // anyway); keep the list short.
        condemned.retain(|(_, at)| now_unix_ms.saturating_sub(*at) <= window_ms.max(60_000));
        let before: HashSet<ProcessId> = condemned.iter().map(|(p, _)| *p).collect();
        let mut fresh: Vec<ProcessId> = Vec::new();
        for p in processes {
            if !before.contains(p) && !fresh.contains(p) {
                fresh.push(*p);
            }
        }
        if fresh.is_empty() {
            return None;
        }
        condemned.extend(fresh.iter().map(|p| (*p, now_unix_ms)));
        let within = self.first.get(id).filter(|f| now_unix_ms.saturating_sub(f.at_unix_ms) < window_ms).cloned();
        match within {
            Some(first) => Some(Judgement::Second { first, processes: fresh }),
            None => {
                self.first.insert(id.to_string(), Offence { at_unix_ms: now_unix_ms, reason: reason.to_string() });
                Some(Judgement::First { processes: fresh })
            }
        }
    }

    /// What a record says: workload `id` had an offence at `at_unix_ms` (a watch that is
    /// gone recorded it). Kept unless a later one is known.
    pub fn seed(&mut self, id: &str, at_unix_ms: u64, reason: &str) {
        let known = self.first.get(id).is_some_and(|f| f.at_unix_ms >= at_unix_ms);
        if !known {
            self.first.insert(id.to_string(), Offence { at_unix_ms, reason: reason.to_string() });
        }
    }

    /// Whether anything is known of workload `id`.
    pub fn knows(&self, id: &str) -> bool {
        self.first.contains_key(id) || self.condemned.contains_key(id)
    }

    /// Forget the workloads that are gone.
    pub fn retain(&mut self, live: &HashSet<&str>) {
        self.first.retain(|id, _| live.contains(id.as_str()));
        self.condemned.retain(|id, _| live.contains(id.as_str()));
    }
}

/// "10m", "90s": a window as the reason says it.
pub fn describe_window(window_ms: u64) -> String {
    humantime::format_duration(std::time::Duration::from_secs(window_ms / 1000)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIN: u64 = 60_000;

    fn pid(n: u32) -> ProcessId {
        ProcessId { pid: n, start_time: 9 }
    }

    #[test]
    fn a_second_offence_within_the_window_ends_the_workload() {
        let mut o = Offences::default();
        assert_eq!(o.offend("w", &[pid(1)], "over memory quota", 0, 10 * MIN), Some(Judgement::First { processes: vec![pid(1)] }));
        // The same process seen again (dying): no new offence.
        assert_eq!(o.offend("w", &[pid(1)], "over memory quota", 1_000, 10 * MIN), None);
        // Its replacement, a minute later: the second.
        let second = o.offend("w", &[pid(1), pid(2)], "over memory quota again", MIN, 10 * MIN);
        assert_eq!(second, Some(Judgement::Second { first: Offence { at_unix_ms: 0, reason: "over memory quota".into() }, processes: vec![pid(2)] }));
        // Another workload's offences are its own.
        assert_eq!(o.offend("v", &[pid(3)], "r", MIN, 10 * MIN), Some(Judgement::First { processes: vec![pid(3)] }));
    }

    #[test]
    fn after_the_window_it_is_a_first_offence_again() {
        let mut o = Offences::default();
        assert!(matches!(o.offend("w", &[pid(1)], "r", 0, 10 * MIN), Some(Judgement::First { .. })));
        assert!(matches!(o.offend("w", &[pid(2)], "r", 10 * MIN, 10 * MIN), Some(Judgement::First { .. })), "exactly a window later");
        assert!(matches!(o.offend("w", &[pid(3)], "r", 11 * MIN, 10 * MIN), Some(Judgement::Second { .. })));
        // A window of 0: never a second offence.
        let mut o = Offences::default();
        assert!(matches!(o.offend("w", &[pid(1)], "r", 0, 0), Some(Judgement::First { .. })));
        assert!(matches!(o.offend("w", &[pid(2)], "r", 0, 0), Some(Judgement::First { .. })));
    }

    #[test]
    fn a_restarted_watch_carries_on_from_the_record() {
        let mut o = Offences::default();
        o.seed("w", 5 * MIN, "over memory quota on GPU 0");
        assert!(!o.knows("x"));
        let j = o.offend("w", &[pid(7)], "r", 6 * MIN, 10 * MIN).unwrap();
        assert!(matches!(j, Judgement::Second { ref first, .. } if first.reason == "over memory quota on GPU 0"), "{j:?}");
        o.retain(&HashSet::new());
        assert!(!o.knows("w"), "forgotten once gone");
    }

    proptest! {
        /// Offences are counted per window: an offence is a second one exactly when the
        /// workload had a first one less than a window before it; processes already
        /// condemned never make an offence.
        #[test]
        fn offences_are_counted_per_window(
            gaps in proptest::collection::vec(0u64..20 * MIN, 1..30),
            window in 0u64..15 * MIN,
            repeat in proptest::collection::vec(any::<bool>(), 30),
        ) {
            let mut o = Offences::default();
            let mut now = 0;
            let mut first_at: Option<u64> = None;
            let mut next_pid = 1;
            let (mut last, mut last_at) = (pid(0), 0);
            for (i, gap) in gaps.iter().enumerate() {
                now += gap;
                // Sometimes the same process as last time (already condemned, and remembered
                // for a window or a minute), else a new one.
                let again = i > 0 && repeat[i] && now - last_at <= window.max(MIN);
                let p = if again { last } else { next_pid += 1; pid(next_pid) };
                let j = o.offend("w", &[p], "r", now, window);
                if again {
                    prop_assert_eq!(j, None);
                    continue;
                }
                let expect_second = first_at.is_some_and(|f| now - f < window);
                match j {
                    Some(Judgement::Second { first, processes }) => {
                        prop_assert!(expect_second);
                        prop_assert_eq!(Some(first.at_unix_ms), first_at);
                        prop_assert_eq!(processes, vec![p]);
                    }
                    Some(Judgement::First { processes }) => {
                        prop_assert!(!expect_second);
                        prop_assert_eq!(processes, vec![p]);
                        first_at = Some(now);
                    }
                    None => prop_assert!(false, "a new process made no offence"),
                }
                (last, last_at) = (p, now);
            }
        }
    }
}
