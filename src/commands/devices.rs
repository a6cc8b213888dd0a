//! `vgpu devices`: the GPUs NVML sees.

use anyhow::Result;
use vgpu_abi::size::format_size;

use crate::cli::JsonArgs;
use crate::context::Context;
use crate::gpu::GpuInfo;
use crate::output::{or_dash, print_json, table};

pub fn run(ctx: &Context, args: &JsonArgs) -> Result<()> {
    let Some(nvml) = ctx.nvml()? else {
        if args.json {
            println!("[]");
        } else {
            println!("No NVIDIA driver found (libnvidia-ml.so.1 not loadable); try --simulate to use the simulated driver.");
        }
        return Ok(());
    };
    let gpus = nvml.inventory()?;
    if args.json {
        return print_json(&gpus);
    }
    if gpus.is_empty() {
        println!("The NVIDIA driver reports no GPUs.");
        return Ok(());
    }
    println!("{}", render(&gpus));
    Ok(())
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
