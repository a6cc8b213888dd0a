//! `source = "static"`: the configured `value`.

use chrono::{DateTime, Utc};

use super::{Reading, Source, SourceError};

pub struct Static {
    pub g_per_kwh: f64,
}

impl Source for Static {
    fn describe(&self) -> String {
        "static".into()
    }

    fn read(&self, now: DateTime<Utc>) -> Result<Reading, SourceError> {
        Ok(Reading { g_per_kwh: self.g_per_kwh, timestamp: now })
    }
}
