//! Device kinds (the pool's regions) and the `--kind` filter of a request.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};


/// The kind of an accelerator. The order of the variants is the order of the regions in a
/// node's block numbering (SPEC 1.2): GPUs first, then NPUs, then FPGAs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum DeviceKind {
    Gpu,
    Npu,
    Fpga,
}

impl DeviceKind {
    pub const ALL: [DeviceKind; 3] = [DeviceKind::Gpu, DeviceKind::Npu, DeviceKind::Fpga];

    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Gpu => "gpu",
            DeviceKind::Npu => "npu",
            DeviceKind::Fpga => "fpga",
        }
    }
}

/// A kind that is none of the known ones (`--kind tpu`); the pool's own error wraps it
/// (`PoolError::UnknownKind`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown device kind {given:?}: expected {expected}")]
pub struct UnknownKind {
    pub given: String,
    pub expected: &'static str,
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DeviceKind {
    type Err = UnknownKind;

    fn from_str(s: &str) -> Result<Self, UnknownKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "gpu" => Ok(DeviceKind::Gpu),
            "npu" => Ok(DeviceKind::Npu),
            "fpga" => Ok(DeviceKind::Fpga),
            _ => Err(UnknownKind { given: s.to_string(), expected: "gpu, npu or fpga" }),
        }
    }
}

impl TryFrom<String> for DeviceKind {
    type Error = UnknownKind;

    fn try_from(s: String) -> Result<Self, UnknownKind> {
        s.parse()
    }
}

/// Which devices a request may use: `--kind gpu|npu|fpga|any`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum KindFilter {
    Only(DeviceKind),
    /// Any device; a request spanning devices may then mix kinds, as in SPEC 1.2's 50-block
    /// example.
    #[default]
    Any,
}

impl KindFilter {
    pub fn admits(self, kind: DeviceKind) -> bool {
        match self {
            KindFilter::Only(k) => k == kind,
            KindFilter::Any => true,
        }
    }
}

impl fmt::Display for KindFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KindFilter::Only(kind) => kind.fmt(f),
            KindFilter::Any => f.write_str("any"),
        }
    }
}

impl FromStr for KindFilter {
    type Err = UnknownKind;

    fn from_str(s: &str) -> Result<Self, UnknownKind> {
        if s.trim().eq_ignore_ascii_case("any") {
            return Ok(KindFilter::Any);
        }
        s.parse::<DeviceKind>()
            .map(KindFilter::Only)
            .map_err(|_| UnknownKind { given: s.to_string(), expected: "gpu, npu, fpga or any" })
    }
}

impl TryFrom<String> for KindFilter {
    type Error = UnknownKind;

    fn try_from(s: String) -> Result<Self, UnknownKind> {
        s.parse()
    }
}

impl From<KindFilter> for String {
    fn from(filter: KindFilter) -> String {
        filter.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_case_insensitively_and_unknown_is_typed() {
        assert_eq!("GPU".parse::<DeviceKind>().unwrap(), DeviceKind::Gpu);
        assert_eq!("any".parse::<KindFilter>().unwrap(), KindFilter::Any);
        assert_eq!("fpga".parse::<KindFilter>().unwrap(), KindFilter::Only(DeviceKind::Fpga));
        let err = "tpu".parse::<KindFilter>().unwrap_err();
        assert!(matches!(err, UnknownKind { .. }));
        assert!(err.to_string().contains("gpu, npu, fpga or any"), "{err}");
        assert!("any".parse::<DeviceKind>().is_err(), "a device has a kind; `any` is only a filter");
    }

    #[test]
    fn region_order_is_gpu_npu_fpga() {
        assert!(DeviceKind::Gpu < DeviceKind::Npu && DeviceKind::Npu < DeviceKind::Fpga);
    }
}
