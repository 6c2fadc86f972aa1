//! # sinter-compiler
//!
//! Turns a verified [`Graph`] into an [`Artifact`]: expand composites, lower to a schedule of
//! kernels over strided views, plan arena memory, generate WGSL (validated by naga), pack.
//! [`compile`] orders the passes; each pass lives in its own module.
//!
//! **Architecture Invariant:** only naga-validated WGSL leaves codegen: an invalid module is a
//! compiler bug and fails compilation with naga's diagnostic.

pub mod autodiff;
pub mod codegen;
pub mod contracts;
pub mod cost;
pub mod error;
pub mod flash;
pub mod fused;
pub mod generation;
pub mod in_place;
pub mod kernel;
pub mod kgraph;
pub mod layout;
pub mod loss_scale;
pub mod matmul;
pub mod memory;
pub mod optimize;
mod pack;
pub mod pipeline;
pub mod precision;
pub mod schedule;
pub mod target;
#[cfg(test)]
mod test_rng;

use sinter_ir::Graph;
use sinter_ir::artifact::Artifact;

pub use error::CompileError;
pub use pipeline::{Pass, PassLog, PassRecord};
pub use target::Target;

/// What a compile targets and what it may choose. Environment variables that change a compile
/// (`SINTER_FLASH_TILE`, `SINTER_OPTIMIZE_TRACE`) are read once, by [`compile`], into these
/// fields ([`Options::with_environment`]); no pass reads the environment.
#[derive(Clone, Debug)]
pub struct Options {
    /// The device the artifact is for ([`Target`]): its limits (a plan larger than one binding
    /// is split over several arenas), the features kernels may use, the cost model's rates.
    pub target: Target,
    /// Passes to dump (see [`Compiled::dumps`]).
    pub dump_after: Vec<Pass>,
    /// Block shapes and K splits forced on every matmul (for tuning and tests); by default each
    /// product's variant is chosen from its shape ([`matmul::choose`]).
    pub matmul: matmul::Forced,
    /// Run the e-graph optimizer (`--no-opt` turns it off).
    pub optimize: bool,
    /// Keep the kernel graphs before and after optimization as Graphviz DOT text
    /// ([`Compiled::dot`]).
    pub dot: bool,
    /// Which attention kernels the optimizer may choose (`--attention`).
    pub attention: optimize::AttentionPolicy,
    /// What the flash kernels' variants may take ([`flash::variant::Choices`]): the tiling
    /// (`--flash-tile`, or `SINTER_FLASH_TILE` for experiments), tensor cores
    /// (`--tensor-cores`: cooperative matrices of `f16` operands with `f32` accumulation, like
    /// PyTorch's `set_float32_matmul_precision("medium")`; the target must have cooperative
    /// matrices), the whole backward in one kernel (`--flash-backward`).
    pub flash: flash::variant::Choices,
    /// Print the optimizer's search, apply and rebuild times per iteration to stderr
    /// (`SINTER_OPTIMIZE_TRACE`).
    pub trace_optimizer: bool,
    /// The program as declared, or with its products in `f16` (`--precision mixed`:
    /// [`precision`]); mixed also lets the flash kernels take their tensor-core forms where
    /// the target has cooperative matrices.
    pub precision: precision::Precision,
    /// The gradient scaler's settings (`--precision mixed` on a training step).
    pub loss_scale: loss_scale::LossScale,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            target: Target::default(),
            dump_after: Vec::new(),
            matmul: matmul::Forced::default(),
            optimize: true,
            dot: false,
            attention: optimize::AttentionPolicy::Auto,
            flash: flash::variant::Choices::default(),
            trace_optimizer: false,
            precision: precision::Precision::F32,
            loss_scale: loss_scale::LossScale::default(),
        }
    }
}

impl Options {
    /// These options with the environment's settings applied (`SINTER_FLASH_TILE=a|b|c|d`
    /// forces the flash tiling, `SINTER_OPTIMIZE_TRACE` (any value) traces the optimizer), and
    /// what follows from them: `--precision mixed` on a target with cooperative matrices takes
    /// the flash kernels' tensor-core forms.
    pub fn with_environment(&self) -> Result<Options, CompileError> {
        let mut options = self.clone();
        if let Ok(name) = std::env::var("SINTER_FLASH_TILE")
            && !name.trim().is_empty()
        {
            options.flash.tiling = flash::variant::Tiling::named(&name).ok_or_else(|| {
                let names: Vec<&str> = flash::variant::Tiling::NAMED
                    .iter()
                    .map(|(n, _)| *n)
                    .collect();
                CompileError::Setting {
                    what: format!("SINTER_FLASH_TILE={name}"),
                    expected: names.join(", "),
                }
            })?;
        }
        if std::env::var_os("SINTER_OPTIMIZE_TRACE").is_some() {
            options.trace_optimizer = true;
        }
        let features = &options.target.features;
        if options.precision == precision::Precision::Mixed
            && features.cooperative_matrix
            && !features.cooperative_emulated
        {
            options.flash.tensor_cores = true;
        }
        Ok(options)
    }

    /// Refuses choices the target cannot run.
    fn check(&self) -> Result<(), CompileError> {
        self.target.check().map_err(|e| CompileError::Setting {
            what: format!("target `{}`", self.target.name),
            expected: e,
        })?;
        if self.flash.tensor_cores && self.target.features.cooperative_emulated {
            return Err(CompileError::Setting {
                what: format!(
                    "flash tensor cores on target `{}`, whose cooperative matrices are emulated",
                    self.target.name
                ),
                expected: "the flash kernels' f32 forms: only the matmul has an emulated \
                           tensor-core form"
                    .into(),
            });
        }
        if self.flash.tensor_cores && !self.target.features.cooperative_matrix {
            return Err(CompileError::Setting {
                what: format!(
                    "tensor cores on target `{}`, which has no cooperative matrices",
                    self.target.name
                ),
                expected: "a target with cooperative matrices (e.g. `--target h200`)".into(),
            });
        }
        if let Some(tile) = self.matmul.tile {
            matmul::Tile::check(tile).map_err(|e| CompileError::Setting {
                what: format!("the forced matmul tile `{tile}`"),
                expected: e,
            })?;
        }
        Ok(())
    }

    /// The cost model of these options: what the optimizer prices its choices with.
    pub fn cost_model(&self) -> cost::CostModel {
        cost::CostModel::new(self.target.clone(), self.flash, self.matmul)
    }
}

#[derive(Debug)]
pub struct Compiled {
    pub artifact: Artifact,
    /// `(pass, text)` for every pass asked for in [`Options::dump_after`], in the order they ran.
    pub dumps: Vec<(Pass, String)>,
    /// Every pass that ran, in order, with its time and counts.
    pub passes: Vec<PassRecord>,
    /// Things worth telling the user that do not stop compilation (e.g. a gradient that is
    /// zero because the loss does not depend on its operand).
    pub warnings: Vec<String>,
    /// What the optimizer did (`None` with `--no-opt`).
    pub optimize: Option<optimize::Report>,
    /// With [`Options::dot`]: `(name, DOT text)` of the kernel graph before optimization (the
    /// decomposed graph, one kernel per primitive) and after.
    pub dot: Vec<(&'static str, String)>,
}

/// The whole pipeline, pass by pass ([`Pass::ALL`] in order).
pub fn compile(graph: &Graph, options: &Options) -> Result<Compiled, CompileError> {
    compile_keeping_dumps(graph, options).1
}

/// [`compile`], keeping the dumps of the passes that ran when a later one fails (that is when
/// `--dump-after` helps most).
pub fn compile_keeping_dumps(
    graph: &Graph,
    options: &Options,
) -> (Vec<(Pass, String)>, Result<Compiled, CompileError>) {
    let mut log = PassLog::new(&options.dump_after);
    match run_passes(graph, options, &mut log) {
        Ok(mut compiled) => {
            compiled.dumps = log.dumps;
            compiled.passes = log.records;
            (Vec::new(), Ok(compiled))
        }
        Err(e) => (log.dumps, Err(e)),
    }
}

/// Every pass in order, each reporting to `log` (see [`pipeline`]).
fn run_passes(
    graph: &Graph,
    options: &Options,
    log: &mut PassLog,
) -> Result<Compiled, CompileError> {
    let options = &options.with_environment()?;
    options.check()?;
    let ir_counts = |g: &Graph| format!("{} nodes, {} values", g.nodes.len(), g.values.len());
    log.start();
    let autocast;
    let graph = match options.precision {
        precision::Precision::F32 => graph,
        precision::Precision::Mixed => {
            autocast = precision::autocast(graph)
                .and_then(|g| loss_scale::add_loss_scaling(&g, &options.loss_scale))
                .map_err(|e| CompileError::Internal(format!("autocast: {e}")))?;
            log.done(Pass::Precision, ir_counts(&autocast), || {
                sinter_ir::text::print(&autocast)
            });
            &autocast
        }
    };
    let graph = sinter_ir::expand::expand_composites(graph);
    log.done(Pass::Expand, ir_counts(&graph), || {
        sinter_ir::text::print(&graph)
    });
    let differentiated = autodiff::differentiate(&graph)?;
    let (graph, mut warnings) = (differentiated.graph, differentiated.warnings);
    log.done(Pass::Autodiff, ir_counts(&graph), || {
        sinter_ir::text::print(&graph)
    });
    let contracts = contracts::analyze(&graph)?;
    log.done(
        Pass::Contracts,
        format!("{} contracts", contracts.len()),
        || describe_contracts(&graph, &contracts),
    );
    let (graph, map) = sinter_ir::decompose::decompose_mapped(&graph);
    let contracts = contracts::carried(&contracts, &map);
    log.done(Pass::Decompose, ir_counts(&graph), || {
        sinter_ir::text::print(&graph)
    });
    let unoptimized = kgraph::KernelGraph::from_graph(&graph);
    let (kgraph, report) = if options.optimize {
        let config = optimize::Config {
            attention: options.attention,
            model: options.cost_model(),
            trace: options.trace_optimizer,
        };
        let (kg, report) = optimize::optimize_logged(&graph, &config, log);
        (kg, Some(report))
    } else {
        (unoptimized.clone(), None)
    };
    let (sched, mem) = lower_and_plan(&kgraph, options, log)?;
    let summary = match &report {
        Some(r) => {
            log.start();
            let mut baseline = schedule::lower(&unoptimized, options)?;
            in_place::update_in_place(&mut baseline);
            in_place::write_parts_in_place(&mut baseline);
            log.done(Pass::Baseline, step_counts(&baseline), || {
                baseline.to_string()
            });
            Some(pack::optimizer_summary(r, &baseline, &sched))
        }
        None => None,
    };
    log.start();
    let mut artifact = pack::pack(&kgraph, &sched, &mem, options, &contracts)?;
    artifact.optimizer = summary;
    log.done(
        Pass::Codegen,
        format!(
            "{} kernels, {} dispatches",
            artifact.kernels.len(),
            artifact.dispatches.len()
        ),
        || describe_kernels(&artifact),
    );
    warnings.extend(pack::loop_warnings(&artifact));
    let dot = if options.dot {
        vec![("before", unoptimized.to_dot()), ("after", kgraph.to_dot())]
    } else {
        Vec::new()
    };
    Ok(Compiled {
        artifact,
        dumps: Vec::new(),
        passes: Vec::new(),
        warnings,
        optimize: report,
        dot,
    })
}

/// The passes from lowering to the memory plan: `lower`, `in-place`, `memory`.
fn lower_and_plan(
    kgraph: &kgraph::KernelGraph,
    options: &Options,
    log: &mut PassLog,
) -> Result<(schedule::Schedule, memory::MemoryPlan), CompileError> {
    log.start();
    let mut sched = schedule::lower(kgraph, options)?;
    log.done(Pass::Lower, step_counts(&sched), || sched.to_string());
    let updated = in_place::update_in_place(&mut sched);
    let parts = in_place::write_parts_in_place(&mut sched);
    log.done(
        Pass::InPlace,
        format!(
            "{updated} updated in place, {parts} concat parts written in place, {}",
            step_counts(&sched)
        ),
        || sched.to_string(),
    );
    let mem = memory::plan(&sched, options.target.limits.max_binding)?;
    log.done(
        Pass::Memory,
        format!(
            "peak {} bytes in {} arena(s), lower bound {}",
            mem.peak_bytes,
            mem.arenas.len(),
            mem.lower_bound_bytes
        ),
        || memory::describe(&sched, &mem),
    );
    Ok((sched, mem))
}

/// `N steps, M bytes moved` of a schedule.
fn step_counts(sched: &schedule::Schedule) -> String {
    let bytes: u64 = sched.steps.iter().map(|s| s.plan.bytes_moved()).sum();
    format!("{} steps, {bytes} bytes moved", sched.steps.len())
}

/// The contracts as text (`--dump-after contracts`): one line per value.
fn describe_contracts(g: &Graph, contracts: &contracts::Contracts) -> String {
    let mut lines: Vec<String> = contracts
        .iter()
        .map(|(&v, c)| {
            let mut what = Vec::new();
            if let Some(n) = c.index_bound {
                what.push(format!("0 <= {} < {n}", g.name_of(v)));
            }
            if let Some(lo) = c.at_least {
                what.push(format!("{} >= {lo}, not NaN", g.name_of(v)));
            }
            what.join(", ")
        })
        .collect();
    lines.sort();
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// The artifact's kernels as text (`--dump-after codegen`): name, the dispatches that run it,
/// the source ops it covers and the rules that built it.
fn describe_kernels(artifact: &Artifact) -> String {
    let mut uses = vec![0usize; artifact.kernels.len()];
    for d in &artifact.dispatches {
        uses[d.kernel as usize] += 1;
    }
    let mut s = String::new();
    for (k, n) in artifact.kernels.iter().zip(uses) {
        s.push_str(&format!(
            "{} ({} dispatches): {}\n",
            k.name,
            n,
            k.ops.join("; ")
        ));
        if !k.rules.is_empty() {
            s.push_str(&format!("    rules: {}\n", k.rules.join(", ")));
        }
    }
    s
}

/// The back half of [`compile`] for a kernel graph built directly (tests of kernels that only
/// the optimizer makes): lowering, memory plan, codegen, artifact.
pub fn compile_kernel_graph(
    kgraph: &kgraph::KernelGraph,
    options: &Options,
) -> Result<Artifact, CompileError> {
    let options = &options.with_environment()?;
    options.check()?;
    let mut log = PassLog::new(&[]);
    let (sched, mem) = lower_and_plan(kgraph, options, &mut log)?;
    pack::pack(kgraph, &sched, &mem, options, &contracts::Contracts::new())
}
