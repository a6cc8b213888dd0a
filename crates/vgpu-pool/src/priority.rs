//! Workload priorities.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::error::PoolError;

/// A workload's priority: an integer from [`Priority::MIN`] (0) to [`Priority::MAX`] (100);
/// higher is more important. [`Priority::DEFAULT`] is 50, so work can be marked both as
/// "yield to normal work" (below 50) and "may preempt normal work" (above 50). Only a
/// strictly higher priority may preempt: two workloads of equal priority never preempt each
/// other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i32")]
pub struct Priority(i32);

impl Priority {
    pub const MIN: i32 = 0;
    pub const MAX: i32 = 100;
    pub const DEFAULT: Priority = Priority(50);

    pub fn new(value: i64) -> Result<Priority, PoolError> {
        if (i64::from(Self::MIN)..=i64::from(Self::MAX)).contains(&value) {
            // In range, so it fits an i32.
            Ok(Priority(value as i32))
        } else {
            Err(PoolError::PriorityOutOfRange(value.to_string()))
        }
    }

    pub fn get(self) -> i32 {
        self.0
    }
}

impl Default for Priority {
    fn default() -> Self {
        Priority::DEFAULT
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl TryFrom<i64> for Priority {
    type Error = PoolError;

    fn try_from(value: i64) -> Result<Self, PoolError> {
        Priority::new(value)
    }
}

impl TryFrom<i32> for Priority {
    type Error = PoolError;

    fn try_from(value: i32) -> Result<Self, PoolError> {
        Priority::new(i64::from(value))
    }
}

impl From<Priority> for i32 {
    fn from(p: Priority) -> i32 {
        p.0
    }
}

/// `--priority P` (for clap's `value_parser`).
impl FromStr for Priority {
    type Err = PoolError;

    fn from_str(s: &str) -> Result<Self, PoolError> {
        let value: i64 = s.trim().parse().map_err(|_| PoolError::PriorityOutOfRange(s.to_string()))?;
        Priority::new(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_is_enforced() {
        assert_eq!(Priority::new(0).unwrap().get(), 0);
        assert_eq!(Priority::new(100).unwrap().get(), 100);
        assert!(matches!(Priority::new(-1), Err(PoolError::PriorityOutOfRange(_))));
        assert!(matches!(Priority::new(101), Err(PoolError::PriorityOutOfRange(_))));
        assert!(matches!("high".parse::<Priority>(), Err(PoolError::PriorityOutOfRange(_))));
        assert_eq!(" 70 ".parse::<Priority>().unwrap().get(), 70);
        let err = Priority::new(i64::MAX).unwrap_err().to_string();
        assert!(err.contains("0 to 100"), "{err}");
    }

    #[test]
    fn serde_checks_the_range() {
        assert!(serde_json::from_str::<Priority>("101").is_err());
        assert_eq!(serde_json::from_str::<Priority>("7").unwrap().get(), 7);
        assert_eq!(serde_json::to_string(&Priority::DEFAULT).unwrap(), "50");
    }
}
