//! Index and step bounds: where the values that an op's contract restricts come from, and how
//! each is checked.
//!
//! Three ops read values they cannot use in every case: `embedding` and `embedding_grad` (ids
//! in `0..rows`), `cross_entropy` (labels in `0..classes`), and `adam`/`adamw` (a step `t ≥ 1`,
//! not NaN). A GPU kernel cannot stop on a bad value, so each such *use* must be shown to hold
//! before the program runs, on every path the value can take:
//!
//! - **Forward ranges.** Each value gets an interval (and whether it may be NaN) from the ops
//!   that make it: constants, `iota`, `argmax`, views, `concat`, `where`, `cast`, `maximum`,
//!   `minimum`, `relu`, shifts by a constant. A use whose value's range lies inside what the op
//!   accepts is proven.
//! - **Contracts.** Otherwise the requirement is carried backwards through views, `concat`,
//!   `where` (both branches), same-dtype `cast` and shifts by a constant to where the value
//!   enters: an input gets a contract that the runtime checks before upload
//!   (`TensorSlot::index_bound`, `TensorSlot::at_least`); a param or state gets one that the
//!   runtime checks when weights are loaded, that its initial value is checked against here,
//!   and that each `assign` to it must keep (proven with the contracts assumed: `train.step`
//!   stays ≥ 0 because it starts at 0 and is assigned `train.step + 1`).
//! - Anything else is a compile error naming the op, the value and the requirement, and how to
//!   make it provable (feed it as an input, or bound it with `maximum`/`minimum` first).
//!
//! This is a pure function of the graph after autodiff and before decomposition, where these ops
//! are still whole.

use std::collections::HashMap;

use sinter_ir::{DType, Graph, Op, OpClass, ValueDef, ValueId, key};

use crate::error::CompileError;

/// What a value must satisfy: every element in `lo..=hi`, and not NaN.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Requirement {
    pub lo: f64,
    pub hi: f64,
}

impl Requirement {
    fn index(rows: usize) -> Requirement {
        Requirement {
            lo: 0.0,
            hi: rows as f64 - 1.0,
        }
    }

    fn intersect(self, other: Requirement) -> Requirement {
        Requirement {
            lo: self.lo.max(other.lo),
            hi: self.hi.min(other.hi),
        }
    }

    fn shifted(self, by: f64) -> Requirement {
        Requirement {
            lo: self.lo + by,
            hi: self.hi + by,
        }
    }

    fn holds(self, r: Range) -> bool {
        !r.nan && r.lo >= self.lo && r.hi <= self.hi
    }

    fn describe(self) -> String {
        match (self.lo.is_finite(), self.hi.is_finite()) {
            (true, true) => format!("in {}..={}", self.lo, self.hi),
            (true, false) => format!("at least {} (and not NaN)", self.lo),
            _ => format!("at most {} (and not NaN)", self.hi),
        }
    }
}

/// A value's possible elements: within `lo..=hi`, and NaN too when `nan`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Range {
    lo: f64,
    hi: f64,
    nan: bool,
}

impl Range {
    const ANY: Range = Range {
        lo: f64::NEG_INFINITY,
        hi: f64::INFINITY,
        nan: true,
    };

    fn exact(v: f64) -> Range {
        Range {
            lo: v,
            hi: v,
            nan: v.is_nan(),
        }
    }

    fn union(self, o: Range) -> Range {
        Range {
            lo: self.lo.min(o.lo),
            hi: self.hi.max(o.hi),
            nan: self.nan || o.nan,
        }
    }
}

/// What the runtime must check for one input, param or state.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Contract {
    /// i32 values in `0..index_bound`.
    pub index_bound: Option<u64>,
    /// f32 values at least this, and not NaN.
    pub at_least: Option<f64>,
}

/// The contracts of the inputs, params and states that need one, by value.
pub type Contracts = HashMap<ValueId, Contract>;

/// `contracts` carried across a pass that rebuilt the graph (`map`: the new graph's value for
/// each old one, by old index, as [`sinter_ir::expand::rebuild_mapped`] gives it).
pub fn carried(contracts: &Contracts, map: &[Option<ValueId>]) -> Contracts {
    contracts
        .iter()
        .filter_map(|(v, c)| Some((map.get(v.index()).copied().flatten()?, *c)))
        .collect()
}

/// Finds every restricted use in `g`, proves it or gives the value where it enters a contract;
/// fails on a use that neither works for.
pub fn analyze(g: &Graph) -> Result<Contracts, CompileError> {
    let mut cx = Bounds {
        g,
        ranges: Vec::with_capacity(g.values.len()),
        required: HashMap::new(),
    };
    cx.forward(&HashMap::new());
    for node in &g.nodes {
        let (value, req, what) = match node.op {
            Op::Embedding => {
                let rows = g.ty(node.inputs[0]).shape[0];
                (node.inputs[1], Requirement::index(rows), "row index")
            }
            Op::EmbeddingGrad => {
                let rows: usize = node.attr(key::NUM_EMBEDDINGS);
                (node.inputs[1], Requirement::index(rows), "row index")
            }
            Op::CrossEntropy => {
                let classes = g.ty(node.inputs[0]).shape[1];
                let mut req = Requirement::index(classes);
                // the ignored label may lie outside the classes (PyTorch's habit is -100); a
                // label between it and the classes gives a NaN loss on the GPU
                if let Some(ignore) = node.attrs.try_of(key::IGNORE_INDEX) {
                    req.lo = req.lo.min(ignore as f64);
                    req.hi = req.hi.max(ignore as f64);
                }
                (node.inputs[1], req, "class label")
            }
            Op::Adam | Op::AdamW => {
                let req = Requirement {
                    lo: 1.0,
                    hi: f64::INFINITY,
                };
                (node.inputs[4], req, "step count")
            }
            _ => continue,
        };
        if !cx.resolve(value, req) {
            return Err(unproven(g, node.op, value, req, what));
        }
    }
    cx.check_persistent()?;
    Ok(cx.contracts())
}

struct Bounds<'g> {
    g: &'g Graph,
    /// Forward range of every value.
    ranges: Vec<Range>,
    /// Requirements collected on inputs, params and states.
    required: HashMap<ValueId, Requirement>,
}

impl Bounds<'_> {
    /// Forward ranges of every value, with `assumed` ranges for some leaves.
    fn forward(&mut self, assumed: &HashMap<ValueId, Range>) {
        let g = self.g;
        self.ranges.clear();
        self.ranges.resize(g.values.len(), Range::ANY);
        for (v, r) in assumed {
            self.ranges[v.index()] = *r;
        }
        for node in &g.nodes {
            let r = self.node_range(node);
            for &o in &node.outputs {
                self.ranges[o.index()] = r;
            }
        }
    }

    fn node_range(&self, node: &sinter_ir::Node) -> Range {
        let g = self.g;
        let input = |i: usize| self.ranges[node.inputs[i].index()];
        let constant = |i: usize| self.constant(node.inputs[i]);
        match node.op {
            Op::Constant => Range::exact(node.attr(key::VALUE)),
            Op::Iota => {
                let shape: Vec<usize> = node.attr(key::SHAPE);
                let axis: usize = node.attr(key::AXIS);
                Range {
                    lo: 0.0,
                    hi: shape[axis] as f64 - 1.0,
                    nan: false,
                }
            }
            Op::Argmax => {
                let axis: usize = node.attr(key::AXIS);
                Range {
                    lo: 0.0,
                    hi: g.ty(node.inputs[0]).shape[axis] as f64 - 1.0,
                    nan: false,
                }
            }
            op if op.class() == OpClass::View => input(0),
            Op::Concat => (1..node.inputs.len()).fold(input(0), |r, i| r.union(input(i))),
            Op::Where => input(1).union(input(2)),
            Op::Cast => {
                let from = input(0);
                match g.ty(node.outputs[0]).dtype {
                    DType::F32 => from,
                    // rounding is monotonic: the bounds' roundings bound the rounded values
                    DType::F16 => Range {
                        lo: DType::F16.round(from.lo),
                        hi: DType::F16.round(from.hi),
                        nan: from.nan,
                    },
                    // toward zero, saturating; NaN becomes 0
                    DType::I32 => {
                        let clamp = |v: f64| v.trunc().clamp(i32::MIN as f64, i32::MAX as f64);
                        let r = Range {
                            lo: clamp(from.lo),
                            hi: clamp(from.hi),
                            nan: false,
                        };
                        if from.nan {
                            r.union(Range::exact(0.0))
                        } else {
                            r
                        }
                    }
                }
            }
            Op::Maximum | Op::Minimum => {
                let (a, b) = (input(0), input(1));
                let pick = if node.op == Op::Maximum {
                    f64::max
                } else {
                    f64::min
                };
                Range {
                    lo: pick(a.lo, b.lo),
                    hi: pick(a.hi, b.hi),
                    nan: a.nan || b.nan,
                }
            }
            Op::Relu => {
                let a = input(0);
                Range {
                    lo: a.lo.max(0.0),
                    hi: a.hi.max(0.0),
                    nan: a.nan,
                }
            }
            Op::Add | Op::Sub => {
                let (a, b) = (input(0), input(1));
                let sign = if node.op == Op::Add { 1.0 } else { -1.0 };
                match (constant(0), constant(1)) {
                    (_, Some(c)) if c.is_finite() => shift(a, sign * c),
                    (Some(c), _) if c.is_finite() && node.op == Op::Add => shift(b, c),
                    _ => Range::ANY,
                }
            }
            _ => Range::ANY,
        }
    }

    /// The value of a scalar constant node.
    fn constant(&self, v: ValueId) -> Option<f64> {
        let node = self.g.node(self.g.producer(v)?);
        (node.op == Op::Constant).then(|| node.attr(key::VALUE))
    }

    /// Whether `v` meets `req` on every path: by its forward range, or by contracts where the
    /// requirement reaches inputs, params and states.
    fn resolve(&mut self, v: ValueId, req: Requirement) -> bool {
        let g = self.g;
        if req.holds(self.ranges[v.index()]) {
            return true;
        }
        let Some(id) = g.producer(v) else {
            let entry = self.required.entry(v).or_insert(req);
            *entry = entry.intersect(req);
            return true;
        };
        let node = g.node(id);
        let same_dtype = |i: usize| g.ty(node.inputs[i]).dtype == g.ty(v).dtype;
        match node.op {
            op if op.class() == OpClass::View => self.resolve(node.inputs[0], req),
            Op::Concat => (0..node.inputs.len()).all(|i| self.resolve(node.inputs[i], req)),
            Op::Where => self.resolve(node.inputs[1], req) && self.resolve(node.inputs[2], req),
            Op::Cast if same_dtype(0) => self.resolve(node.inputs[0], req),
            Op::Add | Op::Sub => {
                let sign = if node.op == Op::Add { 1.0 } else { -1.0 };
                match (self.constant(node.inputs[0]), self.constant(node.inputs[1])) {
                    (_, Some(c)) if c.is_finite() => {
                        self.resolve(node.inputs[0], req.shifted(-sign * c))
                    }
                    (Some(c), _) if c.is_finite() && node.op == Op::Add => {
                        self.resolve(node.inputs[1], req.shifted(-c))
                    }
                    _ => false,
                }
            }
            _ => false,
        }
    }

    /// Params and states with a contract: their initial values meet it, and so does every value
    /// assigned to them (proven with every contract assumed).
    fn check_persistent(&mut self) -> Result<(), CompileError> {
        let g = self.g;
        let persistent: Vec<(ValueId, Requirement)> = (self.required.iter())
            .filter(|(v, _)| g.value(**v).is_persistent())
            .map(|(v, r)| (*v, *r))
            .collect();
        if persistent.is_empty() {
            return Ok(());
        }
        for &(v, req) in &persistent {
            let value = g.value(v);
            let (ValueDef::Param(init) | ValueDef::State(init)) = &value.def else {
                continue;
            };
            let start = sinter_ir::init::initial_value(&value.ty, init);
            if let Some(bad) = start.data.iter().find(|&&x| !req.holds(Range::exact(x))) {
                return Err(CompileError::Unproven {
                    what: format!(
                        "`{}` must stay {} (where it is used as an index or a step count), but \
                         its initial value holds {bad}",
                        value.name,
                        req.describe()
                    ),
                    help: "start it from a value that meets the requirement".into(),
                });
            }
        }
        let assumed: HashMap<ValueId, Range> = persistent
            .iter()
            .map(|&(v, r)| {
                let range = Range {
                    lo: r.lo,
                    hi: r.hi,
                    nan: false,
                };
                (v, range)
            })
            .collect();
        self.forward(&assumed);
        for a in &g.assigns {
            let Some(&(_, req)) = persistent.iter().find(|(v, _)| *v == a.target) else {
                continue;
            };
            let before = self.required.clone();
            let resolved = self.resolve(a.source, req);
            // New requirements may fall on inputs (checked at run time), not on params and
            // states, whose own proof above assumed the requirements as they were.
            let persistent_changed = self
                .required
                .iter()
                .any(|(v, r)| g.value(*v).is_persistent() && before.get(v) != Some(r));
            if !resolved || persistent_changed {
                let target = g.name_of(a.target);
                return Err(CompileError::Unproven {
                    what: format!(
                        "`{target}` must stay {} (where it is used as an index or a step count), \
                         but `assign {target} = {}` cannot be shown to keep it so",
                        req.describe(),
                        g.name_of(a.source)
                    ),
                    help: "assign it a value computed from it by adding a constant, or from \
                           inputs (which the runtime checks)"
                        .into(),
                });
            }
        }
        Ok(())
    }

    fn contracts(&self) -> Contracts {
        let g = self.g;
        self.required
            .iter()
            .map(|(&v, req)| {
                let contract = match g.ty(v).dtype {
                    DType::I32 => Contract {
                        index_bound: Some((req.hi + 1.0).max(0.0) as u64),
                        at_least: None,
                    },
                    DType::F32 | DType::F16 => Contract {
                        index_bound: None,
                        at_least: Some(req.lo),
                    },
                };
                (v, contract)
            })
            .collect()
    }
}

fn shift(r: Range, by: f64) -> Range {
    Range {
        lo: r.lo + by,
        hi: r.hi + by,
        nan: r.nan,
    }
}

fn unproven(g: &Graph, op: Op, value: ValueId, req: Requirement, what: &str) -> CompileError {
    let name = g.name_of(value);
    let by = g
        .producer(value)
        .map(|n| format!(" (computed by `{}`)", g.node(n).op.name()))
        .unwrap_or_default();
    CompileError::Unproven {
        what: format!(
            "`{}` reads `{name}`{by} as a {what}, which must be {}, and nothing shows it is: \
             the GPU cannot stop on a bad one",
            op.name(),
            req.describe()
        ),
        help: format!(
            "feed `{name}` as an input (the runtime checks inputs), or bound it with \
             maximum/minimum before it is used, so that its range is known"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The contracts of `src`'s program, by value name.
    fn contracts(src: &str) -> Result<HashMap<String, Contract>, String> {
        let g = sinter_ir::text::parse(src).map_err(|d| d.to_string())?;
        let g = sinter_ir::expand::expand_composites(&g);
        let g = crate::autodiff::differentiate(&g)
            .map_err(|e| e.to_string())?
            .graph;
        let by_value = analyze(&g).map_err(|e| e.to_string())?;
        Ok(by_value
            .into_iter()
            .map(|(v, c)| (g.name_of(v).to_string(), c))
            .collect())
    }

    #[test]
    fn ids_through_views_concat_and_where_reach_the_inputs() {
        let c = contracts(
            "graph g {
  input a: i32[2]
  input b: i32[3]
  input m: f32[5]
  param t: f32[10, 4] = zeros
  ids = concat(a, slice(b, axis=0, start=0, end=3), axis=0)
  picked = where(m, ids, reshape(ids, shape=[5]))
  e = embedding(t, picked)
  output e
}",
        )
        .unwrap();
        assert_eq!(c["a"].index_bound, Some(10));
        assert_eq!(c["b"].index_bound, Some(10));
        assert!(!c.contains_key("m"));
    }

    #[test]
    fn computed_ids_need_a_known_range() {
        let err = contracts(
            "graph g {
  input x: f32[4]
  param t: f32[10, 4] = zeros
  e = embedding(t, cast(mul(x, 3), dtype=\"i32\"))
  output e
}",
        )
        .unwrap_err();
        assert!(err.contains("`embedding` reads"), "{err}");
        assert!(err.contains("in 0..=9"), "{err}");
        // Bounded first: proven, nothing for the runtime to check.
        let c = contracts(
            "graph g {
  input x: f32[4]
  param t: f32[10, 4] = zeros
  e = embedding(t, cast(minimum(maximum(mul(x, 3), 0), 9), dtype=\"i32\"))
  l = embedding(t, argmax(t, axis=1))
  output e, l
}",
        )
        .unwrap();
        assert!(c.is_empty(), "{c:?}");
    }

    #[test]
    fn the_train_step_stays_at_least_zero_by_induction() {
        let c = contracts(
            "graph g {
  input x: f32[4]
  param w: f32[4] = ones
  loss = sum(mul(x, w))
  train loss with adamw(lr=0.1)
  output loss
}",
        )
        .unwrap();
        assert_eq!(c["train.step"].at_least, Some(0.0));
        let by_input = contracts(
            "graph g {
  input g: f32[4]
  input t: f32[]
  param w: f32[4] = ones
  state m: f32[4] = zeros
  state v: f32[4] = zeros
  w2, m2, v2 = adam(w, g, m, v, t)
  output w2
}",
        )
        .unwrap();
        assert_eq!(by_input["t"].at_least, Some(1.0));
        let decreasing = contracts(
            "graph g {
  input g: f32[4]
  param w: f32[4] = ones
  state m: f32[4] = zeros
  state v: f32[4] = zeros
  state s: f32[] = full(3)
  w2, m2, v2 = adam(w, g, m, v, s)
  assign s = sub(s, 1)
  output w2
}",
        )
        .unwrap_err();
        assert!(decreasing.contains("`assign s = "), "{decreasing}");
        let starts_low = contracts(
            "graph g {
  input g: f32[4]
  param w: f32[4] = ones
  state m: f32[4] = zeros
  state v: f32[4] = zeros
  state s: f32[] = zeros
  w2, m2, v2 = adam(w, g, m, v, s)
  output w2
}",
        )
        .unwrap_err();
        assert!(starts_low.contains("initial value holds 0"), "{starts_low}");
    }
}
