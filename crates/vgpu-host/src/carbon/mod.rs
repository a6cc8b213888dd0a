
pub mod follow;
pub mod host;
pub mod profile;
pub mod range;
pub mod report;
pub mod sensitivity;
