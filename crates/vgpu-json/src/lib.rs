//! The scripting contract of every `--json` output: one vocabulary of field names, a
//! `"schema": N` field on every document, and the documentation of both
//! ([`JSON_SCHEMA_DOC`], `docs/json-schema.md`).
//!
//! The vocabulary: a quantity's unit is its name's suffix (`_bytes`, `_unix_ms` for points
//! in time, `_ms`/`_ns` for durations, `_pct`, `_mhz`, `_w`, `_g_per_kwh`, `_g_per_hour`); an
//! object's own identity is `id`/`name` (a GPU's `index`/`uuid`); a GPU referred to from
//! another object is `gpu_index`/`gpu_uuid`, a workload `{"id", "name"}` ([`WorkloadRef`]) or
//! `workload_id`. Renaming, removing or retyping a field bumps [`SCHEMA`];
//! `tests/json_schema.rs` fails when a field changes and it was not bumped.

use serde::Serialize;

/// The version of the field names and types of every `--json` output.
pub const SCHEMA: u32 = 1;

/// The schema, documented: the user guide (`docs/json-schema.md` is a page of it) and the man pages use it.
pub const JSON_SCHEMA_DOC: &str = include_str!("../../../docs/json-schema.md");

/// The parts of [`JSON_SCHEMA_DOC`] about `command` (`"ps"`, `"partition list"`, `"carbon
/// apply"`): each section whose heading names it (`## \`vgpu carbon apply|reset --json\``),
/// heading included, for a man page's JSON OUTPUT. None when no section names it.
pub fn doc_of(command: &str) -> Option<String> {
    let wanted: Vec<&str> = command.split_whitespace().collect();
    let mut found = Vec::new();
    let mut sections = JSON_SCHEMA_DOC.split("\n## ").skip(1);
    for section in sections.by_ref() {
        let heading = section.lines().next().unwrap_or_default();
        let words: Vec<&str> = heading.trim_matches('`').split_whitespace().skip(1).take_while(|w| !w.starts_with('-')).collect();
        let names = words.len() == wanted.len() && words.iter().zip(&wanted).all(|(w, c)| w.split('|').any(|alt| alt == *c));
        if names {
            found.push(format!("## {}", section.trim_end()));
        }
    }
    (!found.is_empty()).then(|| found.join("\n\n"))
}

/// A top-level JSON document: `{"schema": N, ...body's fields}`. `body` must serialize as
/// an object (a struct or a map).
#[derive(Debug, Serialize)]
pub struct Document<'a, T: Serialize + ?Sized> {
    pub schema: u32,
    #[serde(flatten)]
    pub body: &'a T,
}

/// `body` as a document of this [`SCHEMA`].
pub fn document<T: Serialize + ?Sized>(body: &T) -> Document<'_, T> {
    Document { schema: SCHEMA, body }
}

/// A document as text: pretty (several lines) or one line (`--watch`'s JSON Lines).
pub fn to_text<T: Serialize + ?Sized>(body: &T, pretty: bool) -> Result<String, serde_json::Error> {
    let doc = document(body);
    if pretty {
        serde_json::to_string_pretty(&doc)
    } else {
        serde_json::to_string(&doc)
    }
}

/// A workload referred to from another object (who suspended whom, a partition's users).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkloadRef {
    pub id: String,
    pub name: String,
}

/// Why a workload is suspended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SuspendedReason {
    /// `vgpu suspend`.
    Manual,
    /// A higher-priority pool workload took its blocks (`suspended_by` says which).
    Preempted,
    /// Slurm suspended the job step (its tasks stopped: `scontrol suspend`, preemption by
    /// suspension).
    Slurm,
    /// Something else (a record written by another vgpu version).
    Other,
}

impl SuspendedReason {
    /// From a workload record's free-text reason (`manual`, `preempted by NAME`).
    pub fn of_record(text: &str) -> SuspendedReason {
        if text == "manual" {
            SuspendedReason::Manual
        } else if text.starts_with("preempted") {
            SuspendedReason::Preempted
        } else if text == "suspended by Slurm" {
            SuspendedReason::Slurm
        } else {
            SuspendedReason::Other
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SuspendedReason::Manual => "manual",
            SuspendedReason::Preempted => "preempted",
            SuspendedReason::Slurm => "slurm",
            SuspendedReason::Other => "other",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Body {
        workloads: Vec<u32>,
    }

    #[test]
    fn documents_carry_the_schema_first() {
        assert_eq!(to_text(&Body { workloads: vec![1] }, false).unwrap(), r#"{"schema":1,"workloads":[1]}"#);
    }

    #[test]
    fn each_commands_section_is_found_by_its_name() {
        assert!(doc_of("ps").is_some_and(|d| d.starts_with("## `vgpu ps --json") && d.contains("memory_quota_bytes")));
        assert!(doc_of("kill").is_some_and(|d| d.contains("`signalled`")));
        assert!(doc_of("carbon reset").is_some_and(|d| d.contains("time_unix_ms")));
        let doctor = doc_of("doctor").unwrap();
        assert!(doctor.contains("\"checks\"") && doctor.contains("\"removed\""), "both of doctor's outputs: {doctor}");
        assert_eq!(doc_of("carbon"), None);
        assert_eq!(doc_of("run"), None);
    }

    #[test]
    fn record_reasons_become_the_enum() {
        assert_eq!(SuspendedReason::of_record("manual"), SuspendedReason::Manual);
        assert_eq!(SuspendedReason::of_record("preempted by train"), SuspendedReason::Preempted);
        assert_eq!(SuspendedReason::of_record("planned"), SuspendedReason::Other);
    }
}
