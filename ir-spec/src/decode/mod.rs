//! Decode derivation: from a language model's forward program (token ids `[B, T]` in, next-token
//! logits out, causal attention), the two programs that generate text with a key/value cache.
//!
//! - The **prefill** program takes `P` tokens per sequence (`ids: i32[B', P]`, positions
//!   `0..P`), computes them as the forward program does, writes every attention's keys and
//!   values into cache states (`[.., T, ..]`, positions `P..T` zeroed), and returns the logits
//!   at the position `last` (`logits: f32[B', V]`).
//! - The **step** program takes one token per sequence (`ids: i32[B', 1]`) at the position
//!   `pos` (an `i32[]` input), writes its keys and values into the caches at `pos`, attends over
//!   every cached position (the causal mask hides those past `pos`), and returns its logits.
//!
//! Neither is written by hand: [`derive()`] analyzes the forward program after composite
//! expansion, so hand-written attention is found like the `attention` op's expansion. Every value
//! gets a *layout* ([`layout`]): where it holds the batch, the query positions and (for
//! attention scores and probabilities) the key positions. A product `q·kᵀ` whose rows and
//! columns are both positions makes `k` a *key*; `p·v` contracting key positions makes `v` a
//! *value*; the step reads both from a cache. Index-only values that meet the positions (a
//! learned position table, rotary angles from `iota`, the causal mask) take the roles of the
//! axes they meet: the step reads a position table at `pos` (a gather), counts `iota` from
//! `pos`, and builds the mask's row for `pos`. The causal check (`causal.rs`) proves that no product or reduction
//! over key positions reads a key past its query, which is what makes the cache's stale entries
//! harmless; programs it cannot prove causal are refused, saying where and why.
//!
//! A cache holds the earliest value that the keys are a view of (before a grouped-query
//! broadcast over query heads, before a head split), so it is as small as the keys are. The
//! step appends with `where(eq(iota, pos), new, cache)` assigned back to the cache state, which
//! the compiler's in-place pass turns into one kernel writing the cache in place.

mod analysis;
mod causal;
pub mod layout;
mod rebuild;
mod reference;

use std::collections::HashMap;
use std::fmt::Write as _;

use sinter_artifact::generation::GenerationInfo;

use crate::graph::{Graph, GraphError, NodeId, ValueDef};
use crate::interp::Tensor;
use crate::types::DType;

pub use layout::Role;
pub use reference::reference_logits;

/// What to derive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeSpec {
    /// The token ids: an input `i32[B, T]`.
    pub ids: String,
    /// The next-token logits: a value of the forward program (an output, or any value of a
    /// training program) holding `[B, T, V]` scores in C order, batch first or positions first.
    pub logits: String,
    /// Sequences generated together (the forward program's batch when `None`).
    pub batch: Option<usize>,
    /// Tokens the prefill takes at once (the context length when `None`).
    pub prefill: Option<usize>,
}

impl Default for DecodeSpec {
    fn default() -> DecodeSpec {
        DecodeSpec {
            ids: "ids".into(),
            logits: "logits".into(),
            batch: None,
            prefill: None,
        }
    }
}

impl DecodeSpec {
    /// The default names (`ids`, `logits`) with the given batch and prefill length.
    pub fn sized(batch: usize, prefill: usize) -> DecodeSpec {
        DecodeSpec {
            batch: Some(batch),
            prefill: Some(prefill),
            ..DecodeSpec::default()
        }
    }
}

/// The derived programs.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoder {
    pub prefill: Graph,
    pub step: Graph,
    pub info: GenerationInfo,
}

impl Decoder {
    /// The derivation as text (`--dump-after decode`): sizes and caches, then both programs.
    pub fn describe(&self) -> String {
        let i = &self.info;
        let mut s = String::new();
        writeln!(
            s,
            "# context {}, batch {}, prefill {} tokens, vocabulary {}; ids `{}`, logits `{}`, \
             step position `{}`, prefill last position `{}`",
            i.context, i.batch, i.prefill, i.vocab, i.ids, i.logits, i.position, i.last
        )
        .unwrap();
        for c in &i.caches {
            let v = self.step.lookup(c).expect("caches are states of the step");
            writeln!(s, "# cache {c}: {}", self.step.ty(v)).unwrap();
        }
        writeln!(s, "# ---- prefill ----").unwrap();
        s.push_str(&crate::text::print(&self.prefill));
        writeln!(s, "# ---- step ----").unwrap();
        s.push_str(&crate::text::print(&self.step));
        s
    }
}

/// Why a program cannot be derived.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DecodeError {
    #[error("the program has no value `{name}` for the token ids (name them with --ids){}", inputs_hint(.inputs))]
    NoIds { name: String, inputs: Vec<String> },
    #[error("the token ids `{name}` must be an input of type i32[batch, positions], not {what}")]
    IdsType { name: String, what: String },
    #[error("the program has no value `{name}` for the logits (name them with --logits)")]
    NoLogits { name: String },
    #[error("the logits `{logits}` do not depend on the token ids `{ids}`")]
    LogitsWithoutIds { logits: String, ids: String },
    #[error(
        "the logits `{logits}` depend on the input `{input}`, which generation does not feed \
         (only the token ids `{ids}`)"
    )]
    OtherInput {
        logits: String,
        input: String,
        ids: String,
    },
    #[error(
        "the logits `{logits}` must hold the scores of every position of every sequence, \
         [batch, positions, vocabulary] (or positions first) in C order: {problem}"
    )]
    LogitsLayout { logits: String, problem: String },
    #[error("{what} must be {range}, got {value}")]
    Size {
        what: &'static str,
        range: String,
        value: usize,
    },
    #[error("`{value} = {op}(…)` {reason}")]
    Op {
        value: String,
        op: &'static str,
        reason: String,
    },
    #[error("`{value}` holds the {role} along axis {axis} but {problem}")]
    Leaf {
        value: String,
        role: Role,
        axis: usize,
        problem: &'static str,
    },
    #[error("the program is not causal at `{value} = {op}(…)`: {reason}")]
    NotCausal {
        value: String,
        op: &'static str,
        reason: String,
    },
    #[error("the derived {program} program does not check at `{value}`: {source}")]
    Rebuild {
        program: &'static str,
        value: String,
        source: Box<GraphError>,
    },
}

fn inputs_hint(inputs: &[String]) -> String {
    if inputs.is_empty() {
        String::new()
    } else {
        format!("; its inputs are {}", inputs.join(", "))
    }
}

/// Derives the prefill and step programs of `g` (see the module docs).
pub fn derive(g: &Graph, spec: &DecodeSpec) -> Result<Decoder, DecodeError> {
    derive_with(g, spec, &HashMap::new())
}

/// [`derive()`], with the values of some states (by name), which the causal check may read: an
/// imported model's mask buffer is a state whose value comes with its weights. The programs
/// are proven causal for these values; loading other values into those states later voids the
/// proof.
pub fn derive_with(
    g: &Graph,
    spec: &DecodeSpec,
    states: &HashMap<String, Tensor>,
) -> Result<Decoder, DecodeError> {
    let forward = forward_part(g, &spec.ids, &spec.logits)?;
    let forward = crate::expand::expand_composites(&forward);
    let ids = forward
        .lookup(&spec.ids)
        .expect("the forward part keeps the ids");
    let logits = forward.lookup(&spec.logits).expect("and the logits");
    let [batch, context] = forward.ty(ids).shape[..] else {
        unreachable!("checked by forward_part")
    };
    if context < 2 {
        return Err(DecodeError::Size {
            what: "the context length (the ids' second extent)",
            range: "at least 2".into(),
            value: context,
        });
    }
    let new_batch = spec.batch.unwrap_or(batch);
    let prefill = spec.prefill.unwrap_or(context);
    if new_batch == 0 || (batch == 1 && new_batch != 1) {
        return Err(DecodeError::Size {
            what: "the batch",
            range: if batch == 1 {
                "1 for a program of batch 1 (where its sequences lie in axes that merge them \
                 with others is unknown; give the program a batch of 2 or more)"
                    .into()
            } else {
                "at least 1".into()
            },
            value: new_batch,
        });
    }
    if !(1..=context).contains(&prefill) {
        return Err(DecodeError::Size {
            what: "the prefill length",
            range: format!("from 1 to the context length {context}"),
            value: prefill,
        });
    }
    let a = analysis::Analysis::run(&forward, ids)?;
    causal::check(&forward, &a, states)?;
    let order = rebuild::logits_order(&forward, &a, logits)?;
    let free = |base: &str| {
        std::iter::once(base.to_string())
            .chain((1..).map(|k| format!("{base}_{k}")))
            .find(|n| forward.lookup(n).is_none())
            .expect("some name is free")
    };
    let caches: Vec<String> = a
        .caches
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let name = forward.name_of(c);
            if Graph::is_generated_name(name) {
                free(&format!("cache{i}"))
            } else {
                free(&format!("cache.{name}"))
            }
        })
        .collect();
    let vocab = forward.ty(logits).numel() / (batch * context);
    let info = GenerationInfo {
        ids: spec.ids.clone(),
        logits: spec.logits.clone(),
        position: free("pos"),
        last: free("last"),
        context: context as u64,
        batch: new_batch as u64,
        prefill: prefill as u64,
        vocab: vocab as u64,
        caches,
    };
    let plan = rebuild::Plan {
        forward: &forward,
        a: &a,
        ids,
        logits,
        order,
        info: &info,
    };
    Ok(Decoder {
        prefill: plan.build(rebuild::Mode::Prefill)?,
        step: plan.build(rebuild::Mode::Step)?,
        info,
    })
}

/// The part of `g` that computes `logits` from the token ids `ids` and the params and states:
/// declarations and nodes the logits depend on, in their order, with their names; `logits` its
/// one output; no assigns. For a training program, its forward pass.
pub fn forward_part(g: &Graph, ids: &str, logits: &str) -> Result<Graph, DecodeError> {
    let Some(id) = g.lookup(ids) else {
        return Err(DecodeError::NoIds {
            name: ids.to_string(),
            inputs: g.inputs().map(|v| g.name_of(v).to_string()).collect(),
        });
    };
    let ty = g.ty(id);
    if g.value(id).def != ValueDef::Input || ty.dtype != DType::I32 || ty.rank() != 2 {
        let what = match g.value(id).def {
            ValueDef::Input => format!("an input of type {ty}"),
            _ => format!("a computed value of type {ty}"),
        };
        return Err(DecodeError::IdsType {
            name: ids.to_string(),
            what,
        });
    }
    let Some(out) = g.lookup(logits) else {
        return Err(DecodeError::NoLogits {
            name: logits.to_string(),
        });
    };
    let mut needed = vec![false; g.values.len()];
    needed[out.index()] = true;
    for node in g.nodes.iter().rev() {
        if node.outputs.iter().any(|o| needed[o.index()]) {
            for &v in &node.inputs {
                needed[v.index()] = true;
            }
        }
    }
    if !needed[id.index()] {
        return Err(DecodeError::LogitsWithoutIds {
            logits: logits.to_string(),
            ids: ids.to_string(),
        });
    }
    if let Some(other) = g.inputs().find(|&v| needed[v.index()] && v != id) {
        return Err(DecodeError::OtherInput {
            logits: logits.to_string(),
            input: g.name_of(other).to_string(),
            ids: ids.to_string(),
        });
    }
    let copy = |e: GraphError| DecodeError::Rebuild {
        program: "forward",
        value: logits.to_string(),
        source: Box::new(e),
    };
    let keep_node = |n: NodeId| g.node(n).outputs.iter().any(|o| needed[o.index()]);
    let (mut f, map) = g
        .restricted(|v| needed[v.index()], keep_node)
        .map_err(copy)?;
    f.add_output(map[out.index()].expect("the logits are kept"));
    Ok(f)
}
