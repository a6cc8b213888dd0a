//! `vgpu devices`: the GPUs NVML sees.

use std::time::Duration;

use anyhow::Result;
use clap::Args;
use vgpu_abi::size::format_size;

use vgpu_host::context::Context;
use vgpu_gpu::GpuInfo;
use crate::output::refresh;
use crate::output::or_dash;
use crate::output::table;

#[derive(Debug, Args)]
pub struct DevicesArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
    /// Refresh every SECONDS [default: 2, at least 0.1] until interrupted: in place on a terminal, else one table (with --json one JSON line) per refresh
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = refresh::DEFAULT_SECONDS, value_parser = refresh::parse_interval)]
    pub watch: Option<Duration>,
}

/// `devices --json`: `{"schema": N, "gpus": [...]}`.
#[derive(serde::Serialize)]
struct Gpus<'a> {
    gpus: &'a [GpuInfo],
}

pub fn run(ctx: &Context, args: &DevicesArgs) -> Result<()> {
    // Root as every command (the simulated driver's link directory is made); anyone else
    // makes nothing.
    let nvml = if vgpu_store::read_only::is_root() { ctx.nvml()? } else { ctx.nvml_read_only()? };
    let Some(nvml) = nvml else {
        if args.json {
            crate::output::print_json(&Gpus { gpus: &[] })?;
        } else {
            println!("No NVIDIA driver found (libnvidia-ml.so.1 not loadable); try --simulate to use the simulated driver.");
        }
        return Ok(());
    };
    let frame = |pretty: bool| -> Result<String> {
        let gpus = nvml.inventory()?;
        if args.json {
            return Ok(vgpu_json::to_text(&Gpus { gpus: &gpus }, pretty)?);
        }
        if gpus.is_empty() {
            return Ok("The NVIDIA driver reports no GPUs.".into());
        }
        Ok(render(&gpus).to_string())
    };
    refresh::once_or_every(args.watch, args.json, "vgpu devices", frame)
}

fn render(gpus: &[GpuInfo]) -> comfy_table::Table {
    let mut t = table(["GPU", "NAME", "UUID", "MEMORY used/total", "SM CLOCK", "POWER", "UTIL", "PROCESSES"]);
    for gpu in gpus {
        let clock = match (gpu.sm_clock_mhz, gpu.sm_clock_max_mhz) {
            (Some(cur), Some(max)) => format!("{cur}/{max} MHz"),
            (cur, _) => format!("{} MHz", or_dash(cur)),
        };
        let power = match (gpu.power_draw_w, gpu.power_limit_w) {
            (Some(draw), Some(limit)) => format!("{draw:.0}/{limit:.0} W"),
            (draw, _) => format!("{} W", or_dash(draw.map(|w| format!("{w:.0}")))),
        };
        let processes = gpu
            .processes
            .iter()
            .map(|p| match p.memory_used {
                Some(bytes) => format!("{} ({})", p.pid, format_size(bytes)),
                None => p.pid.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        t.add_row([
            gpu.index.to_string(),
            gpu.name.clone(),
            gpu.uuid.clone(),
            format!("{} / {}", format_size(gpu.memory_used), format_size(gpu.memory_total)),
            clock,
            power,
            format!("{}%", or_dash(gpu.utilization_pct)),
            if processes.is_empty() { "—".into() } else { processes },
        ]);
    }
    t
}
