//! Dynamic loss scaling in the graph, as `torch.amp.GradScaler` does it, for a training step
//! whose products run in `f16` ([`crate::precision`]).
//!
//! Gradients of `f16` values underflow where the loss is small, so every `grad` node
//! differentiates `loss · amp.scale` instead, and its results are multiplied by `1 / amp.scale`
//! before anything reads them (clipping, accumulation, the optimizer). One check per step,
//! `amp.finite = eq(t, t)` with `t = Σ_g sum(g · 0)` (NaN exactly when some gradient element is
//! NaN or ±inf; each sum taken over rows first, so that it spreads over workgroups), then guards
//! every update of the step:
//!
//! - each `assign` that belongs to the update (its source computed from a gradient or an
//!   optimizer, or its state read by one: params, moments, `train.step`, accumulation sums and
//!   counters) becomes `where(amp.finite, new, old)`: a skipped step leaves them bit for bit as
//!   they were. State the forward updates on its own (running statistics) is not guarded, as in
//!   PyTorch, where the forward runs whether or not `optimizer.step` is skipped.
//! - `amp.scale` halves on a non-finite step and doubles after `growth_interval` finite steps
//!   in a row (`amp.good_steps` counts them); `amp.skipped` counts the skipped steps.
//!
//! All of it is ordinary elementwise ops on scalars and the update kernels' operands, so the
//! guards fuse into the optimizer's kernels and no step waits on the host.

use sinter_ir::expand::{Rebuild, rebuild};
use sinter_ir::{Attrs, DType, Graph, GraphError, Init, Op, OpClass, TensorType, ValueId};

/// The scaler's settings; the defaults are `torch.amp.GradScaler`'s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScale {
    /// The scale of the first step (`init_scale`, 2¹⁶).
    pub init: f64,
    /// Finite steps in a row after which the scale doubles (`growth_interval`, 2000).
    pub growth_interval: u32,
}

impl Default for LossScale {
    fn default() -> Self {
        LossScale {
            init: 65536.0,
            growth_interval: 2000,
        }
    }
}

/// The scale: multiplies the loss before differentiation.
pub const SCALE: &str = "amp.scale";
/// Finite steps since the scale last changed.
pub const GOOD_STEPS: &str = "amp.good_steps";
/// Steps skipped for non-finite gradients, since the run began.
pub const SKIPPED: &str = "amp.skipped";
/// 1 where every gradient of this step is finite, else 0.
pub const FINITE: &str = "amp.finite";
/// The states the scaler adds to a training step (training state, as optimizer moments are:
/// a weights file may hold them for a program that lacks them).
pub const STATES: [&str; 3] = [SCALE, GOOD_STEPS, SKIPPED];

/// What the scaler multiplies by when the scale changes (`growth_factor`, `backoff_factor`).
const GROWTH: f64 = 2.0;
const BACKOFF: f64 = 0.5;

/// The scaler's states, declared at the first `grad` node.
#[derive(Clone, Copy)]
struct States {
    scale: ValueId,
    inverse: ValueId,
    good_steps: ValueId,
    skipped: ValueId,
}

/// `g` with its gradients scaled and its updates guarded (see the module docs); a graph
/// without `grad` nodes comes back unchanged.
pub fn add_loss_scaling(g: &Graph, config: &LossScale) -> Result<Graph, GraphError> {
    if !g.nodes.iter().any(|n| n.op == Op::Grad) {
        return Ok(g.clone());
    }
    let mut states: Option<States> = None;
    let mut unscaled = Vec::new();
    let mut new = rebuild(g, |rb, node, inputs| {
        if node.op != Op::Grad {
            return Ok(None);
        }
        let s = match states {
            Some(s) => s,
            None => *states.insert(declare(rb, config)?),
        };
        let mut operands = inputs.to_vec();
        operands[0] = rb.add(Op::Mul, &[inputs[0], s.scale], Attrs::new())?;
        let scaled = rb.add_node(Op::Grad, &operands, node.attrs.clone())?;
        let results = scaled
            .into_iter()
            .map(|grad| rb.add(Op::Mul, &[grad, s.inverse], Attrs::new()))
            .collect::<Result<Vec<_>, _>>()?;
        unscaled.extend(&results);
        Ok(Some(results))
    })?;
    let s = states.expect("a grad node declared the states");

    let guarded = update_assigns(&new);
    let finite = finite_check(&mut new, &unscaled)?;
    for (i, guard) in guarded.into_iter().enumerate() {
        if guard {
            let a = new.assigns[i];
            new.assigns[i].source =
                new.add(Op::Where, &[finite, a.source, a.target], Attrs::new())?;
        }
    }
    update_scale(&mut new, s, finite, config).map(|()| new)
}

/// Declares `amp.scale`, its inverse, `amp.good_steps` and `amp.skipped`.
fn declare(rb: &mut Rebuild, config: &LossScale) -> Result<States, GraphError> {
    let scalar = TensorType::scalar(DType::F32);
    let scale = rb.add_state(SCALE, scalar.clone(), Init::Full(config.init))?;
    let good_steps = rb.add_state(GOOD_STEPS, scalar.clone(), Init::Zeros)?;
    let skipped = rb.add_state(SKIPPED, scalar, Init::Zeros)?;
    let inverse = rb.add(Op::Reciprocal, &[scale], Attrs::new())?;
    Ok(States {
        scale,
        inverse,
        good_steps,
        skipped,
    })
}

/// `amp.finite`: `eq(t, t)` with `t` the sum of every gradient's elements times 0, which is
/// NaN exactly when an element of some gradient is not finite (`inf · 0` and `NaN · 0` are
/// NaN). Each gradient of rank 2 or more is first summed over its last axis (one workgroup per
/// row, where a whole-tensor sum is one workgroup's loop); the row sums of all gradients,
/// flattened and joined by one `concat` (whose operands lowering writes straight into their
/// parts), take one sum.
fn finite_check(g: &mut Graph, grads: &[ValueId]) -> Result<ValueId, GraphError> {
    let zero = g.constant(0.0)?;
    let mut parts = Vec::with_capacity(grads.len());
    for &grad in grads {
        let mut zeroed = g.add(Op::Mul, &[grad, zero], Attrs::new())?;
        let rank = g.ty(zeroed).shape.len();
        if rank >= 2 {
            let last = Attrs::new().and(sinter_ir::key::AXES, vec![rank - 1]);
            zeroed = g.add(Op::Sum, &[zeroed], last)?;
        }
        if g.ty(zeroed).dtype != DType::F32 {
            let f32 = Attrs::new().and(sinter_ir::key::DTYPE, DType::F32);
            zeroed = g.add(Op::Cast, &[zeroed], f32)?;
        }
        let numel = g.ty(zeroed).numel();
        if g.ty(zeroed).shape != [numel] {
            let flat = Attrs::new().and(sinter_ir::key::SHAPE, vec![numel]);
            zeroed = g.add(Op::Reshape, &[zeroed], flat)?;
        }
        parts.push(zeroed);
    }
    assert!(!parts.is_empty(), "a grad node has results");
    let joined = match parts[..] {
        [one] => one,
        _ => g.add(
            Op::Concat,
            &parts,
            Attrs::new().and(sinter_ir::key::AXIS, 0usize),
        )?,
    };
    let total = g.add(Op::Sum, &[joined], Attrs::new())?;
    g.add_node(
        Op::Eq,
        &[total, total],
        Attrs::new(),
        Some(&[FINITE.to_string()]),
    )
    .map(|r| r[0])
}

/// Per assign of `g`: whether it is part of the update (see the module docs): its source is
/// computed from a `grad` node's result or an optimizer's, or its target flows into such a
/// computation (`train.step` into `adamw`, an accumulation counter into the `where` that applies
/// the update).
fn update_assigns(g: &Graph) -> Vec<bool> {
    let from_update = crate::precision::from_gradients(g);
    // values whose value reaches an update node: an optimizer, or a reader of an update value
    let mut feeds_update = vec![false; g.values.len()];
    for node in g.nodes.iter().rev() {
        let update_node = node.op.class() == OpClass::Optimizer
            || node.inputs.iter().any(|v| from_update[v.index()]);
        let feeds = update_node || node.outputs.iter().any(|o| feeds_update[o.index()]);
        if feeds {
            for &v in &node.inputs {
                feeds_update[v.index()] = true;
            }
        }
    }
    g.assigns
        .iter()
        .map(|a| from_update[a.source.index()] || feeds_update[a.target.index()])
        .collect()
}

/// The assigns that move `amp.scale`, `amp.good_steps` and `amp.skipped` on (see the module
/// docs).
fn update_scale(
    g: &mut Graph,
    s: States,
    finite: ValueId,
    config: &LossScale,
) -> Result<(), GraphError> {
    let one = g.constant(1.0)?;
    let zero = g.constant(0.0)?;
    let good = g.add(Op::Add, &[s.good_steps, one], Attrs::new())?;
    let interval = g.constant(f64::from(config.growth_interval))?;
    let grow = g.add(Op::Ge, &[good, interval], Attrs::new())?;
    let growth = g.constant(GROWTH)?;
    let grown = g.add(Op::Mul, &[s.scale, growth], Attrs::new())?;
    let kept = g.add(Op::Where, &[grow, grown, s.scale], Attrs::new())?;
    let backoff = g.constant(BACKOFF)?;
    let backed_off = g.add(Op::Mul, &[s.scale, backoff], Attrs::new())?;
    let scale = g.add(Op::Where, &[finite, kept, backed_off], Attrs::new())?;
    let counted = g.add(Op::Where, &[grow, zero, good], Attrs::new())?;
    let good_steps = g.add(Op::Where, &[finite, counted, zero], Attrs::new())?;
    let one_more = g.add(Op::Add, &[s.skipped, one], Attrs::new())?;
    let skipped = g.add(Op::Where, &[finite, s.skipped, one_more], Attrs::new())?;
    g.add_assign(s.scale, scale)?;
    g.add_assign(s.good_steps, good_steps)?;
    g.add_assign(s.skipped, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    use sinter_ir::interp;

    const STEP: &str = "graph t {
  input x: f32[4, 8]
  input labels: i32[4]
  param w: f32[8, 3] = normal(std=0.1, seed=1)
  param b: f32[3] = zeros
  logits = add(matmul(x, w), b)
  loss = cross_entropy(logits, labels)
  train loss with adamw(lr=0.01)
  output loss
}
";

    fn scaled(src: &str, config: &LossScale) -> Graph {
        let g = sinter_ir::text::parse(src).unwrap_or_else(|d| panic!("{}", d.render("t", src)));
        let g = crate::precision::autocast(&g).expect("autocasts");
        add_loss_scaling(&g, config).expect("scales")
    }

    #[test]
    fn every_update_is_guarded_and_the_forward_is_not() {
        let g = scaled(STEP, &LossScale::default());
        let finite = g.lookup(FINITE).expect("declared");
        let guarded: Vec<&str> = g
            .assigns
            .iter()
            .filter(|a| {
                g.producer(a.source)
                    .is_some_and(|n| g.node(n).op == Op::Where && g.node(n).inputs[0] == finite)
            })
            .map(|a| g.name_of(a.target))
            .collect();
        for name in [
            "w",
            "b",
            "w.m",
            "w.v",
            "b.m",
            "b.v",
            "train.step",
            SCALE,
            GOOD_STEPS,
        ] {
            assert!(guarded.contains(&name), "{name} not guarded: {guarded:?}");
        }
        // the loss the program outputs is the unscaled one
        let loss = g.lookup("loss").expect("kept");
        assert_eq!(g.outputs, [loss]);
    }

    /// The params and states after one step of the interpreter from the program's initial
    /// values and the scale `scale`, by name, each as its bits (f64).
    fn step(g: &Graph, scale: f64) -> HashMap<String, Vec<u64>> {
        let persistent = HashMap::from([(SCALE.to_string(), interp::Tensor::scalar(scale))]);
        let run = evaluate(g, &persistent);
        run.assigned
            .into_iter()
            .map(|(name, t)| (name, t.data.iter().map(|x| x.to_bits()).collect()))
            .collect()
    }

    /// One run of `g`, differentiated, on a fixed batch.
    fn evaluate(g: &Graph, persistent: &HashMap<String, interp::Tensor>) -> interp::Evaluation {
        let g = crate::autodiff::differentiate(g)
            .expect("differentiates")
            .graph;
        let x: Vec<f64> = (0..32).map(|i| f64::from(i * 7 % 11 - 5) / 3.0).collect();
        let inputs = HashMap::from([
            ("x".to_string(), interp::Tensor::f32([4, 8], x)),
            (
                "labels".to_string(),
                interp::Tensor::i32([4], vec![0, 2, 1, 2]),
            ),
        ]);
        interp::evaluate(&g, &inputs, persistent).expect("runs")
    }

    fn initial(g: &Graph, name: &str) -> Vec<u64> {
        let v = g.lookup(name).expect("declared");
        let init = match &g.value(v).def {
            sinter_ir::ValueDef::Param(init) | sinter_ir::ValueDef::State(init) => init,
            _ => panic!("{name} is not persistent"),
        };
        sinter_ir::init::initial_value(g.ty(v), init)
            .data
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    #[test]
    fn an_overflowing_step_changes_no_param_and_halves_the_scale() {
        let g = scaled(STEP, &LossScale::default());
        let bits = |x: f64| vec![x.to_bits()];
        let after = step(&g, 1e38);
        assert_eq!(after[SCALE], bits(5e37));
        assert_eq!(after[SKIPPED], bits(1.0));
        assert_eq!(after[GOOD_STEPS], bits(0.0));
        for name in ["w", "b", "w.m", "w.v", "b.m", "b.v", "train.step"] {
            assert_eq!(
                after[name],
                initial(&g, name),
                "{name} changed on a skipped step"
            );
        }
        // a finite step moves the params, counts a good step and keeps the scale
        let after = step(&g, 1024.0);
        assert_eq!(after[SCALE], bits(1024.0));
        assert_eq!(after[GOOD_STEPS], bits(1.0));
        assert_eq!(after[SKIPPED], bits(0.0));
        assert_ne!(after["w"], initial(&g, "w"));
        assert_eq!(after["train.step"], bits(1.0));
    }

    #[test]
    fn the_scale_doubles_after_the_growth_interval() {
        let config = LossScale {
            init: 256.0,
            growth_interval: 1,
        };
        let after = step(&scaled(STEP, &config), 256.0);
        assert_eq!(after[SCALE], vec![512f64.to_bits()]);
        assert_eq!(after[GOOD_STEPS], vec![0f64.to_bits()]);
    }

    #[test]
    fn unscaled_gradients_equal_the_plain_ones() {
        // f32 products: scaling by a power of two and back is exact
        let plain = sinter_ir::text::parse(STEP).expect("parses");
        let scaled_graph = add_loss_scaling(&plain, &LossScale::default()).expect("scales");
        let with = step(&scaled_graph, 65536.0);
        let without = evaluate(&plain, &HashMap::new());
        for (name, t) in &without.assigned {
            let bits: Vec<u64> = t.data.iter().map(|x| x.to_bits()).collect();
            assert_eq!(with[name], bits, "{name}");
        }
    }
}
