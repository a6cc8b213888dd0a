//! The two-stage greedy planner of SPEC 1.3: GPU counts, then clocks, inside a carbon
//! budget. Pure: no I/O, no clock, no NVML.
//!
//! The budget is a rate (gCO2/h for all of the host's GPUs); the plan's predicted rate is
//! Σ P_gpu × intensity, where a GPU with no workload draws its idle power.
//!
//! A workload's *marginal benefit* of a step (one more GPU in stage 1, one clock step Δf in
//! stage 2) is the reduction of the average completion time over all workloads divided by
//! the emission rate the step adds. The intensity multiplies every step's emission alike, so
//! it is ranked per added watt; the intensity only decides, through the budget, how far the
//! greedy goes. Each stage keeps the candidates in a priority queue, serves the top one,
//! re-ranks, and stops at the first step that would exceed the budget: the plan for a budget
//! is a prefix of one fixed sequence of steps, which is why a higher intensity (a smaller
//! budget in watts) never raises a clock.
//!
//! * Before stage 1, running workloads keep their GPUs and each `--gpus MIN-MAX` workload
//!   gets its MIN (it cannot run with fewer), in order, while free GPUs last; all at their
//!   lowest clock. If that already exceeds the budget, nothing more is done: lowest clocks,
//!   and the plan says the budget cannot be met.
//! * Stage 1 hands the remaining GPUs, lowest index first, one at a time to the range
//!   workload with the highest benefit (at the lowest clock), until GPUs or wants run out or
//!   the budget would be exceeded. If the budget stopped it, the budget cannot even hold the
//!   wanted GPUs at their lowest clocks and stage 2 raises nothing.
//! * Stage 2 raises, one step of Δf at a time, the clock of the workload with the highest
//!   benefit, until every workload is at its maximum or the budget would be exceeded.
//!   A workload's GPUs run at the same clock, snapped down to each device's supported clocks.
//!   GPUs with no workload stay at their lowest clock.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use serde::Serialize;
use thiserror::Error;

use super::model::{clock_factor, g_per_hour, gpu_factor, GpuModel, Tunables};
use super::workload::{GpuDemand, PlannedWorkload};

/// Everything the planner looks at.
#[derive(Debug, Clone)]
pub struct PlanRequest<'a> {
    pub gpus: &'a [GpuModel],
    pub workloads: &'a [PlannedWorkload],
    /// gCO2/kWh.
    pub intensity: f64,
    /// gCO2/h for all GPUs; `None`: unlimited.
    pub budget_g_per_hour: Option<f64>,
    pub tunables: Tunables,
}

#[derive(Debug, Error, PartialEq)]
pub enum PlanError {
    #[error("workload {workload}: there is no GPU {index}")]
    UnknownGpu { workload: String, index: u32 },
    #[error("workload {workload}: GPU {index} is already held by workload {holder}")]
    GpuTaken { workload: String, index: u32, holder: String },
    #[error("workload {workload}: invalid GPU range {min}-{max} (needs 1 ≤ MIN ≤ MAX)")]
    BadRange { workload: String, min: usize, max: usize },
    #[error("workload {workload}: frequency sensitivity must be between 0 and 1, got {value}")]
    BadSensitivity { workload: String, value: f64 },
    #[error("workload {workload}: remaining work must be positive, got {value}")]
    BadWork { workload: String, value: f64 },
    #[error("intensity must be a non-negative number of gCO2/kWh, got {0}")]
    BadIntensity(f64),
    #[error("budget must be a non-negative number of gCO2/h, got {0}")]
    BadBudget(f64),
}

/// The outcome: a clock for every GPU, a GPU set for every workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClockPlan {
    /// gCO2/kWh the plan was made for.
    pub intensity: f64,
    pub budget_g_per_hour: Option<f64>,
    pub predicted_g_per_hour: f64,
    pub predicted_power_w: f64,
    /// False when even the lowest clocks exceed the budget.
    pub budget_met: bool,
    /// Why the plan stops short, in words.
    pub notes: Vec<String>,
    pub gpus: Vec<GpuPlan>,
    pub workloads: Vec<WorkloadPlan>,
    /// Every greedy step in order (for tests and `-vv` traces).
    #[serde(skip)]
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuPlan {
    pub index: u32,
    /// The workload on it; `None`: idle.
    pub workload: Option<String>,
    pub clock_mhz: u32,
    pub min_clock_mhz: u32,
    pub max_clock_mhz: u32,
    /// Predicted draw, watts, and its emission rate.
    pub power_w: f64,
    pub g_per_hour: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadPlan {
    pub id: String,
    /// NVML indexes; empty: not placed (its MIN did not fit in the free GPUs).
    pub gpus: Vec<u32>,
    /// The workload's clock; `None` when not placed.
    pub clock_mhz: Option<u32>,
    /// Modelled completion time (units of work / throughput); `None` when not placed.
    pub completion_time: Option<f64>,
}

/// One greedy step: who was served, with what benefit, and the best benefit left waiting.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub stage: u8,
    /// Position in the request's workloads.
    pub workload: usize,
    pub benefit: f64,
    pub runner_up: Option<f64>,
    /// Watts the step adds to the plan's predicted draw (the horizon planner's ladder).
    pub added_w: f64,
}

/// Added watts below this count as free (a degenerate power model with P_idle = P_max).
const MIN_WATTS: f64 = 1e-9;

struct Job {
    /// Positions in `gpus`.
    gpus: Vec<usize>,
    /// Ladder and maximum come from the first GPU.
    clock: u32,
    sensitivity: f64,
    work: f64,
    /// `Some((min, max))` for range workloads.
    range: Option<(usize, usize)>,
}

/// Priority-queue entry: higher benefit first, then the earlier workload.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    benefit: f64,
    job: usize,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Candidate {}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        self.benefit.total_cmp(&other.benefit).then_with(|| other.job.cmp(&self.job))
    }
}

struct Planner<'a> {
    req: &'a PlanRequest<'a>,
    jobs: Vec<Job>,
    /// Job position holding each GPU.
    holder: Vec<Option<usize>>,
    /// Budget in watts (∞ when unlimited or the intensity is zero).
    budget_w: f64,
    power_w: f64,
    steps: Vec<Step>,
    notes: Vec<String>,
}

/// Make the plan.
pub fn plan(req: &PlanRequest<'_>) -> Result<ClockPlan, PlanError> {
    let mut planner = Planner::new(req)?;
    let mandatory_fits = planner.place_mandatory();
    let mut budget_met = true;
    if !mandatory_fits {
        budget_met = false;
        planner.notes.push("the budget cannot be met: even the lowest clocks exceed it".into());
    } else if planner.stage1() {
        planner.stage2();
    } else {
        planner.notes.push(
            "the budget cannot hold every wanted GPU even at the lowest clock: some GPUs stay unassigned and no clock is raised"
                .into(),
        );
    }
    Ok(planner.finish(budget_met))
}

impl<'a> Planner<'a> {
    fn new(req: &'a PlanRequest<'a>) -> Result<Planner<'a>, PlanError> {
        if !(req.intensity.is_finite() && req.intensity >= 0.0) {
            return Err(PlanError::BadIntensity(req.intensity));
        }
        if let Some(b) = req.budget_g_per_hour {
            if !(b.is_finite() && b >= 0.0) {
                return Err(PlanError::BadBudget(b));
            }
        }
        let budget_w = match req.budget_g_per_hour {
            Some(b) if req.intensity > 0.0 => b * 1000.0 / req.intensity,
            _ => f64::INFINITY,
        };
        let mut holder: Vec<Option<usize>> = vec![None; req.gpus.len()];
        let mut jobs = Vec::with_capacity(req.workloads.len());
        for (j, w) in req.workloads.iter().enumerate() {
            let sensitivity = w.freq_sensitivity.unwrap_or(req.tunables.freq_sensitivity);
            if !(sensitivity.is_finite() && (0.0..=1.0).contains(&sensitivity)) {
                return Err(PlanError::BadSensitivity { workload: w.id.clone(), value: sensitivity });
            }
            if !(w.work.is_finite() && w.work > 0.0) {
                return Err(PlanError::BadWork { workload: w.id.clone(), value: w.work });
            }
            let mut job = Job { gpus: Vec::new(), clock: 0, sensitivity, work: w.work, range: None };
            match &w.gpus {
                GpuDemand::Fixed(indexes) => {
                    for &index in indexes {
                        let Some(g) = req.gpus.iter().position(|gpu| gpu.index == index) else {
                            return Err(PlanError::UnknownGpu { workload: w.id.clone(), index });
                        };
                        if let Some(other) = holder[g] {
                            let holder = req.workloads[other].id.clone();
                            return Err(PlanError::GpuTaken { workload: w.id.clone(), index, holder });
                        }
                        holder[g] = Some(j);
                        job.gpus.push(g);
                    }
                }
                &GpuDemand::Range { min, max } => {
                    if min == 0 || min > max {
                        return Err(PlanError::BadRange { workload: w.id.clone(), min, max });
                    }
                    job.range = Some((min, max));
                }
            }
            jobs.push(job);
        }
        let mut planner = Planner { req, jobs, holder, budget_w, power_w: 0.0, steps: Vec::new(), notes: Vec::new() };
        for j in 0..planner.jobs.len() {
            planner.reset_clock(j);
        }
        Ok(planner)
    }

    fn gpu(&self, g: usize) -> &GpuModel {
        &self.req.gpus[g]
    }

    /// The GPU whose clock ladder the job follows.
    fn ladder(&self, j: usize) -> Option<&GpuModel> {
        self.jobs[j].gpus.first().map(|&g| self.gpu(g))
    }

    fn reset_clock(&mut self, j: usize) {
        self.jobs[j].clock = self.ladder(j).map_or(0, GpuModel::min_clock);
    }

    fn free_gpus(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.req.gpus.len()).filter(|&g| self.holder[g].is_none())
    }

    fn give_gpu(&mut self, j: usize, g: usize) {
        self.holder[g] = Some(j);
        self.jobs[j].gpus.push(g);
        if self.jobs[j].gpus.len() == 1 {
            self.reset_clock(j);
        }
    }

    /// Clock GPU `g` runs at for a job at `clock` (ladder of the job's first GPU).
    fn gpu_clock(&self, g: usize, clock: u32) -> u32 {
        self.gpu(g).snap_down(clock)
    }

    fn total_power(&self) -> f64 {
        (0..self.req.gpus.len()).map(|g| self.gpu_power(g)).sum()
    }

    fn gpu_power(&self, g: usize) -> f64 {
        match self.holder[g] {
            Some(j) => self.gpu(g).power_w(self.gpu_clock(g, self.jobs[j].clock)),
            None => self.gpu(g).idle_w,
        }
    }

    fn placed_jobs(&self) -> usize {
        self.jobs.iter().filter(|job| !job.gpus.is_empty()).count().max(1)
    }

    /// Modelled completion time of job `j` on `n` GPUs at `clock`.
    fn completion(&self, j: usize, n: usize, clock: u32) -> f64 {
        let job = &self.jobs[j];
        let f_max = self.ladder(j).map_or(clock, GpuModel::max_clock);
        let throughput =
            gpu_factor(n, self.req.tunables.scaling_efficiency) * clock_factor(job.sensitivity, clock, f_max);
        if throughput > 0.0 {
            job.work / throughput
        } else {
            f64::INFINITY
        }
    }

    fn fits(&self, added_w: f64) -> bool {
        self.power_w + added_w <= self.budget_w
    }

    /// Running workloads keep their GPUs; range workloads get their MIN while GPUs last.
    /// False when that alone exceeds the budget.
    fn place_mandatory(&mut self) -> bool {
        for j in 0..self.jobs.len() {
            let Some((min, _)) = self.jobs[j].range else { continue };
            let free: Vec<usize> = self.free_gpus().take(min).collect();
            if free.len() < min {
                self.notes.push(format!(
                    "workload {} not placed: it needs at least {min} GPUs and {} are free",
                    self.req.workloads[j].id,
                    free.len()
                ));
                continue;
            }
            for g in free {
                self.give_gpu(j, g);
            }
        }
        self.power_w = self.total_power();
        self.power_w <= self.budget_w
    }

    /// Benefit of giving job `j` one more GPU `g`, at the job's current (lowest) clock.
    fn stage1_benefit(&self, j: usize, g: usize) -> (f64, f64) {
        let job = &self.jobs[j];
        let n = job.gpus.len();
        // A job placed by stage 1 alone would follow g's ladder.
        let clock = if n == 0 { self.gpu(g).min_clock() } else { job.clock };
        let gained = (self.completion(j, n, clock) - self.completion(j, n + 1, clock)) / self.placed_jobs() as f64;
        let added_w = self.gpu(g).power_w(self.gpu_clock(g, clock)) - self.gpu(g).idle_w;
        (gained / added_w.max(MIN_WATTS), added_w)
    }

    /// True when it ended because GPUs or wants ran out, false when the budget stopped it.
    fn stage1(&mut self) -> bool {
        loop {
            let Some(g) = self.free_gpus().next() else { return true };
            // Every job's benefit depends on the GPU on offer, so the queue is rebuilt each step.
            let mut queue: BinaryHeap<Candidate> = (0..self.jobs.len())
                .filter(|&j| matches!(self.jobs[j].range, Some((min, max)) if self.jobs[j].gpus.len() >= min && self.jobs[j].gpus.len() < max))
                .map(|j| Candidate { benefit: self.stage1_benefit(j, g).0, job: j })
                .collect();
            let Some(top) = queue.pop() else { return true };
            let (_, added_w) = self.stage1_benefit(top.job, g);
            if !self.fits(added_w) {
                return false;
            }
            self.steps.push(Step {
                stage: 1,
                workload: top.job,
                benefit: top.benefit,
                runner_up: queue.peek().map(|c| c.benefit),
                added_w,
            });
            self.give_gpu(top.job, g);
            self.power_w += added_w;
        }
    }

    /// Benefit of raising job `j` one step, the new clock and the added watts;
    /// `None` at the maximum.
    fn stage2_step(&self, j: usize) -> Option<(f64, u32, f64)> {
        let job = &self.jobs[j];
        let next = self.ladder(j)?.step_up(job.clock, self.req.tunables.delta_f_mhz)?;
        let n = job.gpus.len();
        let gained = (self.completion(j, n, job.clock) - self.completion(j, n, next)) / self.placed_jobs() as f64;
        let added_w: f64 = job
            .gpus
            .iter()
            .map(|&g| self.gpu(g).power_w(self.gpu_clock(g, next)) - self.gpu(g).power_w(self.gpu_clock(g, job.clock)))
            .sum();
        Some((gained / added_w.max(MIN_WATTS), next, added_w))
    }

    fn stage2(&mut self) {
        // Only the served job's benefit changes with a step, so one queue serves throughout.
        let mut queue: BinaryHeap<Candidate> = (0..self.jobs.len())
            .filter_map(|j| self.stage2_step(j).map(|(benefit, ..)| Candidate { benefit, job: j }))
            .collect();
        while let Some(top) = queue.pop() {
            let Some((benefit, next, added_w)) = self.stage2_step(top.job) else { continue };
            if !self.fits(added_w) {
                return;
            }
            self.steps.push(Step {
                stage: 2,
                workload: top.job,
                benefit,
                runner_up: queue.peek().map(|c| c.benefit),
                added_w,
            });
            self.jobs[top.job].clock = next;
            self.power_w += added_w;
            if let Some((benefit, ..)) = self.stage2_step(top.job) {
                queue.push(Candidate { benefit, job: top.job });
            }
        }
    }

    fn finish(self, budget_met: bool) -> ClockPlan {
        let intensity = self.req.intensity;
        let gpus: Vec<GpuPlan> = (0..self.req.gpus.len())
            .map(|g| {
                let model = self.gpu(g);
                let power_w = self.gpu_power(g);
                let (workload, clock_mhz) = match self.holder[g] {
                    Some(j) => (Some(self.req.workloads[j].id.clone()), self.gpu_clock(g, self.jobs[j].clock)),
                    None => (None, model.min_clock()),
                };
                GpuPlan {
                    index: model.index,
                    workload,
                    clock_mhz,
                    min_clock_mhz: model.min_clock(),
                    max_clock_mhz: model.max_clock(),
                    power_w,
                    g_per_hour: g_per_hour(power_w, intensity),
                }
            })
            .collect();
        let workloads = (0..self.jobs.len())
            .map(|j| {
                let job = &self.jobs[j];
                let placed = !job.gpus.is_empty();
                WorkloadPlan {
                    id: self.req.workloads[j].id.clone(),
                    gpus: job.gpus.iter().map(|&g| self.gpu(g).index).collect(),
                    clock_mhz: placed.then_some(job.clock),
                    completion_time: placed.then(|| self.completion(j, job.gpus.len(), job.clock)),
                }
            })
            .collect();
        let predicted_power_w: f64 = gpus.iter().map(|g| g.power_w).sum();
        ClockPlan {
            intensity,
            budget_g_per_hour: self.req.budget_g_per_hour,
            predicted_g_per_hour: g_per_hour(predicted_power_w, intensity),
            predicted_power_w,
            budget_met,
            notes: self.notes,
            gpus,
            workloads,
            steps: self.steps,
        }
    }
}

#[cfg(test)]
mod tests;
