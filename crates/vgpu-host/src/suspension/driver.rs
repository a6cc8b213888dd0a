//! The checkpoint API as suspension uses it: the settings of the command that runs
//! (`configure`, once per command and on `vgpu watch`'s SIGHUP) and the driver, opened on
//! first need and kept for the life of the process (a process loads one driver).

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::context::Context;
use vgpu_gpu::checkpoint::Checkpointer;

static SETTINGS: Mutex<Option<Context>> = Mutex::new(None);
static OPENED: OnceLock<Result<Checkpointer, String>> = OnceLock::new();

/// Use `ctx`'s config (`[suspend]`) and driver (NVIDIA's, or the simulated one) for every
/// suspension this process makes. Does no I/O: the driver is opened when first needed.
pub fn configure(ctx: &Context) {
    *SETTINGS.lock().unwrap_or_else(|e| e.into_inner()) = Some(ctx.clone());
}

/// The driver's checkpoint API and the lock timeout, or why suspension cannot release
/// memory (one line, for the record and `vgpu ps`).
pub(super) fn checkpointer() -> Result<(&'static Checkpointer, Duration), String> {
    let ctx = SETTINGS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .ok_or_else(|| "this process has no driver configured".to_string())?;
    let settings = &ctx.config.suspend;
    if !settings.checkpoint {
        return Err("the config sets [suspend] checkpoint = false".into());
    }
    let opened = OPENED.get_or_init(|| {
        let library = ctx
            .driver_library_dir()
            .map_err(|e| format!("the simulated driver: {e:#}"))?
            .map(|dir| dir.join(crate::paths::CUDA_SONAME));
        match Checkpointer::open(library.as_deref()) {
            Ok(Some(c)) => Ok(c),
            Ok(None) => Err("the driver has no checkpoint API (NVIDIA driver 570 or later has it)".into()),
            Err(e) => Err(e.to_string()),
        }
    });
    match opened {
        Ok(c) => Ok((c, settings.lock_timeout)),
        Err(why) => Err(why.clone()),
    }
}
