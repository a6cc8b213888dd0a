//! Services (issue 15): a command kept running as MIN..MAX replicas, each an ordinary vgpu
//! workload (its own vGPU, cgroup, shim and record), scaled by the replicas' load.
//!
//! - [`def`]: the definition (`vgpu run`'s options + replicas, signals, window, cooldown),
//!   its TOML file and each replica's `vgpu run` arguments;
//! - [`store`]: where definitions and the runner's state live (`<lib>/services/`);
//! - [`scale`]: the pure scaling decision (HPA's rule, one step per decision);
//! - [`signals`]: each replica's load (CPU, host memory, GPU share), sampled every round;
//! - [`runner`]: the replicas kept running, restarted, scaled (`vgpu watch`, `vgpu service run`).

pub mod def;
pub mod runner;
pub mod scale;
pub mod signals;
pub mod store;

pub use def::{ServiceDef, Signal, Target};
pub use scale::{Decision, Load, Scaler, SignalValue};
pub use store::{ReplicaState, ServiceError, ServiceState, Services};
