//! A request for blocks: `vgpu run --tflops N --priority P --kind K`.

use super::error::PoolError;
use super::kind::KindFilter;
use super::priority::Priority;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The workload's id (the state store's key).
    pub id: String,
    /// What people call it (the command, or `--name`).
    pub name: String,
    /// Blocks wanted; at least 1.
    pub blocks: u64,
    pub priority: Priority,
    pub kind: KindFilter,
}

impl Request {
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        blocks: u64,
        priority: Priority,
        kind: KindFilter,
    ) -> Self {
        Request { id: id.into(), name: name.into(), blocks, priority, kind }
    }

    /// A request for `tflops` TFLOPS, rounded up to whole blocks of `block_tflops`.
    pub fn for_tflops(
        id: impl Into<String>,
        name: impl Into<String>,
        tflops: f64,
        block_tflops: f64,
        priority: Priority,
        kind: KindFilter,
    ) -> Result<Self, PoolError> {
        Ok(Request::new(id, name, blocks_for(tflops, block_tflops)?, priority, kind))
    }
}

/// Parse `--tflops`: a positive, finite number ("4", "2.5").
pub fn parse_tflops(text: &str) -> Result<f64, PoolError> {
    let value: f64 = text.trim().parse().map_err(|_| PoolError::InvalidTflops(text.to_string()))?;
    check_tflops(value).map_err(|_| PoolError::InvalidTflops(text.to_string()))
}

/// The blocks a request of `tflops` needs: rounded up, so a workload gets at least what it
/// asked for (2.5 TFLOPS in 1-TFLOPS blocks: 3 blocks). The small slack absorbs decimal
/// noise (0.3 / 0.1 is 3.0000000000000004).
pub fn blocks_for(tflops: f64, block_tflops: f64) -> Result<u64, PoolError> {
    check_tflops(tflops)?;
    if !(block_tflops.is_finite() && block_tflops > 0.0) {
        return Err(PoolError::InvalidConfigTflops { key: "block_tflops".into(), value: block_tflops });
    }
    // `as` saturates: an absurd request becomes u64::MAX blocks and is refused as too large.
    Ok(((tflops / block_tflops - 1e-9).ceil() as u64).max(1))
}

fn check_tflops(value: f64) -> Result<f64, PoolError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(PoolError::InvalidTflops(value.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_tflops_are_typed_errors() {
        for text in ["0", "-1", "NaN", "nan", "inf", "-0.0", "four", "", "1e999"] {
            assert!(matches!(parse_tflops(text), Err(PoolError::InvalidTflops(_))), "{text:?}");
        }
        for value in [0.0, -3.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(blocks_for(value, 1.0), Err(PoolError::InvalidTflops(_))), "{value}");
        }
        assert!(parse_tflops("four").unwrap_err().to_string().contains("\"four\""));
    }

    #[test]
    fn tflops_round_up_to_blocks() {
        assert_eq!(parse_tflops(" 2.5 ").unwrap(), 2.5);
        assert_eq!(blocks_for(2.5, 1.0).unwrap(), 3);
        assert_eq!(blocks_for(4.0, 1.0).unwrap(), 4);
        assert_eq!(blocks_for(0.3, 0.1).unwrap(), 3);
        assert_eq!(blocks_for(0.01, 1.0).unwrap(), 1);
        assert_eq!(blocks_for(10.0, 2.5).unwrap(), 4);
        assert_eq!(blocks_for(1e300, 1.0).unwrap(), u64::MAX);
        assert!(blocks_for(1.0, 0.0).is_err());
    }
}
