//! Compiling a generation artifact: the prefill and step programs that the decode derivation
//! (`sinter_ir::decode`) makes from a language model's forward program, each through the whole
//! pipeline ([`crate::compile`]), packed as one artifact: the step's, with the prefill beside it
//! (`Artifact::generation`).
//!
//! Both programs declare the same params and states in the same order (the model's weights,
//! then the caches), and the memory planner stacks params and states at the start of the arenas
//! in declaration order, so they land at the same places in both; [`compile_generation`] checks
//! that they did. A runtime then runs both programs over one set of arenas, the step's slots
//! giving the initial values.

use std::collections::HashMap;

use sinter_ir::Graph;
use sinter_ir::artifact::{Artifact, Role};
use sinter_ir::decode::{DecodeError, DecodeSpec, Decoder, derive_with};
use sinter_ir::generation::Generation;
use sinter_ir::interp::Tensor;

use crate::{CompileError, Options, Pass, compile_keeping_dumps};

/// A compiled generation artifact and what its compilation printed.
#[derive(Debug)]
pub struct CompiledGeneration {
    pub artifact: Artifact,
    pub decoder: Decoder,
    pub warnings: Vec<String>,
}

/// Why a generation artifact could not be made.
#[derive(Debug, thiserror::Error)]
pub enum GenerationError {
    /// The forward program does not allow generation with a cache (not causal, a shape that
    /// mixes positions, names that are not there).
    #[error("cannot derive generation from this program: {0}")]
    Decode(#[from] DecodeError),
    /// The prefill or the step program did not compile.
    #[error("compiling the derived {program} program: {source}")]
    Compile {
        program: &'static str,
        source: CompileError,
    },
}

/// The derivation and both compilations; `states` gives the values of states the causal check
/// may read (see [`sinter_ir::decode::derive_with`]); `dumps` receives, in order, what the passes
/// named in `options.dump_after` produced (`decode`: the derived programs), each with a title.
pub fn compile_generation(
    graph: &Graph,
    spec: &DecodeSpec,
    states: &HashMap<String, Tensor>,
    options: &Options,
    dumps: &mut Vec<(String, String)>,
) -> Result<CompiledGeneration, GenerationError> {
    let decoder = derive_with(graph, spec, states)?;
    if options.dump_after.contains(&Pass::Decode) {
        dumps.push((Pass::Decode.name().to_string(), decoder.describe()));
    }
    let mut compile = |program: &'static str, g: &Graph| {
        let (early, compiled) = compile_keeping_dumps(g, options);
        let titled = |(pass, text): (Pass, String)| (format!("{} ({program})", pass.name()), text);
        match compiled {
            Ok(mut c) => {
                dumps.extend(std::mem::take(&mut c.dumps).into_iter().map(titled));
                Ok(c)
            }
            Err(source) => {
                dumps.extend(early.into_iter().map(titled));
                Err(GenerationError::Compile { program, source })
            }
        }
    };
    let prefill = compile("prefill", &decoder.prefill)?;
    let step = compile("step", &decoder.step)?;
    let mut warnings = prefill.warnings;
    warnings.extend(step.warnings);
    let mut artifact = step.artifact;
    let mut prefill = prefill.artifact;
    let info = decoder.info.clone();
    // The positions are indices into the caches (and into a position table, where the program
    // has one): the runtime checks them when they are fed.
    let bound = |a: &mut Artifact, name: &str, below: u64| {
        for t in (a.tensors.iter_mut()).filter(|t| t.name == name && t.role == Role::Input) {
            t.index_bound = Some(t.index_bound.map_or(below, |b| b.min(below)));
        }
    };
    bound(&mut artifact, &info.position, info.context);
    bound(&mut prefill, &info.last, info.prefill);
    for t in &mut prefill.tensors {
        t.init = None;
        t.fill = None;
    }
    artifact.generation = Some(Box::new(Generation { info, prefill }));
    artifact.check().map_err(|e| GenerationError::Compile {
        program: "step",
        source: CompileError::Internal(format!(
            "the prefill and step programs do not fit one generation artifact: {e}"
        )),
    })?;
    Ok(CompiledGeneration {
        artifact,
        decoder,
        warnings,
    })
}
