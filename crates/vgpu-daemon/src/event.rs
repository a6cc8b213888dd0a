//! What the daemon's parts (the watch, its audits, the service runner) did or found, one
//! line each; the command prints them at their level.

/// How important an [`Event`] is (the command maps it to its log level).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug,
    Info,
    Warn,
}

/// Something the watch did or found, one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub level: Level,
    pub message: String,
}

impl Event {
    pub fn info(message: impl Into<String>) -> Event {
        Event { level: Level::Info, message: message.into() }
    }
    pub fn warn(message: impl Into<String>) -> Event {
        Event { level: Level::Warn, message: message.into() }
    }
    pub fn debug(message: impl Into<String>) -> Event {
        Event { level: Level::Debug, message: message.into() }
    }
}
