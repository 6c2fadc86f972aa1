//! GPU timestamp profiling: how long every dispatch of a run takes on the device.
//!
//! A session loaded with [`AdapterChoice::profiling`](crate::AdapterChoice::profiling) asks its
//! device for `TIMESTAMP_QUERY` (and `TIMESTAMP_QUERY_INSIDE_PASSES` where the adapter has it).
//! [`Session::profile`] then runs the artifact once to warm up and `repeats` times more, exactly
//! as [`Session::run`] does (inputs written, one submission, outputs read back), with a timestamp
//! before and after every dispatch. Timestamps are resolved into a buffer at the end of each run,
//! read back and converted to nanoseconds with `Queue::get_timestamp_period`; [`Profile`] keeps
//! the median over the repeats of every dispatch, of every kernel's total, of the whole run on
//! the GPU, and of the wall-clock time of a run.
//!
//! Two ways to place the timestamps ([`TimestampMode`]):
//! - inside one compute pass, `write_timestamp` before and after each dispatch (the run is
//!   recorded exactly as an unprofiled one);
//! - where the adapter cannot write timestamps inside passes, one compute pass per dispatch with
//!   timestamps at the pass boundaries (`ComputePassDescriptor::timestamp_writes`), which adds
//!   the cost of a pass per dispatch to the run.
//!
//! Params and states carry over from run to run, as with [`Session::run_steps`]: profiling a
//! training step trains.

use std::fmt;

use crate::error::RuntimeError;
use crate::io::HostTensor;
use crate::readback::read_buffer;
use crate::session::{Outputs, Session};

/// Where the timestamps around each dispatch are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimestampMode {
    /// `write_timestamp` inside one compute pass (needs `TIMESTAMP_QUERY_INSIDE_PASSES`).
    InsidePasses,
    /// One compute pass per dispatch, timestamps at its boundaries (needs `TIMESTAMP_QUERY`).
    PassBoundaries,
}

impl fmt::Display for TimestampMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TimestampMode::InsidePasses => "timestamps inside one pass",
            TimestampMode::PassBoundaries => "one pass per dispatch, timestamps at pass boundaries",
        })
    }
}

/// What the device was created with, as far as timestamps go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timestamps {
    /// Profiling was not asked for at load.
    NotRequested,
    /// Asked for, but the adapter has no `TIMESTAMP_QUERY`.
    Unsupported,
    /// The best mode the device supports.
    Supported(TimestampMode),
}

impl Timestamps {
    /// The device features to request.
    pub(crate) fn features(self) -> wgpu::Features {
        match self {
            Timestamps::NotRequested | Timestamps::Unsupported => wgpu::Features::empty(),
            Timestamps::Supported(TimestampMode::PassBoundaries) => wgpu::Features::TIMESTAMP_QUERY,
            Timestamps::Supported(TimestampMode::InsidePasses) => {
                wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
            }
        }
    }
}

/// What to request, given whether profiling was asked for and what the adapter offers.
pub(crate) fn timestamp_support(requested: bool, adapter: wgpu::Features) -> Timestamps {
    if !requested {
        Timestamps::NotRequested
    } else if !adapter.contains(wgpu::Features::TIMESTAMP_QUERY) {
        Timestamps::Unsupported
    } else if adapter.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES) {
        Timestamps::Supported(TimestampMode::InsidePasses)
    } else {
        Timestamps::Supported(TimestampMode::PassBoundaries)
    }
}

/// How to profile.
#[derive(Clone, Debug)]
pub struct ProfileOptions {
    /// Measured runs (at least one).
    pub repeats: u32,
    /// Runs before the measured ones (pipelines, caches and clocks warm up).
    pub warmup: u32,
    /// `None`: the best mode the device supports.
    pub mode: Option<TimestampMode>,
}

impl ProfileOptions {
    /// `repeats` measured runs after one warm-up run, in the best mode the device supports.
    pub fn new(repeats: u32) -> ProfileOptions {
        ProfileOptions {
            repeats,
            warmup: 1,
            mode: None,
        }
    }
}

/// The median time of one dispatch.
#[derive(Clone, Debug, PartialEq)]
pub struct DispatchTime {
    /// Index into [`Artifact::dispatches`](sinter_artifact::artifact::Artifact::dispatches).
    pub dispatch: usize,
    /// Index into [`Artifact::kernels`](sinter_artifact::artifact::Artifact::kernels).
    pub kernel: usize,
    pub median_ns: f64,
}

/// One kernel's share of a run: the median over the repeats of the summed time of its dispatches.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// Index into [`Artifact::kernels`](sinter_artifact::artifact::Artifact::kernels).
    pub kernel: usize,
    pub name: String,
    /// The fusion pattern the compiler gave the kernel (`matmul`, `elementwise`, ...).
    pub pattern: String,
    /// Dispatches of this kernel per run.
    pub dispatches: usize,
    pub median_ns: f64,
}

/// What [`Session::profile`] measured. Every time is a median over the measured runs, in ns.
#[derive(Clone, Debug)]
pub struct Profile {
    /// The adapter, as [`crate::describe_adapter`] writes it.
    pub adapter: String,
    pub mode: TimestampMode,
    pub repeats: u32,
    /// Every dispatch, in the order a run records them.
    pub dispatches: Vec<DispatchTime>,
    /// Every dispatched kernel, the most expensive first.
    pub kernels: Vec<KernelTime>,
    /// From the first dispatch's start to the last one's end.
    pub gpu_ns: f64,
    /// The dispatches' summed times (`gpu_ns` less the gaps between dispatches).
    pub busy_ns: f64,
    /// Wall-clock time of one run, as [`Session::run`] does it: inputs written, one submission,
    /// outputs read back. `None` where there is no clock (in a browser).
    pub wall_ns: Option<f64>,
    /// The outputs of the last run.
    pub outputs: Outputs,
}

impl fmt::Display for Profile {
    /// The per-kernel table: kernel, pattern, dispatches, median ms, % of the GPU time of a run.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |ns: f64| ns / 1e6;
        writeln!(
            f,
            "{} repeats on {} ({})",
            self.repeats, self.adapter, self.mode
        )?;
        let name_width = self
            .kernels
            .iter()
            .map(|k| k.name.len())
            .chain([6])
            .max()
            .unwrap_or(6);
        let pattern_width = self
            .kernels
            .iter()
            .map(|k| k.pattern.len())
            .chain([7])
            .max()
            .unwrap_or(7);
        writeln!(
            f,
            "{:<name_width$}  {:<pattern_width$}  {:>10}  {:>10}  {:>6}",
            "kernel", "pattern", "dispatches", "median ms", "% run"
        )?;
        for k in &self.kernels {
            let share = if self.gpu_ns > 0.0 {
                100.0 * k.median_ns / self.gpu_ns
            } else {
                0.0
            };
            writeln!(
                f,
                "{:<name_width$}  {:<pattern_width$}  {:>10}  {:>10.4}  {:>6.1}",
                k.name,
                k.pattern,
                k.dispatches,
                ms(k.median_ns),
                share
            )?;
        }
        write!(
            f,
            "GPU time per run {:.4} ms (dispatches busy {:.4} ms)",
            ms(self.gpu_ns),
            ms(self.busy_ns)
        )?;
        if let Some(wall) = self.wall_ns {
            write!(f, "; wall time per run {:.4} ms", ms(wall))?;
        }
        Ok(())
    }
}

/// Timestamp queries of one profiled run: query `2i` before dispatch `i`, `2i + 1` after it.
pub(crate) struct Timer {
    mode: TimestampMode,
    /// Query sets of [`wgpu::QUERY_SET_MAX_QUERIES`] queries each (the last may hold fewer).
    sets: Vec<wgpu::QuerySet>,
    queries: u32,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
}

/// Queries per set; even, so a dispatch's two queries share a set.
const PER_SET: u32 = wgpu::QUERY_SET_MAX_QUERIES;

impl Timer {
    fn new(device: &wgpu::Device, mode: TimestampMode, dispatches: usize) -> Timer {
        let queries = u32::try_from(2 * dispatches).expect("fewer than 2^31 dispatches");
        let sets = (0..queries.div_ceil(PER_SET))
            .map(|j| {
                device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("sinter profile timestamps"),
                    ty: wgpu::QueryType::Timestamp,
                    count: (queries - j * PER_SET).min(PER_SET),
                })
            })
            .collect();
        let bytes = u64::from(queries) * u64::from(wgpu::QUERY_SIZE);
        let buffer = |label, usage| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        Timer {
            mode,
            sets,
            queries,
            resolve: buffer(
                "sinter profile resolve",
                wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            ),
            readback: buffer(
                "sinter profile readback",
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            ),
        }
    }

    pub(crate) fn mode(&self) -> TimestampMode {
        self.mode
    }

    fn query(&self, q: u32) -> (&wgpu::QuerySet, u32) {
        (&self.sets[(q / PER_SET) as usize], q % PER_SET)
    }

    /// Before dispatch `i`, inside the pass.
    pub(crate) fn write_start(&self, pass: &mut wgpu::ComputePass<'_>, i: usize) {
        let (set, q) = self.query(2 * i as u32);
        pass.write_timestamp(set, q);
    }

    /// After dispatch `i`, inside the pass.
    pub(crate) fn write_end(&self, pass: &mut wgpu::ComputePass<'_>, i: usize) {
        let (set, q) = self.query(2 * i as u32 + 1);
        pass.write_timestamp(set, q);
    }

    /// The boundaries of the pass that holds dispatch `i` alone.
    pub(crate) fn pass_writes(&self, i: usize) -> wgpu::ComputePassTimestampWrites<'_> {
        let (query_set, q) = self.query(2 * i as u32);
        wgpu::ComputePassTimestampWrites {
            query_set,
            beginning_of_pass_write_index: Some(q),
            end_of_pass_write_index: Some(q + 1),
        }
    }

    /// Resolves every query and copies the results where they can be mapped.
    pub(crate) fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        let size = u64::from(wgpu::QUERY_SIZE);
        for (j, set) in self.sets.iter().enumerate() {
            let first = j as u32 * PER_SET;
            let count = (self.queries - first).min(PER_SET);
            // A multiple of QUERY_RESOLVE_BUFFER_ALIGNMENT, since PER_SET * 8 is.
            let offset = u64::from(first) * size;
            encoder.resolve_query_set(set, 0..count, &self.resolve, offset);
        }
        encoder.copy_buffer_to_buffer(
            &self.resolve,
            0,
            &self.readback,
            0,
            u64::from(self.queries) * size,
        );
    }

    /// The raw ticks of the last run.
    async fn read(&self, gpu: &crate::Gpu) -> Result<Vec<u64>, RuntimeError> {
        let bytes = u64::from(self.queries) * u64::from(wgpu::QUERY_SIZE);
        let raw = read_buffer(gpu, &self.readback, bytes).await?;
        Ok(raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect())
    }
}

/// A wall clock where there is one.
#[cfg(not(target_arch = "wasm32"))]
type Clock = std::time::Instant;

#[cfg(not(target_arch = "wasm32"))]
fn now() -> Option<Clock> {
    Some(std::time::Instant::now())
}

#[cfg(target_arch = "wasm32")]
type Clock = ();

#[cfg(target_arch = "wasm32")]
fn now() -> Option<Clock> {
    None
}

#[cfg(not(target_arch = "wasm32"))]
fn elapsed_ns(start: Option<Clock>) -> Option<f64> {
    start.map(|s| s.elapsed().as_secs_f64() * 1e9)
}

#[cfg(target_arch = "wasm32")]
fn elapsed_ns(_start: Option<Clock>) -> Option<f64> {
    None
}

/// The median; the mean of the middle two for an even count; 0 for none.
pub(crate) fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// Per-run dispatch durations (ns), and each run's span from first start to last end (ns).
fn durations(ticks: &[u64], period: f64) -> (Vec<f64>, f64) {
    let ns = |from: u64, to: u64| to.saturating_sub(from) as f64 * period;
    let each = ticks.chunks_exact(2).map(|p| ns(p[0], p[1])).collect();
    let span = match (ticks.first(), ticks.last()) {
        (Some(&first), Some(&last)) => ns(first, last),
        _ => 0.0,
    };
    (each, span)
}

/// Medians over runs; `runs[r][i]`: dispatch `i`'s time in run `r`; `kernel_of[i]`: its kernel.
fn summarize(
    runs: &[Vec<f64>],
    dispatch_of: &[usize],
    kernel_of: &[usize],
    kernels: &[(String, String)],
) -> (Vec<DispatchTime>, Vec<KernelTime>, f64) {
    let column = |i: usize| runs.iter().map(|r| r[i]).collect::<Vec<_>>();
    let dispatches = (0..kernel_of.len())
        .map(|i| DispatchTime {
            dispatch: dispatch_of[i],
            kernel: kernel_of[i],
            median_ns: median(&mut column(i)),
        })
        .collect();
    let mut totals: Vec<KernelTime> = Vec::new();
    let mut order: Vec<usize> = Vec::new();
    for &k in kernel_of {
        if !order.contains(&k) {
            order.push(k);
        }
    }
    for k in order {
        let mine: Vec<usize> = (0..kernel_of.len())
            .filter(|&i| kernel_of[i] == k)
            .collect();
        let mut per_run: Vec<f64> = runs
            .iter()
            .map(|r| mine.iter().map(|&i| r[i]).sum())
            .collect();
        totals.push(KernelTime {
            kernel: k,
            name: kernels[k].0.clone(),
            pattern: kernels[k].1.clone(),
            dispatches: mine.len(),
            median_ns: median(&mut per_run),
        });
    }
    totals.sort_by(|a, b| b.median_ns.total_cmp(&a.median_ns));
    let mut busy: Vec<f64> = runs.iter().map(|r| r.iter().sum()).collect();
    (dispatches, totals, median(&mut busy))
}

impl Session {
    /// Runs the graph once to warm up and `repeats` times measured, timing every dispatch on the
    /// GPU (see the [module docs](crate::profile)). Needs a session loaded with
    /// [`AdapterChoice::profiling`](crate::AdapterChoice::profiling) on an adapter with
    /// timestamp queries.
    pub async fn profile_async(
        &mut self,
        inputs: &[(&str, &HostTensor)],
        options: &ProfileOptions,
        mut each_run: impl FnMut(u32, &Outputs),
    ) -> Result<Profile, RuntimeError> {
        let mode = self.profiling_mode(options)?;
        let packed = self.pack_inputs(inputs)?;
        let timer = if self.steps.is_empty() {
            None
        } else {
            let (timer, err) = self
                .gpu
                .capture(|| Timer::new(&self.gpu.device, mode, self.steps.len()))
                .await;
            if let Some(message) = err {
                return Err(RuntimeError::Gpu {
                    during: "creating timestamp queries",
                    message,
                });
            }
            Some(timer)
        };
        let period = f64::from(self.gpu.queue.get_timestamp_period());
        let mut runs = Vec::with_capacity(options.repeats as usize);
        let mut spans = Vec::with_capacity(options.repeats as usize);
        let mut walls = Vec::with_capacity(options.repeats as usize);
        let mut outputs = Outputs::default();
        for run in 0..options.warmup + options.repeats {
            let start = now();
            let ((), err) =
                self.gpu
                    .capture(|| {
                        if let Some(upload) = &self.upload {
                            self.gpu.queue.write_buffer(upload, 0, &packed);
                        }
                        let mut encoder = self.gpu.device.create_command_encoder(
                            &wgpu::CommandEncoderDescriptor {
                                label: Some("sinter profiled run"),
                            },
                        );
                        self.record(&mut encoder, true, timer.as_ref());
                        self.gpu.queue.submit([encoder.finish()]);
                    })
                    .await;
            if let Some(message) = err {
                return Err(RuntimeError::Gpu {
                    during: "running the graph with timestamps",
                    message,
                });
            }
            let bytes = self.read_outputs().await?;
            let wall = elapsed_ns(start);
            outputs = Outputs {
                tensors: self.unpack(&self.plan.outputs, &bytes)?,
            };
            let ticks = match &timer {
                Some(t) => t.read(&self.gpu).await?,
                None => Vec::new(),
            };
            if run < options.warmup {
                continue;
            }
            each_run(run - options.warmup, &outputs);
            let (each, span) = durations(&ticks, period);
            runs.push(each);
            spans.push(span);
            walls.extend(wall);
        }
        let kernels: Vec<(String, String)> = self
            .artifact
            .kernels
            .iter()
            .map(|k| (k.name.clone(), k.pattern.clone()))
            .collect();
        let dispatch_of: Vec<usize> = self.steps.iter().map(|s| s.dispatch).collect();
        let kernel_of: Vec<usize> = self.steps.iter().map(|s| s.kernel).collect();
        let (dispatches, kernels, busy_ns) = summarize(&runs, &dispatch_of, &kernel_of, &kernels);
        Ok(Profile {
            adapter: self.gpu.describe(),
            mode,
            repeats: options.repeats,
            dispatches,
            kernels,
            gpu_ns: median(&mut spans),
            busy_ns,
            wall_ns: (!walls.is_empty()).then(|| median(&mut walls)),
            outputs,
        })
    }

    /// The mode to profile in, or why this session cannot profile.
    fn profiling_mode(&self, options: &ProfileOptions) -> Result<TimestampMode, RuntimeError> {
        let refuse = |reason: &str| {
            Err(RuntimeError::Profiling {
                adapter: self.gpu.describe(),
                reason: reason.to_string(),
            })
        };
        if options.repeats == 0 {
            return refuse("profiling needs at least one repeat");
        }
        let best = match self.gpu.timestamps {
            Timestamps::NotRequested => {
                return refuse(
                    "the session was loaded without timestamp queries; load it with \
                     `AdapterChoice { profiling: true, .. }`",
                );
            }
            Timestamps::Unsupported => {
                return refuse("the adapter lacks the TIMESTAMP_QUERY feature");
            }
            Timestamps::Supported(mode) => mode,
        };
        match (options.mode, best) {
            (None, mode) => Ok(mode),
            (Some(TimestampMode::InsidePasses), TimestampMode::PassBoundaries) => refuse(
                "the adapter lacks TIMESTAMP_QUERY_INSIDE_PASSES; profile with \
                 TimestampMode::PassBoundaries (one pass per dispatch) instead",
            ),
            (Some(mode), _) => Ok(mode),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&mut []), 0.0);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn picks_the_best_timestamp_mode() {
        use wgpu::Features as F;
        let both = F::TIMESTAMP_QUERY | F::TIMESTAMP_QUERY_INSIDE_PASSES;
        assert_eq!(timestamp_support(false, both), Timestamps::NotRequested);
        assert_eq!(timestamp_support(false, both).features(), F::empty());
        assert_eq!(timestamp_support(true, F::empty()), Timestamps::Unsupported);
        assert_eq!(
            timestamp_support(true, F::TIMESTAMP_QUERY),
            Timestamps::Supported(TimestampMode::PassBoundaries)
        );
        assert_eq!(
            timestamp_support(true, F::TIMESTAMP_QUERY).features(),
            F::TIMESTAMP_QUERY
        );
        assert_eq!(timestamp_support(true, both).features(), both);
    }

    #[test]
    fn converts_ticks_with_the_period() {
        let (each, span) = durations(&[100, 150, 160, 260], 2.0);
        assert_eq!(each, vec![100.0, 200.0]);
        assert_eq!(span, 320.0);
        // A counter that went backwards (it should not) counts as zero, not as a huge value.
        assert_eq!(durations(&[10, 5], 1.0).0, vec![0.0]);
    }

    #[test]
    fn sums_kernels_per_run_before_taking_medians() {
        // Dispatches: kernel 0, kernel 1, kernel 0; three runs.
        let runs = vec![
            vec![1.0, 10.0, 2.0],
            vec![5.0, 20.0, 6.0],
            vec![3.0, 30.0, 1.0],
        ];
        let kernels = vec![("a".to_string(), "elementwise".to_string()); 2];
        let (d, k, busy) = summarize(&runs, &[0, 2, 3], &[0, 1, 0], &kernels);
        assert_eq!(
            d.iter()
                .map(|d| (d.dispatch, d.median_ns))
                .collect::<Vec<_>>(),
            vec![(0, 3.0), (2, 20.0), (3, 2.0)]
        );
        // Kernel 1 first (median 20); kernel 0's per-run totals are 3, 11, 4: median 4.
        assert_eq!(
            k.iter()
                .map(|k| (k.kernel, k.dispatches, k.median_ns))
                .collect::<Vec<_>>(),
            vec![(1, 1, 20.0), (0, 2, 4.0)]
        );
        assert_eq!(busy, 31.0); // run totals 13, 31, 34
    }
}
