//! Training sugar: one call that turns a loss into a whole optimizer step.
//!
//! [`add_training`] is what the text statement `train LOSS with OPT(attr=value, ...)` lowers to.
//! It adds, with the ordinary builder and in this order:
//!
//! 1. the optimizer's states, all `zeros`: `{p}.m` and `{p}.v` per param for `adam`/`adamw`,
//!    then one `train.step: f32[]`; `{p}.momentum_buf` per param for `sgd` with momentum;
//! 2. `{p1}.grad, ..., {pn}.grad = grad(LOSS, p1, ..., pn)`;
//! 3. with `clip_norm = c` (global-norm clipping, as `torch.nn.utils.clip_grad_norm_`):
//!    `train.grad_norm = sqrt(Σ_p sum(square({p}.grad)))`,
//!    `train.clip_scale = minimum(div(c, add(train.grad_norm, 1e-6)), 1)` and
//!    `{p}.grad.clipped = mul({p}.grad, train.clip_scale)`, which the optimizer then uses;
//! 4. for `adam`/`adamw` (and any optimizer with a varying learning rate):
//!    `train.step.next = add(train.step, 1)` (so the first step is t = 1); the step's rate
//!    `train.lr` (from `train.lr_table`, a state whose initializer is the schedule, at row
//!    `train.step`; a constant without a schedule) and for Adam its bias corrections
//!    `train.bias_corrections` (from `train.bias_table` at row `t`): values computed in f64 and
//!    rounded once, as exact as PyTorch's host-side scalars;
//! 5. per param, the optimizer node: `{p}.next, {p}.m.next, {p}.v.next = adamw(p, g, {p}.m,
//!    {p}.v, train.step.next, train.lr, train.bias_corrections, ...)`, `{p}.next,
//!    {p}.momentum_buf.next = sgd(p, g, {p}.momentum_buf, [train.lr], ...)` or
//!    `{p}.next = sgd(p, g, [train.lr], ...)`;
//! 6. `assign` of every param and state to its `.next` value.
//!
//! The result is a plain graph: printing it shows these statements, and it parses back to the
//! same graph. Every precondition is checked before the graph is touched, so an error leaves
//! the graph as it was.

use crate::attr::key;
use std::collections::HashSet;

use crate::attr::{Attr, Attrs};
use crate::graph::{Graph, GraphError, Init, ValueDef, ValueId};
use crate::infer::{TypeError, infer};
use crate::init::{Schedule, ScheduleKind, bias_correction_rows};
use crate::op::Op;
use crate::types::{DType, TensorType};

/// The optimizers `train` can expand to; each is the op of the same name.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Optimizer {
    Sgd,
    Adam,
    AdamW,
}

impl Optimizer {
    pub const ALL: [Optimizer; 3] = [Optimizer::Sgd, Optimizer::Adam, Optimizer::AdamW];

    pub fn op(self) -> Op {
        match self {
            Optimizer::Sgd => Op::Sgd,
            Optimizer::Adam => Op::Adam,
            Optimizer::AdamW => Op::AdamW,
        }
    }

    pub fn name(self) -> &'static str {
        self.op().name()
    }

    pub fn from_name(name: &str) -> Option<Optimizer> {
        Optimizer::ALL.into_iter().find(|o| o.name() == name)
    }
}

/// What to train and how.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainSpec {
    pub optimizer: Optimizer,
    /// The optimizer's attributes, exactly as for its op (`lr`, `momentum`, `beta1`, ...).
    pub attrs: Attrs,
    /// Global-norm gradient clipping: every gradient is scaled by
    /// `min(1, clip_norm / (total_norm + 1e-6))`. Must be positive and finite.
    pub clip_norm: Option<f64>,
    /// The params to train, in order; `None`: every param of the graph so far.
    pub params: Option<Vec<ValueId>>,
    /// The learning-rate schedule (its `lr` is the optimizer's).
    pub schedule: LrSchedule,
    /// The params that get no weight decay (their group's `weight_decay` is 0).
    pub no_decay: NoDecay,
    /// A group whose learning rate is the schedule's times a factor (`lr_scaled=[...]`,
    /// `lr_scale=S`).
    pub lr_scaled: Option<LrScaled>,
    /// Gradient accumulation: a run is one micro-batch; every `accumulate`-th run applies the
    /// mean of the micro-batches' gradients (1: every run updates).
    pub accumulate: u64,
}

/// `lr_scaled=[P1, ...]` with `lr_scale=S` of `train`: PyTorch's param group
/// `{"params": [P1, ...], "lr": S * lr}` (with a schedule, the group's rate is `S` times the
/// scheduled one, as a `LambdaLR` over both groups gives).
#[derive(Clone, Debug, PartialEq)]
pub struct LrScaled {
    pub params: Vec<ValueId>,
    pub scale: f64,
}

/// `no_decay=` of `train`: which params form the group without weight decay.
#[derive(Clone, Debug, PartialEq)]
pub enum NoDecay {
    /// Every param decays (the default).
    Nothing,
    /// `no_decay="1d"`: the params of rank 0 or 1 — biases and norm gains — as PyTorch
    /// users group them (`p.ndim < 2`).
    OneD,
    /// `no_decay=[P1, ...]`.
    Listed(Vec<ValueId>),
}

impl NoDecay {
    fn excludes(&self, g: &Graph, p: ValueId) -> bool {
        match self {
            NoDecay::Nothing => false,
            NoDecay::OneD => g.ty(p).rank() <= 1,
            NoDecay::Listed(list) => list.contains(&p),
        }
    }
}

/// `schedule=`, `warmup=`, `total_steps=`, `min_lr=` of `train` (see [`Schedule`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrSchedule {
    pub kind: ScheduleKind,
    pub warmup: u64,
    pub total_steps: Option<u64>,
    pub min_lr: f64,
}

impl LrSchedule {
    /// A constant rate, no warmup.
    pub const CONSTANT: LrSchedule = LrSchedule {
        kind: ScheduleKind::Constant,
        warmup: 0,
        total_steps: None,
        min_lr: 0.0,
    };

    /// Whether the rate changes with the step at all.
    fn varies(&self) -> bool {
        self.kind != ScheduleKind::Constant || self.warmup > 0
    }
}

impl TrainSpec {
    pub fn new(optimizer: Optimizer, attrs: Attrs) -> TrainSpec {
        TrainSpec {
            optimizer,
            attrs,
            clip_norm: None,
            params: None,
            schedule: LrSchedule::CONSTANT,
            no_decay: NoDecay::Nothing,
            lr_scaled: None,
            accumulate: 1,
        }
    }

    /// The optimizer's base learning rate (its `lr` attribute or default).
    fn lr(&self) -> f64 {
        let spec = self.optimizer.op().spec();
        self.attrs
            .get(key::LR.name)
            .and_then(Attr::as_float)
            .or_else(|| {
                spec.attr(key::LR.name)
                    .and_then(|a| a.default.value()?.as_float())
            })
            .unwrap_or(f64::NAN)
    }

    /// The schedule as its table's initializer computes it.
    fn table(&self) -> Schedule {
        Schedule {
            kind: self.schedule.kind,
            lr: self.lr(),
            warmup: self.schedule.warmup,
            total_steps: self.schedule.total_steps.unwrap_or(0),
            min_lr: self.schedule.min_lr,
        }
    }

    fn beta(&self, key: crate::attr::Key<crate::attr::kind::Float>, default: f64) -> f64 {
        self.attrs
            .get(key.name)
            .and_then(Attr::as_float)
            .unwrap_or(default)
    }
}

/// The values [`add_training`] created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrainStep {
    /// The trained params, in order.
    pub params: Vec<ValueId>,
    /// `{p}.grad`: the results of the `grad` node, one per param.
    pub grads: Vec<ValueId>,
    /// The gradients the optimizer applies: `{p}.grad.clipped` with clipping, else `grads`.
    pub applied: Vec<ValueId>,
    /// `train.grad_norm`, the global gradient norm before clipping (with clipping only).
    pub grad_norm: Option<ValueId>,
    /// Every state created, in arena order.
    pub states: Vec<ValueId>,
    /// `train.step`, the number of completed steps (adam and adamw only).
    pub step: Option<ValueId>,
    /// `{p}.next`: the updated params, one per param.
    pub new_params: Vec<ValueId>,
}

/// Why a training step cannot be added.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TrainError {
    #[error("there are no params to train")]
    NoParams,
    /// `index` is the position in [`TrainSpec::params`].
    #[error("`{name}` is not a param, so `train` cannot update it")]
    NotAParam { index: usize, name: String },
    #[error("`{name}` is listed twice in `params`")]
    DuplicateParam { index: usize, name: String },
    /// `index` is the position in [`TrainSpec::params`] when the params were listed.
    #[error("`train` updates f32 params, but `{name}` is {ty}")]
    NotF32 {
        index: Option<usize>,
        name: String,
        ty: TensorType,
    },
    #[error("`train` needs a scalar f32 loss, got {ty}")]
    LossType { ty: TensorType },
    #[error("clip_norm={value} must be positive and finite")]
    ClipNorm { value: f64 },
    /// The schedule's attributes do not make a schedule.
    #[error("{0}")]
    Schedule(String),
    #[error("`{name}` in no_decay is not a param this `train` updates")]
    NoDecay { name: String },
    #[error("`{name}` in lr_scaled is not a param this `train` updates")]
    LrScaled { name: String },
    #[error("lr_scale={value} must be positive and finite")]
    LrScale { value: f64 },
    /// The optimizer's attributes break its op's rule.
    #[error("{0}")]
    Optimizer(TypeError),
    #[error("`{name}` is already assigned, and `train` assigns every param it trains")]
    AlreadyAssigned { name: String },
    /// A name `train` generates is taken (`previous` is the value holding it, if any).
    #[error("`train` needs the name `{name}` for {purpose}, but it is already defined")]
    NameTaken {
        name: String,
        purpose: String,
        previous: Option<ValueId>,
    },
    #[error(transparent)]
    Graph(#[from] GraphError),
}

/// The global names `train` defines.
pub const STEP: &str = "train.step";
pub const STEP_NEXT: &str = "train.step.next";
pub const GRAD_NORM: &str = "train.grad_norm";
pub const CLIP_SCALE: &str = "train.clip_scale";
/// The step's learning rate, and the table it is read from.
pub const LR: &str = "train.lr";
pub const LR_TABLE: &str = "train.lr_table";
/// The step's `[1 − β1ᵗ, 1 − β2ᵗ]`, and the table they are read from.
pub const BIAS: &str = "train.bias_corrections";
pub const BIAS_TABLE: &str = "train.bias_table";

/// The attributes of `train` itself (the rest are the optimizer's).
pub const TRAIN_ATTRS: [&str; 8] = [
    "clip_norm",
    "schedule",
    "warmup",
    "total_steps",
    "min_lr",
    "no_decay",
    "lr_scale",
    "accumulate",
];
/// The learning rate of the `lr_scaled` group.
pub const LR_SCALED: &str = "train.lr.scaled";
/// Gradient accumulation's micro-step counter, and whether this run updates.
pub const MICRO: &str = "train.micro";
pub const MICRO_NEXT: &str = "train.micro.next";
pub const APPLY: &str = "train.apply";

/// Added to the norm before dividing, as `torch.nn.utils.clip_grad_norm_` does.
pub const CLIP_EPS: f64 = 1e-6;

/// The suffixes of per-param names (`w1.grad`, `w1.m.next`, ...).
const PARAM_SUFFIXES: [&str; 17] = [
    "grad",
    "grad.clipped",
    "grad.sum",
    "grad.acc",
    "grad.mean",
    "grad.sum.after",
    "after",
    "m.after",
    "v.after",
    "momentum_buf.after",
    "m",
    "v",
    "momentum_buf",
    "next",
    "m.next",
    "v.next",
    "momentum_buf.next",
];

/// Whether `name` has a form that `train` generates (`train.` then anything, or a name ending in
/// one of the per-param suffixes). Used to keep a failed `train` from cascading into
/// "unknown name" errors.
pub fn is_train_name(name: &str) -> bool {
    name.starts_with("train.")
        || PARAM_SUFFIXES.iter().any(|s| {
            name.strip_suffix(s)
                .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.'))
        })
}

/// The states of one param for an optimizer: name suffix and what it holds.
fn param_states(optimizer: Optimizer, attrs: &Attrs) -> &'static [(&'static str, &'static str)] {
    match optimizer {
        Optimizer::Adam | Optimizer::AdamW => {
            &[("m", "the first moment"), ("v", "the second moment")]
        }
        Optimizer::Sgd if momentum(attrs) != 0.0 => &[("momentum_buf", "the momentum buffer")],
        Optimizer::Sgd => &[],
    }
}

fn momentum(attrs: &Attrs) -> f64 {
    attrs
        .get(key::MOMENTUM.name)
        .and_then(Attr::as_float)
        .unwrap_or(0.0)
}

/// Every name [`add_training`] will define for `params`, with what each holds.
pub fn planned_names(g: &Graph, params: &[ValueId], spec: &TrainSpec) -> Vec<(String, String)> {
    let states = param_states(spec.optimizer, &spec.attrs);
    let adam = spec.optimizer != Optimizer::Sgd;
    let mut names = Vec::new();
    for &p in params {
        let p = g.name_of(p);
        for (suffix, what) in states {
            names.push((format!("{p}.{suffix}"), format!("{what} of `{p}`")));
        }
    }
    if adam || spec.schedule.varies() {
        names.push((STEP.into(), "the step counter".into()));
    }
    let accumulating = spec.accumulate > 1;
    if accumulating {
        names.push((MICRO.into(), "the micro-batch counter".into()));
        for &p in params {
            let p = g.name_of(p);
            for (suffix, what) in [
                ("grad.sum", "the summed gradient"),
                ("grad.acc", "the summed gradient with this micro-batch's"),
                ("grad.mean", "the mean gradient"),
                ("grad.sum.after", "the summed gradient for the next run"),
            ] {
                names.push((format!("{p}.{suffix}"), format!("{what} of `{p}`")));
            }
        }
        names.push((MICRO_NEXT.into(), "the new micro-batch counter".into()));
        names.push((APPLY.into(), "whether this run updates".into()));
        names.push((
            "train.micro.after".into(),
            "what the micro-batch counter becomes".into(),
        ));
        for &p in params {
            let p = g.name_of(p);
            names.push((format!("{p}.after"), format!("what `{p}` becomes")));
            for (suffix, what) in states {
                names.push((
                    format!("{p}.{suffix}.after"),
                    format!("what {what} of `{p}` becomes"),
                ));
            }
        }
        if adam || spec.schedule.varies() {
            names.push((
                "train.step.after".into(),
                "what the step counter becomes".into(),
            ));
        }
    }
    if adam {
        names.push((BIAS_TABLE.into(), "the table of bias corrections".into()));
    }
    if spec.schedule.varies() {
        names.push((LR_TABLE.into(), "the table of learning rates".into()));
    }
    for &p in params {
        let p = g.name_of(p);
        names.push((format!("{p}.grad"), format!("the gradient of `{p}`")));
    }
    if spec.clip_norm.is_some() {
        names.push((GRAD_NORM.into(), "the global gradient norm".into()));
        names.push((CLIP_SCALE.into(), "the clipping factor".into()));
        for &p in params {
            let p = g.name_of(p);
            names.push((
                format!("{p}.grad.clipped"),
                format!("the clipped gradient of `{p}`"),
            ));
        }
    }
    if adam || spec.schedule.varies() {
        names.push((STEP_NEXT.into(), "the new step counter".into()));
    }
    if adam || spec.schedule.varies() {
        names.push((LR.into(), "the step's learning rate".into()));
    }
    if adam {
        names.push((BIAS.into(), "the step's bias corrections".into()));
    }
    for &p in params {
        let p = g.name_of(p);
        names.push((format!("{p}.next"), format!("the new value of `{p}`")));
        for (suffix, what) in states {
            names.push((
                format!("{p}.{suffix}.next"),
                format!("the new value of {what} of `{p}`"),
            ));
        }
    }
    names
}

/// The params to train, checked: listed ones must be distinct f32 params.
fn resolve_params(g: &Graph, spec: &TrainSpec) -> Result<Vec<ValueId>, TrainError> {
    let listed = spec.params.is_some();
    let params: Vec<ValueId> = match &spec.params {
        Some(list) => list.clone(),
        None => g.params().collect(),
    };
    if params.is_empty() {
        return Err(TrainError::NoParams);
    }
    for (i, &p) in params.iter().enumerate() {
        let value = g.value(p);
        let name = value.name.clone();
        if !matches!(value.def, ValueDef::Param(_)) {
            return Err(TrainError::NotAParam { index: i, name });
        }
        if params[..i].contains(&p) {
            return Err(TrainError::DuplicateParam { index: i, name });
        }
        if value.ty.dtype != DType::F32 {
            return Err(TrainError::NotF32 {
                index: listed.then_some(i),
                name,
                ty: value.ty.clone(),
            });
        }
    }
    Ok(params)
}

/// Checks everything [`add_training`] needs before it changes the graph.
fn check(g: &Graph, loss: ValueId, spec: &TrainSpec) -> Result<Vec<ValueId>, TrainError> {
    let params = resolve_params(g, spec)?;
    let loss_ty = g.ty(loss);
    if loss_ty.dtype != DType::F32 || !loss_ty.is_scalar() {
        return Err(TrainError::LossType {
            ty: loss_ty.clone(),
        });
    }
    // The optimizer's attributes, checked by its own shape rule on the first param's type.
    let ty = g.ty(params[0]).clone();
    let operands = match spec.optimizer {
        Optimizer::Adam | Optimizer::AdamW => {
            vec![
                ty.clone(),
                ty.clone(),
                ty.clone(),
                ty,
                TensorType::f32(vec![]),
            ]
        }
        Optimizer::Sgd => {
            let n = 2 + param_states(spec.optimizer, &spec.attrs).len();
            vec![ty; n]
        }
    };
    infer(spec.optimizer.op(), &operands, &mut spec.attrs.clone())
        .map_err(TrainError::Optimizer)?;
    if let Some(value) = spec.clip_norm
        && !(value > 0.0 && value.is_finite())
    {
        return Err(TrainError::ClipNorm { value });
    }
    if let NoDecay::Listed(list) = &spec.no_decay
        && let Some(&p) = list.iter().find(|p| !params.contains(p))
    {
        return Err(TrainError::NoDecay {
            name: g.name_of(p).to_string(),
        });
    }
    if let Some(group) = &spec.lr_scaled {
        if let Some(&p) = group.params.iter().find(|p| !params.contains(p)) {
            return Err(TrainError::LrScaled {
                name: g.name_of(p).to_string(),
            });
        }
        if !(group.scale > 0.0 && group.scale.is_finite()) {
            return Err(TrainError::LrScale { value: group.scale });
        }
    }
    let s = spec.schedule;
    if s.kind != ScheduleKind::Constant && s.total_steps.is_none() {
        return Err(TrainError::Schedule(format!(
            "schedule=\"{}\" needs total_steps=",
            s.kind.name()
        )));
    }
    if s.varies()
        && let Err((_, message)) = crate::init::check(&Init::Schedule(spec.table()))
    {
        return Err(TrainError::Schedule(message));
    }
    if let Some(a) = g.assigns.iter().find(|a| params.contains(&a.target)) {
        return Err(TrainError::AlreadyAssigned {
            name: g.name_of(a.target).to_string(),
        });
    }
    let mut planned = HashSet::new();
    for (name, purpose) in planned_names(g, &params, spec) {
        let previous = g.lookup(&name);
        if previous.is_some() || !planned.insert(name.clone()) {
            return Err(TrainError::NameTaken {
                name,
                purpose,
                previous,
            });
        }
    }
    Ok(params)
}

/// Adds one optimizer step on `loss` to `g` (see the module docs for what is added).
pub fn add_training(
    g: &mut Graph,
    loss: ValueId,
    spec: &TrainSpec,
) -> Result<TrainStep, TrainError> {
    let params = check(g, loss, spec)?;
    let names: Vec<String> = params.iter().map(|&p| g.name_of(p).to_string()).collect();
    let suffixes = param_states(spec.optimizer, &spec.attrs);
    let adam = spec.optimizer != Optimizer::Sgd;

    // 1. States.
    let mut states = Vec::new();
    let mut per_param: Vec<Vec<ValueId>> = Vec::new();
    for (&p, name) in params.iter().zip(&names) {
        let ty = g.ty(p).clone();
        let mut mine = Vec::new();
        for (suffix, _) in suffixes {
            mine.push(g.add_state(format!("{name}.{suffix}"), ty.clone(), Init::Zeros)?);
        }
        states.extend(&mine);
        per_param.push(mine);
    }
    let varies = spec.schedule.varies();
    let step = if adam || varies {
        let s = g.add_state(STEP, TensorType::f32(vec![]), Init::Zeros)?;
        states.push(s);
        Some(s)
    } else {
        None
    };
    let bias_table = if adam {
        let (beta1, beta2) = (spec.beta(key::BETA1, 0.9), spec.beta(key::BETA2, 0.999));
        let rows = bias_correction_rows(beta1, beta2) as usize;
        let ty = TensorType::f32(vec![rows, 2]);
        let t = g.add_state(BIAS_TABLE, ty, Init::BiasCorrections { beta1, beta2 })?;
        states.push(t);
        Some((t, rows))
    } else {
        None
    };
    let lr_table = if varies {
        let table = spec.table();
        let rows = table.steps() as usize + 1;
        let t = g.add_state(
            LR_TABLE,
            TensorType::f32(vec![rows, 1]),
            Init::Schedule(table),
        )?;
        states.push(t);
        Some((t, rows))
    } else {
        None
    };

    // 2. Gradients.
    let grad_names: Vec<String> = names.iter().map(|n| format!("{n}.grad")).collect();
    let mut grad_inputs = vec![loss];
    grad_inputs.extend(&params);
    let grads = g.add_node(Op::Grad, &grad_inputs, Attrs::new(), Some(&grad_names))?;

    // Accumulation: the summed gradients and the micro-batch counter persist between runs.
    let accumulation = if spec.accumulate > 1 {
        Some(accumulate(g, &params, &names, &grads, spec.accumulate)?)
    } else {
        None
    };
    let means = accumulation
        .as_ref()
        .map_or(grads.clone(), |a| a.means.clone());

    // 3. Clipping.
    let (applied, grad_norm) = match spec.clip_norm {
        Some(clip) => {
            let (applied, norm) = clip_by_global_norm(g, &means, &names, clip)?;
            (applied, Some(norm))
        }
        None => (means.clone(), None),
    };

    // 4. The step counter, 1 on the first run.
    let step_next = match step {
        Some(s) => {
            let one = g.constant(1.0)?;
            let next = [STEP_NEXT.to_string()];
            Some(g.add_node(Op::Add, &[s, one], Attrs::new(), Some(&next))?[0])
        }
        None => None,
    };

    // The step's learning rate and bias corrections, read from their tables (exact: each
    // entry is the f64 value rounded once).
    let lr = match (lr_table, step) {
        (Some((table, rows)), Some(s)) => {
            let row = embedding(g, table, s, rows)?;
            Some(
                g.add_node(
                    Op::Reshape,
                    &[row],
                    Attrs::new().and(key::SHAPE, Vec::<usize>::new()),
                    Some(&[LR.to_string()]),
                )?[0],
            )
        }
        _ if adam => Some(
            g.add_node(
                Op::Constant,
                &[],
                Attrs::new().and(key::VALUE, spec.lr()),
                Some(&[LR.to_string()]),
            )?[0],
        ),
        _ => None,
    };
    let bias = match (bias_table, step_next) {
        (Some((table, rows)), Some(t)) => {
            let row = embedding(g, table, t, rows)?;
            g.rename(row, BIAS.to_string())?;
            Some(row)
        }
        _ => None,
    };
    let mut attrs = spec.attrs.clone();
    if lr.is_some() {
        attrs.remove(key::LR.name);
    }
    // the scaled group's rate: the step's rate times the factor, or the attribute's
    let scaled_lr = match (&spec.lr_scaled, lr) {
        (Some(group), Some(lr)) => {
            let factor = g.constant(group.scale)?;
            Some(
                g.add_node(
                    Op::Mul,
                    &[lr, factor],
                    Attrs::new(),
                    Some(&[LR_SCALED.to_string()]),
                )?[0],
            )
        }
        _ => None,
    };

    // 5. The updates.
    let mut results = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let mut inputs = vec![params[i], applied[i]];
        inputs.extend(&per_param[i]);
        if adam {
            inputs.extend(step_next);
        }
        let scaled = (spec.lr_scaled.as_ref()).filter(|group| group.params.contains(&params[i]));
        inputs.extend(if scaled.is_some() {
            scaled_lr.or(lr)
        } else {
            lr
        });
        inputs.extend(bias);
        let mut result_names = vec![format!("{name}.next")];
        result_names.extend(suffixes.iter().map(|(s, _)| format!("{name}.{s}.next")));
        let mut attrs = attrs.clone();
        if spec.no_decay.excludes(g, params[i]) {
            attrs.set(key::WEIGHT_DECAY.name, Attr::Float(0.0));
        }
        if let (Some(group), None) = (scaled, lr) {
            attrs.set(key::LR.name, Attr::Float(spec.lr() * group.scale));
        }
        let out = g.add_node(spec.optimizer.op(), &inputs, attrs, Some(&result_names))?;
        results.push(out);
    }

    // 6. Assigns (with accumulation, only where this run updates).
    let assign = |g: &mut Graph, target: ValueId, new: ValueId| -> Result<(), GraphError> {
        let new = match &accumulation {
            Some(a) => {
                let name = format!("{}.after", g.name_of(target));
                g.add_node(
                    Op::Where,
                    &[a.apply, new, target],
                    Attrs::new(),
                    Some(&[name]),
                )?[0]
            }
            None => new,
        };
        g.add_assign(target, new)
    };
    for (i, out) in results.iter().enumerate() {
        assign(g, params[i], out[0])?;
        for (&state, &new) in per_param[i].iter().zip(&out[1..]) {
            assign(g, state, new)?;
        }
    }
    if let (Some(s), Some(next)) = (step, step_next) {
        assign(g, s, next)?;
    }
    if let Some(a) = &accumulation {
        for (i, &sum) in a.sums.iter().enumerate() {
            g.add_assign(sum, a.sums_after[i])?;
        }
        g.add_assign(a.micro, a.micro_after)?;
    }
    if let Some(a) = &accumulation {
        states.extend(&a.sums);
        states.push(a.micro);
    }
    Ok(TrainStep {
        params,
        grads,
        applied,
        grad_norm,
        states,
        step,
        new_params: results.iter().map(|r| r[0]).collect(),
    })
}

/// The values of gradient accumulation over `k` micro-batches.
struct Accumulation {
    /// `{p}.grad.sum` (states) and what they become after this run.
    sums: Vec<ValueId>,
    sums_after: Vec<ValueId>,
    /// `{p}.grad.mean`: the mean of the micro-batches' gradients, which the update applies.
    means: Vec<ValueId>,
    micro: ValueId,
    micro_after: ValueId,
    /// `train.apply`: 1 on every `k`-th run, else 0.
    apply: ValueId,
}

/// `{p}.grad.sum` states and `train.micro`; `{p}.grad.acc = {p}.grad.sum + {p}.grad`,
/// `{p}.grad.mean = {p}.grad.acc / k`, `train.micro.next = train.micro + 1`,
/// `train.apply = eq(train.micro.next, k)`, and what the sums and the counter become:
/// 0 where this run applies, else `{p}.grad.acc` and `train.micro.next`.
fn accumulate(
    g: &mut Graph,
    params: &[ValueId],
    names: &[String],
    grads: &[ValueId],
    k: u64,
) -> Result<Accumulation, GraphError> {
    let mut sums = Vec::new();
    for (&p, name) in params.iter().zip(names) {
        let ty = g.ty(p).clone();
        sums.push(g.add_state(format!("{name}.grad.sum"), ty, Init::Zeros)?);
    }
    let micro = g.add_state(MICRO, TensorType::f32(vec![]), Init::Zeros)?;
    let mut accs = Vec::new();
    let mut means = Vec::new();
    for ((&sum, &grad), name) in sums.iter().zip(grads).zip(names) {
        let acc = [format!("{name}.grad.acc")];
        let acc = g.add_node(Op::Add, &[sum, grad], Attrs::new(), Some(&acc))?[0];
        let share = g.constant(1.0 / k as f64)?;
        let mean = [format!("{name}.grad.mean")];
        means.push(g.add_node(Op::Mul, &[acc, share], Attrs::new(), Some(&mean))?[0]);
        accs.push(acc);
    }
    let one = g.constant(1.0)?;
    let next = g.add_node(
        Op::Add,
        &[micro, one],
        Attrs::new(),
        Some(&[MICRO_NEXT.into()]),
    )?[0];
    let count = g.constant(k as f64)?;
    let apply = g.add_node(Op::Eq, &[next, count], Attrs::new(), Some(&[APPLY.into()]))?[0];
    let zero = g.constant(0.0)?;
    let mut sums_after = Vec::new();
    for (&acc, name) in accs.iter().zip(names) {
        let after = [format!("{name}.grad.sum.after")];
        sums_after.push(g.add_node(Op::Where, &[apply, zero, acc], Attrs::new(), Some(&after))?[0]);
    }
    let micro_after = g.add_node(
        Op::Where,
        &[apply, zero, next],
        Attrs::new(),
        Some(&["train.micro.after".into()]),
    )?[0];
    Ok(Accumulation {
        sums,
        sums_after,
        means,
        micro,
        micro_after,
        apply,
    })
}

/// Row `min(max(step, 0), rows − 1)` of `table` (a step counter past the table reads its
/// last row, whose value no longer changes).
fn embedding(
    g: &mut Graph,
    table: ValueId,
    step: ValueId,
    rows: usize,
) -> Result<ValueId, GraphError> {
    let last = g.constant((rows - 1) as f64)?;
    let capped = g.add(Op::Minimum, &[step, last], Attrs::new())?;
    let zero = g.constant(0.0)?;
    let row = g.add(Op::Maximum, &[capped, zero], Attrs::new())?;
    let id = g.add(Op::Cast, &[row], Attrs::new().and(key::DTYPE, DType::I32))?;
    g.add(Op::Embedding, &[table, id], Attrs::new())
}

/// `train.grad_norm`, `train.clip_scale` and `{p}.grad.clipped` for every gradient; returns
/// the clipped gradients and the norm. Built in the order the parser builds the printed text,
/// so the sums print nested: `sqrt(add(sum(square(a.grad)), sum(square(b.grad))))`.
fn clip_by_global_norm(
    g: &mut Graph,
    grads: &[ValueId],
    names: &[String],
    clip: f64,
) -> Result<(Vec<ValueId>, ValueId), GraphError> {
    let mut total: Option<ValueId> = None;
    for &grad in grads {
        let square = g.add(Op::Square, &[grad], Attrs::new())?;
        let sum = g.add(Op::Sum, &[square], Attrs::new())?;
        total = Some(match total {
            Some(t) => g.add(Op::Add, &[t, sum], Attrs::new())?,
            None => sum,
        });
    }
    let total = total.expect("at least one gradient");
    let norm = g.add_node(
        Op::Sqrt,
        &[total],
        Attrs::new(),
        Some(&[GRAD_NORM.to_string()]),
    )?[0];
    let clip = g.constant(clip)?;
    let eps = g.constant(CLIP_EPS)?;
    let denominator = g.add(Op::Add, &[norm, eps], Attrs::new())?;
    let ratio = g.add(Op::Div, &[clip, denominator], Attrs::new())?;
    let one = g.constant(1.0)?;
    let scale = g.add_node(
        Op::Minimum,
        &[ratio, one],
        Attrs::new(),
        Some(&[CLIP_SCALE.to_string()]),
    )?[0];
    let mut clipped = Vec::with_capacity(grads.len());
    for (&grad, name) in grads.iter().zip(names) {
        let result = [format!("{name}.grad.clipped")];
        clipped.push(g.add_node(Op::Mul, &[grad, scale], Attrs::new(), Some(&result))?[0]);
    }
    Ok((clipped, norm))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph() -> (Graph, ValueId) {
        let mut g = Graph::new("t");
        let w = g
            .add_param("w", TensorType::f32(vec![2, 3]), Init::Ones)
            .unwrap();
        g.add_param("b", TensorType::f32(vec![3]), Init::Zeros)
            .unwrap();
        let loss = g.add(Op::Sum, &[w], Attrs::new()).unwrap();
        (g, loss)
    }

    #[test]
    fn adamw_names_and_assigns() {
        let (mut g, loss) = graph();
        let spec = TrainSpec::new(Optimizer::AdamW, Attrs::new());
        let step = add_training(&mut g, loss, &spec).unwrap();
        for name in [
            "w.m", "w.v", "b.m", "b.v", STEP, "w.grad", "b.grad", STEP_NEXT, "w.next", "w.m.next",
            "b.v.next",
        ] {
            assert!(g.lookup(name).is_some(), "{name}");
        }
        // the moments, the step counter and the bias-correction table (never assigned)
        assert_eq!(step.states.len(), 6);
        assert_eq!(g.assigns.len(), 7);
    }

    #[test]
    fn errors_leave_the_graph_unchanged() {
        let (mut g, loss) = graph();
        let before = g.clone();
        let spec = TrainSpec::new(Optimizer::Sgd, Attrs::new());
        assert!(matches!(
            add_training(&mut g, loss, &spec),
            Err(TrainError::Optimizer(_))
        ));
        let w = g.lookup("w").unwrap();
        let mut spec = TrainSpec::new(Optimizer::Adam, Attrs::new());
        spec.params = Some(vec![w, w]);
        assert!(matches!(
            add_training(&mut g, loss, &spec),
            Err(TrainError::DuplicateParam { index: 1, .. })
        ));
        assert_eq!(g, before);
    }

    #[test]
    fn train_names() {
        assert!(is_train_name("train.step"));
        assert!(is_train_name("w1.grad"));
        assert!(is_train_name("layer.0.weight.m.next"));
        assert!(!is_train_name(".grad"));
        assert!(!is_train_name("grad"));
        assert!(!is_train_name("w1"));
    }
}
