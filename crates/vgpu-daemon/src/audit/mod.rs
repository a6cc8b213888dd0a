
pub mod compute;
pub mod memory;
pub mod offence;
pub mod terminate;
