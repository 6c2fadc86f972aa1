//! The passes of a compile, by name, and the record of a run of them.
//!
//! [`crate::compile`] runs every pass in [`Pass::ALL`]'s order (the optimizer's passes only when
//! optimizing, `baseline` with them). Each pass, once run, reports to the [`PassLog`]: its time,
//! a line of counts, and — when `--dump-after` names it — the text of what it produced. Every
//! stage's data has a text form (`Display`), so a dump is readable text, never `Debug`.

use std::fmt;
use std::time::{Duration, Instant};

/// A pass of the pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pass {
    /// The prefill and step programs of a generation artifact ([`crate::generation`]).
    Decode,
    /// The program as autocast runs it, its gradients scaled (`--precision mixed`).
    Precision,
    /// Composites (`attention`) become primitives.
    Expand,
    /// `grad` nodes become backward subgraphs.
    Autodiff,
    /// Index and step bounds: each proven, or a contract the runtime checks.
    Contracts,
    /// Ops defined by other ops become those ops.
    Decompose,
    /// The decomposed graph as an e-graph.
    EGraph,
    /// Algebra, layout and attention rules to saturation.
    Algebra,
    /// Fused kernels added beside the ops they replace.
    Fusion,
    /// The cheapest equivalent graph, by the cost model.
    Extract,
    /// Fusion again, up to the values the first extraction stores.
    FusionToStored,
    /// Extraction again, from the first one's choice.
    Reextract,
    /// The chosen e-nodes as a kernel graph.
    KernelGraph,
    /// Fused kernels over one space joined.
    MergeSiblings,
    /// An attention's dQ and dK/dV kernels made one.
    MergeFlashBackward,
    /// Values a later kernel recomputes stored by an earlier one.
    StoreRecomputed,
    /// Kernel steps over views of planned buffers.
    Lower,
    /// Param and state updates written over their targets.
    InPlace,
    /// Arena offsets by liveness.
    Memory,
    /// The unoptimized graph lowered, for the optimizer's before-and-after counts.
    Baseline,
    /// WGSL for every kernel, validated by naga, and the artifact.
    Codegen,
}

impl Pass {
    pub const ALL: [Pass; 21] = [
        Pass::Decode,
        Pass::Precision,
        Pass::Expand,
        Pass::Autodiff,
        Pass::Contracts,
        Pass::Decompose,
        Pass::EGraph,
        Pass::Algebra,
        Pass::Fusion,
        Pass::Extract,
        Pass::FusionToStored,
        Pass::Reextract,
        Pass::KernelGraph,
        Pass::MergeSiblings,
        Pass::MergeFlashBackward,
        Pass::StoreRecomputed,
        Pass::Lower,
        Pass::InPlace,
        Pass::Memory,
        Pass::Baseline,
        Pass::Codegen,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Pass::Decode => "decode",
            Pass::Precision => "precision",
            Pass::Expand => "expand",
            Pass::Autodiff => "autodiff",
            Pass::Contracts => "contracts",
            Pass::Decompose => "decompose",
            Pass::EGraph => "e-graph",
            Pass::Algebra => "algebra",
            Pass::Fusion => "fusion",
            Pass::Extract => "extract",
            Pass::FusionToStored => "fusion-to-stored",
            Pass::Reextract => "re-extract",
            Pass::KernelGraph => "kernel-graph",
            Pass::MergeSiblings => "merge-siblings",
            Pass::MergeFlashBackward => "merge-flash-backward",
            Pass::StoreRecomputed => "store-recomputed",
            Pass::Lower => "lower",
            Pass::InPlace => "in-place",
            Pass::Baseline => "baseline",
            Pass::Memory => "memory",
            Pass::Codegen => "codegen",
        }
    }

    /// What the pass does, in a line (`sinter compile --dump-after list`).
    pub fn about(self) -> &'static str {
        match self {
            Pass::Decode => "a language model's prefill and one-token step programs (--generate)",
            Pass::Precision => "products in f16 as autocast runs them, gradients scaled (mixed)",
            Pass::Expand => "composites (attention) become primitives",
            Pass::Autodiff => "grad nodes become backward subgraphs of ordinary ops",
            Pass::Contracts => "index and step bounds: proven, or checked by the runtime",
            Pass::Decompose => "ops defined by other ops become those ops",
            Pass::EGraph => "the decomposed graph as an e-graph (optimizer)",
            Pass::Algebra => "algebra, layout and attention rules to saturation (optimizer)",
            Pass::Fusion => "fused kernels added beside the ops they replace (optimizer)",
            Pass::Extract => "the cheapest equivalent kernel graph by the cost model (optimizer)",
            Pass::FusionToStored => "fusion up to the values extraction stores (optimizer)",
            Pass::Reextract => "extraction again from the first choice (optimizer)",
            Pass::KernelGraph => "the chosen e-nodes as a kernel graph (optimizer)",
            Pass::MergeSiblings => "fused kernels over one space joined (optimizer)",
            Pass::MergeFlashBackward => "an attention's dQ and dK/dV kernels made one (optimizer)",
            Pass::StoreRecomputed => "values a later kernel recomputes stored (optimizer)",
            Pass::Lower => "kernel steps over views of planned buffers",
            Pass::InPlace => {
                "param and state updates written over their targets; concat operands written \
                 into their parts"
            }
            Pass::Baseline => "the unoptimized graph lowered, for before/after counts",
            Pass::Memory => "arena offsets by liveness",
            Pass::Codegen => "WGSL per kernel, validated by naga; the artifact",
        }
    }

    /// Whether the pass is one of the optimizer's (run only when optimizing).
    pub fn optimizes(self) -> bool {
        (Pass::EGraph..=Pass::StoreRecomputed).contains(&self) || self == Pass::Baseline
    }

    /// The pass called `name`; `optimize` names the optimizer's last pass and `schedule` the
    /// schedule as lowering leaves it (`in-place`), the names of earlier versions.
    pub fn named(name: &str) -> Option<Pass> {
        match name {
            "optimize" => Some(Pass::StoreRecomputed),
            "schedule" => Some(Pass::InPlace),
            _ => Pass::ALL.into_iter().find(|p| p.name() == name),
        }
    }

    /// Every pass with what it does, one per line (`--dump-after list`).
    pub fn list() -> String {
        let mut s = String::new();
        for p in Pass::ALL {
            s.push_str(&format!("{:<22}{}\n", p.name(), p.about()));
        }
        s.push_str("optimize              (the same as store-recomputed)\n");
        s.push_str("schedule              (the same as in-place)\n");
        s
    }
}

impl fmt::Display for Pass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One pass's run: its time and what it produced, counted.
#[derive(Clone, Debug)]
pub struct PassRecord {
    pub pass: Pass,
    pub time: Duration,
    /// A line of counts (nodes, kernels, bytes…).
    pub counts: String,
}

impl fmt::Display for PassRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<22}{:>9.1} ms  {}",
            self.pass.name(),
            self.time.as_secs_f64() * 1e3,
            self.counts
        )
    }
}

/// What the passes report as they run: a [`PassRecord`] each, and the text of those asked for.
#[derive(Debug)]
pub struct PassLog {
    dump_after: Vec<Pass>,
    /// `(pass, text)` for each pass in `dump_after`, in the order they ran.
    pub dumps: Vec<(Pass, String)>,
    pub records: Vec<PassRecord>,
    lap: Instant,
}

impl PassLog {
    /// A log that keeps the text of the passes in `dump_after`.
    pub fn new(dump_after: &[Pass]) -> PassLog {
        PassLog {
            dump_after: dump_after.to_vec(),
            dumps: Vec::new(),
            records: Vec::new(),
            lap: Instant::now(),
        }
    }

    /// Starts timing the next pass (time spent since the last [`PassLog::done`] between passes
    /// is not any pass's).
    pub fn start(&mut self) {
        self.lap = Instant::now();
    }

    /// Records that `pass` ran (since the last `start` or `done`), with its counts, and its
    /// text where asked for (`text` is called only then).
    pub fn done(&mut self, pass: Pass, counts: String, text: impl FnOnce() -> String) {
        let time = self.lap.elapsed();
        if self.dump_after.contains(&pass) {
            self.dumps.push((pass, text()));
        }
        self.records.push(PassRecord { pass, time, counts });
        self.lap = Instant::now();
    }

    /// Whether `pass`'s text is asked for.
    pub fn wants(&self, pass: Pass) -> bool {
        self.dump_after.contains(&pass)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pass_has_one_name() {
        for p in Pass::ALL {
            assert_eq!(Pass::named(p.name()), Some(p));
        }
        let mut names: Vec<&str> = Pass::ALL.iter().map(|p| p.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Pass::ALL.len());
        assert_eq!(Pass::named("optimize"), Some(Pass::StoreRecomputed));
        assert!(Pass::named("optimise").is_none());
        assert!(Pass::list().lines().count() > Pass::ALL.len());
    }

    #[test]
    fn the_log_keeps_only_the_text_asked_for() {
        let mut log = PassLog::new(&[Pass::Lower]);
        log.done(Pass::Expand, "3 nodes".into(), || panic!("not asked for"));
        log.done(Pass::Lower, "2 steps".into(), || "steps".into());
        assert_eq!(log.dumps, vec![(Pass::Lower, "steps".to_string())]);
        assert_eq!(log.records.len(), 2);
        assert!(log.records[1].to_string().starts_with("lower"));
    }
}
