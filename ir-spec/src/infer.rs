//! Shape and dtype rules: one function per op family, dispatched by an exhaustive match.
//!
//! [`infer`] checks a node's operand count and attributes against the op table, fills in every
//! default (including the derived ones, such as `scale` of `attention`), normalizes negative axes,
//! and returns the types of the node's results. Errors say which operand or attribute is at fault
//! so that the parser can put the caret there.

use crate::attr::key;
use crate::attr::{Attr, Attrs, Key, Reduction, kind};
use crate::op::{AttrDefault, AttrKind, Op, OpSpec};
use crate::types::{DType, Shape, TensorType, broadcast_shapes, broadcasts_to};

/// Which part of a node an error is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blame {
    /// The op as a whole (its name in the text).
    Op,
    /// The operand at this position.
    Operand(usize),
    /// The attribute of this name.
    Attr(String),
}

/// A node whose operands or attributes break its op's rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TypeError {
    pub blame: Blame,
    pub message: String,
    pub hint: Option<String>,
}

impl TypeError {
    pub fn new(blame: Blame, message: impl Into<String>) -> TypeError {
        TypeError {
            blame,
            message: message.into(),
            hint: None,
        }
    }

    pub fn hint(mut self, hint: impl Into<String>) -> TypeError {
        self.hint = Some(hint.into());
        self
    }
}

type Result<T> = std::result::Result<T, TypeError>;

fn operand_err(i: usize, message: impl Into<String>) -> TypeError {
    TypeError::new(Blame::Operand(i), message)
}

fn attr_err(name: &str, message: impl Into<String>) -> TypeError {
    TypeError::new(Blame::Attr(name.to_string()), message)
}

/// Checks a node and returns its result types. `attrs` comes back complete and normalized.
pub fn infer(op: Op, inputs: &[TensorType], attrs: &mut Attrs) -> Result<Vec<TensorType>> {
    let spec = op.spec();
    check_operand_count(spec, inputs.len())?;
    check_attrs(spec, attrs)?;
    let mut cx = Cx {
        spec,
        inputs,
        attrs,
    };
    let out = cx.rule(op)?;
    for t in &out {
        if t.checked_size_bytes().is_none() {
            return Err(TypeError::new(
                Blame::Op,
                format!("the result {t} is too large: its size in bytes does not fit in 64 bits"),
            ));
        }
    }
    Ok(out)
}

/// The largest stride, padding, dilation, kernel extent or slice step (2^31 - 1): kernels index
/// with 32-bit arithmetic (a step or stride past the extent takes one element anyway).
pub const MAX_WINDOW_ATTR: i64 = i32::MAX as i64;

fn check_operand_count(spec: &OpSpec, n: usize) -> Result<()> {
    let (min, max) = spec.operand_range();
    if n >= min && max.is_none_or(|m| n <= m) {
        return Ok(());
    }
    let names: Vec<String> = spec
        .operands
        .iter()
        .map(|o| match o.arity {
            crate::op::Arity::One => o.name.to_string(),
            crate::op::Arity::Optional => format!("[{}]", o.name),
            crate::op::Arity::Variadic => format!("{}...", o.name),
        })
        .collect();
    let expected = match max {
        Some(m) if m == min => format!("{min}"),
        Some(m) => format!("{min} to {m}"),
        None => format!("at least {min}"),
    };
    Err(TypeError::new(
        Blame::Op,
        format!("`{}` takes {expected} operand(s), got {n}", spec.name),
    )
    .hint(format!("usage: {}({})", spec.name, names.join(", "))))
}

/// Rejects unknown attributes and wrong kinds; fills static defaults.
fn check_attrs(spec: &OpSpec, attrs: &mut Attrs) -> Result<()> {
    for (name, value) in attrs.iter() {
        let Some(aspec) = spec.attr(name) else {
            let known: Vec<&str> = spec.attrs.iter().map(|a| a.name).collect();
            let hint = if known.is_empty() {
                format!("`{}` takes no attributes", spec.name)
            } else {
                format!("`{}` takes: {}", spec.name, known.join(", "))
            };
            return Err(attr_err(
                name,
                format!("unknown attribute `{name}` for `{}`", spec.name),
            )
            .hint(hint));
        };
        check_attr_kind(name, aspec.kind, value)?;
    }
    let mut normalized = Vec::new();
    for aspec in spec.attrs {
        match attrs.get(aspec.name) {
            Some(value) => {
                // A single int for an n-list attribute means "the same on every axis".
                if let (AttrKind::Ints(n), Attr::Int(v)) = (aspec.kind, value)
                    && n > 0
                {
                    normalized.push((aspec.name, Attr::ints(&vec![*v; n])));
                }
                if let (AttrKind::Float, Attr::Int(v)) = (aspec.kind, value) {
                    normalized.push((aspec.name, Attr::Float(*v as f64)));
                }
            }
            None => match aspec.default {
                AttrDefault::Required => {
                    return Err(TypeError::new(
                        Blame::Op,
                        format!("`{}` needs the attribute `{}`", spec.name, aspec.name),
                    )
                    .hint(format!("add `{}=...`", aspec.name)));
                }
                AttrDefault::Derived(_) => {}
                other => normalized.push((aspec.name, other.value().expect("static default"))),
            },
        }
    }
    for (name, value) in normalized {
        attrs.set(name, value);
    }
    Ok(())
}

fn check_attr_kind(name: &str, kind: AttrKind, value: &Attr) -> Result<()> {
    let ok = match kind {
        AttrKind::Int => matches!(value, Attr::Int(_)),
        AttrKind::Float => matches!(value, Attr::Float(_) | Attr::Int(_)),
        AttrKind::Bool => matches!(value, Attr::Bool(_)),
        AttrKind::Str(allowed) => match value {
            Attr::Str(s) if allowed.contains(&s.as_str()) => true,
            Attr::Str(s) => {
                return Err(attr_err(name, format!("`{name}` cannot be {s:?}"))
                    .hint(format!("one of: {}", quoted(allowed))));
            }
            _ => false,
        },
        AttrKind::Ints(n) => match value {
            Attr::Int(_) => n > 0,
            Attr::List(items) => {
                if !items.iter().all(|a| matches!(a, Attr::Int(_))) {
                    return Err(attr_err(name, format!("`{name}` must be a list of ints")));
                }
                if n > 0 && items.len() != n {
                    return Err(attr_err(
                        name,
                        format!("`{name}` needs {n} entries, got {}", items.len()),
                    ));
                }
                true
            }
            _ => false,
        },
        AttrKind::DType => match value {
            Attr::Str(s) if DType::from_name(s).is_some() => true,
            Attr::Str(s) => {
                return Err(attr_err(name, format!("unknown dtype {s:?}"))
                    .hint(format!("one of: {}", quoted(&DType::ALL.map(DType::name)))));
            }
            _ => false,
        },
    };
    if ok {
        Ok(())
    } else {
        let expected = match kind {
            AttrKind::Int => "an int".to_string(),
            AttrKind::Float => "a number".to_string(),
            AttrKind::Bool => "true or false".to_string(),
            AttrKind::Str(allowed) => format!("one of {}", quoted(allowed)),
            AttrKind::Ints(0) => "a list of ints".to_string(),
            AttrKind::Ints(n) => format!("a list of {n} ints (or one int)"),
            AttrKind::DType => "a dtype name such as \"f32\"".to_string(),
        };
        Err(attr_err(
            name,
            format!(
                "`{name}` must be {expected}, got the {} {value}",
                value.kind_name()
            ),
        ))
    }
}

fn quoted(items: &[&str]) -> String {
    items
        .iter()
        .map(|s| format!("{s:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Normalizes an axis of a tensor of rank `rank` (negative counts from the end).
fn norm_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

struct Cx<'a> {
    spec: &'static OpSpec,
    inputs: &'a [TensorType],
    attrs: &'a mut Attrs,
}

impl Cx<'_> {
    fn name(&self) -> &'static str {
        self.spec.name
    }

    fn input(&self, i: usize) -> &TensorType {
        &self.inputs[i]
    }

    fn expect_dtype(&self, i: usize, dtype: DType) -> Result<()> {
        let t = self.input(i);
        if t.dtype == dtype {
            return Ok(());
        }
        let slot = self.spec.operand_slot(i).name;
        let mut err = operand_err(
            i,
            format!("`{}` needs {dtype} for `{slot}`, got {t}", self.name()),
        );
        if dtype == DType::F32 {
            err = err.hint("convert with cast(x, dtype=\"f32\")");
        } else {
            err = err.hint("convert with cast(x, dtype=\"i32\")");
        }
        Err(err)
    }

    /// The float dtype that the operands `ops` compute in (IR.md, "Element types"): each must be
    /// a float; the tensors among them (rank 1 or more) must share one float dtype, which the
    /// rank-0 floats take on (scalars do not widen a computation, as in PyTorch); operands all
    /// of rank 0 compute in f16 only if every one is f16.
    fn float_dtype(&self, ops: &[usize]) -> Result<DType> {
        for &i in ops {
            let t = self.input(i);
            if !t.dtype.is_float() {
                let slot = self.spec.operand_slot(i).name;
                return Err(operand_err(
                    i,
                    format!(
                        "`{}` needs a float (f32 or f16) for `{slot}`, got {t}",
                        self.name()
                    ),
                )
                .hint("convert with cast(x, dtype=\"f32\")"));
            }
        }
        let mut tensors = ops.iter().copied().filter(|&i| !self.input(i).is_scalar());
        if let Some(first) = tensors.next() {
            let dtype = self.input(first).dtype;
            if let Some(other) = tensors.find(|&i| self.input(i).dtype != dtype) {
                return Err(operand_err(
                    other,
                    format!(
                        "`{}` mixes {dtype} and {} tensors ({} and {})",
                        self.name(),
                        self.input(other).dtype,
                        self.input(first),
                        self.input(other)
                    ),
                )
                .hint(format!("cast one of them, e.g. cast(x, dtype=\"{dtype}\")")));
            }
            return Ok(dtype);
        }
        Ok(if ops.iter().all(|&i| self.input(i).dtype == DType::F16) {
            DType::F16
        } else {
            DType::F32
        })
    }

    fn expect_rank(&self, i: usize, rank: usize, layout: &str) -> Result<()> {
        let t = self.input(i);
        if t.rank() == rank {
            return Ok(());
        }
        let slot = self.spec.operand_slot(i).name;
        Err(operand_err(
            i,
            format!(
                "`{}` needs `{slot}` of rank {rank} ({layout}), got {t}",
                self.name()
            ),
        ))
    }

    fn expect_shape(&self, i: usize, shape: &[usize], why: &str) -> Result<()> {
        let t = self.input(i);
        if t.shape == shape {
            return Ok(());
        }
        let slot = self.spec.operand_slot(i).name;
        let expected = TensorType::new(t.dtype, shape.to_vec());
        Err(operand_err(
            i,
            format!("`{slot}` must be {expected} ({why}), got {t}"),
        ))
    }

    /// An int attribute as written (before normalization); its kind was checked.
    fn int<K>(&self, key: Key<K>) -> i64 {
        self.attrs
            .get(key.name)
            .and_then(Attr::as_int)
            .expect("checked kind")
    }

    /// An int-list attribute as written; its kind was checked and single ints expanded.
    fn ints<K>(&self, key: Key<K>) -> Vec<i64> {
        self.attrs
            .get(key.name)
            .and_then(Attr::as_ints)
            .expect("checked kind")
    }

    fn axis_attr<K>(&mut self, key: Key<K>, rank: usize) -> Result<usize> {
        let name = key.name;
        let axis = self.int(key);
        let a = norm_axis(axis, rank).ok_or_else(|| {
            attr_err(
                name,
                format!("{name}={axis} is out of range for rank {rank}"),
            )
            .hint(format!(
                "valid axes are {} to {}",
                -(rank as i64),
                rank as i64 - 1
            ))
        })?;
        self.attrs.set(name, Attr::Int(a as i64));
        Ok(a)
    }

    fn positive_ints<K>(&self, key: Key<K>, min: i64) -> Result<Vec<usize>> {
        let name = key.name;
        let values = self.ints(key);
        if let Some(v) = values.iter().find(|&&v| v < min) {
            return Err(attr_err(
                name,
                format!("`{name}` entries must be at least {min}, got {v}"),
            ));
        }
        Ok(values.into_iter().map(|v| v as usize).collect())
    }

    /// A window attribute (stride, padding, dilation, kernel): entries from `min` to
    /// [`MAX_WINDOW_ATTR`], so that kernels can index with 32-bit arithmetic.
    fn window_ints<K>(&self, key: Key<K>, min: i64) -> Result<Vec<usize>> {
        let name = key.name;
        let values = self.positive_ints(key, min)?;
        if let Some(v) = values.iter().find(|&&v| v as i64 > MAX_WINDOW_ATTR) {
            return Err(attr_err(
                name,
                format!("`{name}` entries must be at most {MAX_WINDOW_ATTR} (2^31 - 1), got {v}"),
            ));
        }
        Ok(values)
    }

    fn broadcast_all(&self, indices: &[usize]) -> Result<Shape> {
        let mut shape: Shape = Vec::new();
        for &i in indices {
            shape = broadcast_shapes(&shape, &self.input(i).shape).ok_or_else(|| {
                operand_err(
                    i,
                    format!(
                        "cannot broadcast {} with {}",
                        self.input(i),
                        TensorType::new(self.input(i).dtype, shape.clone())
                    ),
                )
                .hint("numpy rules: align trailing axes; each pair must be equal or 1")
            })?;
        }
        Ok(shape)
    }

    fn rule(&mut self, op: Op) -> Result<Vec<TensorType>> {
        use Op::*;
        let one = |t: TensorType| Ok(vec![t]);
        match op {
            Neg | Abs | Exp | Log | Sqrt | Rsqrt | Reciprocal | Square | Relu | Sigmoid | Tanh
            | Silu | Sin | Cos | Gelu => {
                self.float_dtype(&[0])?;
                one(self.input(0).clone())
            }
            Add | Sub | Mul | Div | Pow | Maximum | Minimum => {
                let dtype = self.float_dtype(&[0, 1])?;
                one(TensorType::new(dtype, self.broadcast_all(&[0, 1])?))
            }
            Eq | Lt | Le | Gt | Ge => {
                let (a, b) = (self.input(0), self.input(1));
                let floats = a.dtype.is_float() && b.dtype.is_float();
                if floats {
                    self.float_dtype(&[0, 1])?;
                } else if a.dtype != b.dtype {
                    return Err(operand_err(
                        1,
                        format!(
                            "`{}` compares values of one dtype, got {} and {}",
                            self.name(),
                            a.dtype,
                            b.dtype
                        ),
                    )
                    .hint("cast one side; numeric literals are f32"));
                }
                one(TensorType::f32(self.broadcast_all(&[0, 1])?))
            }
            Where => {
                let (a, b) = (self.input(1), self.input(2));
                if a.dtype.is_float() && b.dtype.is_float() {
                    let dtype = self.float_dtype(&[1, 2])?;
                    return one(TensorType::new(dtype, self.broadcast_all(&[0, 1, 2])?));
                }
                if a.dtype != b.dtype {
                    return Err(operand_err(
                        2,
                        format!(
                            "`where` needs `a` and `b` of one dtype, got {} and {}",
                            a.dtype, b.dtype
                        ),
                    ));
                }
                let dtype = a.dtype;
                one(TensorType::new(dtype, self.broadcast_all(&[0, 1, 2])?))
            }
            Sum | Mean | Max | Min | Logsumexp => {
                let dtype = self.float_dtype(&[0])?;
                let shape = self.input(0).shape.clone();
                let axes = self.reduce_axes(shape.len())?;
                let keepdim = self.attrs.of(key::KEEPDIM);
                one(TensorType::new(
                    dtype,
                    reduced_shape(&shape, &axes, keepdim),
                ))
            }
            Argmax => {
                self.float_dtype(&[0])?;
                let shape = self.input(0).shape.clone();
                let axis = self.axis_attr(key::AXIS, shape.len())?;
                let keepdim = self.attrs.of(key::KEEPDIM);
                one(TensorType::i32(reduced_shape(&shape, &[axis], keepdim)))
            }
            Cumsum => {
                self.expect_dtype(0, DType::F32)?;
                let t = self.input(0).clone();
                if t.is_scalar() {
                    return Err(operand_err(
                        0,
                        format!("`cumsum` needs at least one axis, got {t}"),
                    ));
                }
                self.axis_attr(key::AXIS, t.rank())?;
                one(t)
            }
            Reshape => self.reshape(),
            Permute => {
                let t = self.input(0).clone();
                let perm = self.ints(key::PERM);
                let mut seen = vec![false; t.rank()];
                let mut normalized = Vec::with_capacity(perm.len());
                if perm.len() != t.rank() {
                    return Err(attr_err(
                        "perm",
                        format!("`perm` has {} entries for rank {}", perm.len(), t.rank()),
                    ));
                }
                for &p in &perm {
                    let a = norm_axis(p, t.rank())
                        .filter(|&a| !seen[a])
                        .ok_or_else(|| {
                            attr_err(
                                "perm",
                                format!("`perm` {perm:?} is not a permutation of 0..{}", t.rank()),
                            )
                        })?;
                    seen[a] = true;
                    normalized.push(a as i64);
                }
                self.attrs.set(key::PERM.name, Attr::ints(&normalized));
                let shape = normalized
                    .iter()
                    .map(|&a| t.shape[a as usize])
                    .collect::<Vec<_>>();
                one(TensorType::new(t.dtype, shape))
            }
            Transpose => {
                let t = self.input(0).clone();
                let d0 = self.axis_attr(key::DIM0, t.rank())?;
                let d1 = self.axis_attr(key::DIM1, t.rank())?;
                let mut shape = t.shape.clone();
                shape.swap(d0, d1);
                one(TensorType::new(t.dtype, shape))
            }
            BroadcastTo => {
                let t = self.input(0).clone();
                let shape = self.positive_ints(key::SHAPE, 1)?;
                if !broadcasts_to(&t.shape, &shape) {
                    return Err(attr_err(
                        "shape",
                        format!("{t} does not broadcast to {:?}", shape),
                    )
                    .hint("numpy rules: align trailing axes; each input extent must equal the target or be 1"));
                }
                one(TensorType::new(t.dtype, shape))
            }
            Unsqueeze => {
                let t = self.input(0).clone();
                let a = self.axis_attr(key::AXIS, t.rank() + 1)?;
                let mut shape = t.shape.clone();
                shape.insert(a, 1);
                one(TensorType::new(t.dtype, shape))
            }
            Squeeze => {
                let t = self.input(0).clone();
                let a = self.axis_attr(key::AXIS, t.rank())?;
                if t.shape[a] != 1 {
                    return Err(attr_err(
                        "axis",
                        format!(
                            "cannot squeeze axis {a} of {t}: its extent is {}, not 1",
                            t.shape[a]
                        ),
                    ));
                }
                let mut shape = t.shape.clone();
                shape.remove(a);
                one(TensorType::new(t.dtype, shape))
            }
            Slice => self.slice(),
            Concat => {
                let first = self.input(0).clone();
                let axis = self.axis_attr(key::AXIS, first.rank())?;
                let mut shape = first.shape.clone();
                shape[axis] = 0;
                for (i, t) in self.inputs.iter().enumerate() {
                    let same_rest = t.rank() == first.rank()
                        && t.shape
                            .iter()
                            .zip(&first.shape)
                            .enumerate()
                            .all(|(d, (a, b))| d == axis || a == b);
                    if t.dtype != first.dtype || !same_rest {
                        return Err(operand_err(
                            i,
                            format!(
                                "`concat` along axis {axis} needs matching types except on that axis: {first} and {t}"
                            ),
                        ));
                    }
                    shape[axis] = shape[axis].checked_add(t.shape[axis]).ok_or_else(|| {
                        operand_err(i, format!("`concat` along axis {axis} is too large"))
                    })?;
                }
                one(TensorType::new(first.dtype, shape))
            }
            Cast => {
                let dtype = self.attrs.of(key::DTYPE);
                one(TensorType::new(dtype, self.input(0).shape.clone()))
            }
            Matmul => self.matmul(),
            Softmax | LogSoftmax => {
                self.float_dtype(&[0])?;
                let t = self.input(0).clone();
                if t.is_scalar() {
                    return Err(operand_err(
                        0,
                        format!("`{}` needs at least one axis, got {t}", self.name()),
                    ));
                }
                self.axis_attr(key::AXIS, t.rank())?;
                one(t)
            }
            LayerNorm | RmsNorm => {
                let all: Vec<usize> = (0..self.inputs.len()).collect();
                let dtype = self.float_dtype(&all)?;
                let t = TensorType::new(dtype, self.input(0).shape.clone());
                let Some(&last) = t.shape.last() else {
                    return Err(operand_err(
                        0,
                        format!("`{}` normalizes the last axis; got a scalar", self.name()),
                    ));
                };
                for i in 1..self.inputs.len() {
                    self.expect_shape(i, &[last], "the extent of the last axis of x")?;
                }
                self.positive_eps()?;
                one(t)
            }
            GroupNorm => {
                let dtype = self.float_dtype(&[0, 1, 2])?;
                let t = TensorType::new(dtype, self.input(0).shape.clone());
                if t.rank() < 2 {
                    return Err(operand_err(
                        0,
                        format!("`group_norm` needs x of shape [N, C, ...], got {t}"),
                    ));
                }
                let c = t.shape[1];
                let groups = self.int(key::GROUPS);
                if groups < 1 || !c.is_multiple_of(groups as usize) {
                    return Err(attr_err(
                        "groups",
                        format!("groups={groups} must be at least 1 and divide the {c} channels"),
                    ));
                }
                self.expect_shape(1, &[c], "one per channel")?;
                self.expect_shape(2, &[c], "one per channel")?;
                self.positive_eps()?;
                one(t)
            }
            Conv2d => self.conv2d(),
            MaxPool2d | AvgPool2d => self.pool2d(),
            Embedding => {
                let dtype = self.float_dtype(&[0])?;
                self.expect_dtype(1, DType::I32)?;
                let table = self.input(0);
                if table.rank() != 2 {
                    return Err(operand_err(
                        0,
                        format!("`embedding` needs a table of shape [V, D], got {table}"),
                    ));
                }
                let mut shape = self.input(1).shape.clone();
                shape.push(table.shape[1]);
                one(TensorType::new(dtype, shape))
            }
            CrossEntropy => {
                let dtype = self.float_dtype(&[0])?;
                self.expect_dtype(1, DType::I32)?;
                self.expect_rank(0, 2, "[N, C]")?;
                let n = self.input(0).shape[0];
                self.expect_shape(1, &[n], "one class index per row of logits")?;
                one(TensorType::new(dtype, self.loss_shape(vec![n])))
            }
            MseLoss => {
                let dtype = self.float_dtype(&[0, 1])?;
                let shape = self.input(0).shape.clone();
                self.expect_shape(1, &shape, "the same shape as `a`")?;
                one(TensorType::new(dtype, self.loss_shape(shape)))
            }
            Conv2dGradInput => {
                let input = self.positive_ints(key::INPUT_SHAPE, 1)?;
                let dtype = self.float_dtype(&[0, 1])?;
                let w = self.input(1).shape.clone();
                self.check_conv_groups(&input, &w)?;
                let forward = self.conv2d_output(&input, &w)?;
                self.expect_shape(0, &forward, "the conv2d output for input_shape")?;
                one(TensorType::new(dtype, input))
            }
            Conv2dGradWeight => {
                let weight = self.positive_ints(key::WEIGHT_SHAPE, 1)?;
                let dtype = self.float_dtype(&[0, 1])?;
                self.expect_rank(0, 4, "[N, C, H, W]")?;
                let x = self.input(0).shape.clone();
                self.check_conv_groups(&x, &weight)?;
                let forward = self.conv2d_output(&x, &weight)?;
                self.expect_shape(1, &forward, "the conv2d output for x and weight_shape")?;
                one(TensorType::new(dtype, weight))
            }
            MaxPool2dGrad => {
                let dtype = self.float_dtype(&[0, 1])?;
                self.expect_rank(0, 4, "[N, C, H, W]")?;
                let x = self.input(0).shape.clone();
                let forward = self.pool_output(&x)?;
                self.expect_shape(1, &forward, "the max_pool2d output of x")?;
                one(TensorType::new(dtype, x))
            }
            AvgPool2dGrad => {
                let input = self.positive_ints(key::INPUT_SHAPE, 1)?;
                let dtype = self.float_dtype(&[0])?;
                let forward = self.pool_output(&input)?;
                self.expect_shape(0, &forward, "the avg_pool2d output for input_shape")?;
                one(TensorType::new(dtype, input))
            }
            EmbeddingGrad => {
                let dtype = self.float_dtype(&[0])?;
                self.expect_dtype(1, DType::I32)?;
                let (dy, ids) = (self.input(0).clone(), self.input(1).clone());
                let rows = self.int(key::NUM_EMBEDDINGS);
                if rows < 1 {
                    return Err(attr_err(
                        "num_embeddings",
                        "num_embeddings must be at least 1",
                    ));
                }
                if dy.rank() != ids.rank() + 1 || dy.shape[..ids.rank()] != ids.shape[..] {
                    return Err(operand_err(
                        0,
                        format!("`dy` must be ids.shape + [D] = {ids}+[D], got {dy}"),
                    ));
                }
                one(TensorType::new(
                    dtype,
                    vec![rows as usize, dy.shape[ids.rank()]],
                ))
            }
            SliceGrad => {
                let shape = self.positive_ints(key::SHAPE, 1)?;
                let dy = self.input(0).clone();
                let mut cx = Cx {
                    spec: Op::Slice.spec(),
                    inputs: &[TensorType::new(dy.dtype, shape.clone())],
                    attrs: self.attrs,
                };
                let sliced = cx.slice()?;
                if sliced[0] != dy {
                    return Err(operand_err(
                        0,
                        format!(
                            "`dy` must be {} (the slice of {shape:?}), got {dy}",
                            sliced[0]
                        ),
                    ));
                }
                one(TensorType::new(dy.dtype, shape))
            }
            Attention => self.attention(),
            Constant => {
                if self.attrs.of(key::VALUE).is_nan() {
                    return Err(attr_err("value", "a constant cannot be nan"));
                }
                one(TensorType::scalar(DType::F32))
            }
            Iota => {
                let shape = self.positive_ints(key::SHAPE, 1)?;
                self.axis_attr(key::AXIS, shape.len())?;
                one(TensorType::f32(shape))
            }
            Grad => {
                let loss = self.input(0);
                if loss.dtype != DType::F32 || !loss.is_scalar() {
                    return Err(operand_err(
                        0,
                        format!("`grad` needs a scalar f32 loss, got {loss}"),
                    )
                    .hint("reduce the loss first, e.g. with mean(...) or sum(...)"));
                }
                for i in 1..self.inputs.len() {
                    self.float_dtype(&[i])?;
                }
                Ok(self.inputs[1..].to_vec())
            }
            Sgd => self.sgd(),
            Adam | AdamW => {
                let p = self.input(0).clone();
                for i in 0..self.inputs.len() {
                    self.expect_dtype(i, DType::F32)?;
                }
                if self.inputs.len() > 5 {
                    self.expect_shape(5, &[], "the step's learning rate, a scalar")?;
                }
                if self.inputs.len() > 6 {
                    self.expect_shape(6, &[2], "the step's 1 - beta1^t and 1 - beta2^t")?;
                }
                for (i, what) in [
                    (1, "the gradient"),
                    (2, "the first moment"),
                    (3, "the second moment"),
                ] {
                    self.expect_shape(i, &p.shape, &format!("{what} has the param's shape"))?;
                }
                self.expect_shape(4, &[], "the step count t, a scalar")?;
                for b in [key::BETA1, key::BETA2] {
                    let v = self.attrs.of(b);
                    if !(0.0..1.0).contains(&v) {
                        let name = b.name;
                        return Err(attr_err(name, format!("{name}={v} must be in [0, 1)")));
                    }
                }
                self.non_negative(key::LR)?;
                self.non_negative(key::WEIGHT_DECAY)?;
                self.positive_eps()?;
                Ok(vec![p.clone(), p.clone(), p])
            }
        }
    }

    fn non_negative(&self, key: Key<kind::Float>) -> Result<f64> {
        let (name, v) = (key.name, self.attrs.of(key));
        if v >= 0.0 && v.is_finite() {
            Ok(v)
        } else {
            Err(attr_err(
                name,
                format!("{name}={v} must be finite and not negative"),
            ))
        }
    }

    fn positive_eps(&self) -> Result<()> {
        let eps = self.attrs.of(key::EPS);
        if eps > 0.0 && eps.is_finite() {
            Ok(())
        } else {
            Err(attr_err("eps", format!("eps={eps} must be positive")))
        }
    }

    fn loss_shape(&self, unreduced: Shape) -> Shape {
        match self.attrs.of(key::REDUCTION) {
            Reduction::None => unreduced,
            Reduction::Mean | Reduction::Sum => Vec::new(),
        }
    }

    fn reduce_axes(&mut self, rank: usize) -> Result<Vec<usize>> {
        let Some(axes) = self.attrs.get(key::AXES.name).and_then(Attr::as_ints) else {
            let all: Vec<i64> = (0..rank as i64).collect();
            self.attrs.set(key::AXES.name, Attr::ints(&all));
            return Ok((0..rank).collect());
        };
        if axes.is_empty() && rank > 0 {
            return Err(
                attr_err("axes", "`axes` is empty").hint("omit `axes` to reduce over every axis")
            );
        }
        let mut normalized = Vec::new();
        for &a in &axes {
            let n =
                norm_axis(a, rank).ok_or_else(|| {
                    attr_err("axes", format!("axis {a} is out of range for rank {rank}")).hint(
                        format!("valid axes are {} to {}", -(rank as i64), rank as i64 - 1),
                    )
                })?;
            if normalized.contains(&n) {
                return Err(attr_err(
                    "axes",
                    format!("axis {a} appears twice in {axes:?}"),
                ));
            }
            normalized.push(n);
        }
        normalized.sort_unstable();
        self.attrs.set(
            "axes",
            Attr::ints(&normalized.iter().map(|&a| a as i64).collect::<Vec<_>>()),
        );
        Ok(normalized)
    }

    fn reshape(&mut self) -> Result<Vec<TensorType>> {
        let t = self.input(0).clone();
        let target = self.ints(key::SHAPE);
        let mut infer_at = None;
        let mut known = 1usize;
        for (i, &d) in target.iter().enumerate() {
            match d {
                -1 if infer_at.is_none() => infer_at = Some(i),
                -1 => return Err(attr_err("shape", "only one entry of `shape` may be -1")),
                d if d >= 1 => {
                    known = known.checked_mul(d as usize).ok_or_else(|| {
                        attr_err("shape", format!("shape {target:?} has too many elements"))
                    })?;
                }
                d => {
                    return Err(attr_err(
                        "shape",
                        format!("shape entries must be positive or -1, got {d}"),
                    ));
                }
            }
        }
        let numel = (t.shape.iter())
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| operand_err(0, format!("{t} has too many elements to reshape")))?;
        let mut shape: Shape = target.iter().map(|&d| d.max(0) as usize).collect();
        if let Some(i) = infer_at {
            if numel % known != 0 {
                return Err(attr_err(
                    "shape",
                    format!("cannot reshape {t} ({numel} elements) to {target:?}"),
                ));
            }
            shape[i] = numel / known;
        }
        if shape.iter().product::<usize>() != numel {
            return Err(attr_err(
                "shape",
                format!(
                    "cannot reshape {t} ({numel} elements) to {target:?} ({} elements)",
                    shape.iter().product::<usize>()
                ),
            ));
        }
        self.attrs.set(
            "shape",
            Attr::ints(&shape.iter().map(|&d| d as i64).collect::<Vec<_>>()),
        );
        Ok(vec![TensorType::new(t.dtype, shape)])
    }

    fn slice(&mut self) -> Result<Vec<TensorType>> {
        let t = self.input(0).clone();
        let axis = self.axis_attr(key::AXIS, t.rank())?;
        let dim = t.shape[axis] as i64;
        let wrap = |name: &str, v: i64| -> Result<i64> {
            let n = if v < 0 { v + dim } else { v };
            if (0..=dim).contains(&n) {
                Ok(n)
            } else {
                Err(attr_err(
                    name,
                    format!("{name}={v} is out of range for axis {axis} of extent {dim}"),
                )
                .hint(format!("use {} to {dim}", -dim)))
            }
        };
        let start = wrap("start", self.int(key::START))?;
        let end = wrap("end", self.int(key::END))?;
        let step = self.int(key::STEP);
        if step < 1 {
            return Err(attr_err("step", format!("step={step} must be at least 1")));
        }
        if step > MAX_WINDOW_ATTR {
            return Err(attr_err(
                "step",
                format!("step={step} is past the largest step, {MAX_WINDOW_ATTR} (2^31 - 1)"),
            )
            .hint(format!(
                "a step of the axis extent ({dim}) or more already takes only `start`"
            )));
        }
        if start >= end {
            return Err(attr_err(
                "end",
                format!("slice [{start}, {end}) of axis {axis} is empty"),
            )
            .hint("empty tensors are not supported; end must be greater than start"));
        }
        self.attrs.set(key::START.name, Attr::Int(start));
        self.attrs.set(key::END.name, Attr::Int(end));
        let mut shape = t.shape.clone();
        shape[axis] = ((end - start - 1) / step + 1) as usize;
        Ok(vec![TensorType::new(t.dtype, shape)])
    }

    fn matmul(&self) -> Result<Vec<TensorType>> {
        let dtype = self.float_dtype(&[0, 1])?;
        let (a, b) = (self.input(0), self.input(1));
        if a.is_scalar() || b.is_scalar() {
            let i = if a.is_scalar() { 0 } else { 1 };
            return Err(operand_err(i, "`matmul` needs operands of rank 1 or more")
                .hint("use mul for scalars"));
        }
        let (k_a, k_b) = (
            a.shape[a.rank() - 1],
            if b.rank() == 1 {
                b.shape[0]
            } else {
                b.shape[b.rank() - 2]
            },
        );
        if k_a != k_b {
            return Err(operand_err(
                1,
                format!("`matmul` inner dimensions differ: {a} @ {b} ({k_a} vs {k_b})"),
            ));
        }
        let batch_a = &a.shape[..a.rank().saturating_sub(2)];
        let batch_b = &b.shape[..b.rank().saturating_sub(2)];
        let mut shape = broadcast_shapes(batch_a, batch_b).ok_or_else(|| {
            operand_err(
                1,
                format!("`matmul` batch dimensions of {a} and {b} do not broadcast"),
            )
        })?;
        if a.rank() >= 2 {
            shape.push(a.shape[a.rank() - 2]);
        }
        if b.rank() >= 2 {
            shape.push(b.shape[b.rank() - 1]);
        }
        Ok(vec![TensorType::new(dtype, shape)])
    }

    fn conv2d(&mut self) -> Result<Vec<TensorType>> {
        let all: Vec<usize> = (0..self.inputs.len()).collect();
        let dtype = self.float_dtype(&all)?;
        self.expect_rank(0, 4, "[N, C, H, W]")?;
        self.expect_rank(1, 4, "[O, C/groups, kH, kW]")?;
        let (x, w) = (self.input(0).clone(), self.input(1).clone());
        let groups = self.int(key::GROUPS);
        let (c, o) = (x.shape[1], w.shape[0]);
        if groups < 1 || c % groups as usize != 0 || o % groups as usize != 0 {
            return Err(attr_err(
                "groups",
                format!(
                    "groups={groups} must divide both the {c} input and the {o} output channels"
                ),
            ));
        }
        let g = groups as usize;
        if w.shape[1] != c / g {
            return Err(operand_err(
                1,
                format!(
                    "weight {w} needs {} input channels per group ({c} channels / {g} groups), got {}",
                    c / g,
                    w.shape[1]
                ),
            ));
        }
        if self.inputs.len() == 3 {
            self.expect_shape(2, &[o], "one bias per output channel")?;
        }
        Ok(vec![TensorType::new(
            dtype,
            self.conv2d_output(&x.shape, &w.shape)?,
        )])
    }

    /// Ranks and channel counts of a conv2d input and weight shape under `groups`.
    fn check_conv_groups(&self, x: &[usize], w: &[usize]) -> Result<()> {
        let groups = self.int(key::GROUPS);
        let fits = x.len() == 4
            && w.len() == 4
            && groups >= 1
            && x[1].is_multiple_of(groups as usize)
            && w[0].is_multiple_of(groups as usize)
            && w[1] * groups as usize == x[1];
        if fits {
            Ok(())
        } else {
            Err(attr_err(
                "groups",
                format!("groups={groups} does not fit input {x:?} and weight {w:?}"),
            ))
        }
    }

    /// Output extents of conv2d for an input and a weight shape (ranks and groups checked by
    /// the caller).
    fn conv2d_output(&self, x: &[usize], w: &[usize]) -> Result<Shape> {
        let stride = self.window_ints(key::STRIDE, 1)?;
        let padding = self.window_ints(key::PADDING, 0)?;
        let dilation = self.window_ints(key::DILATION, 1)?;
        let mut shape = vec![x[0], w[0]];
        for d in 0..2 {
            let span = dilation[d].checked_mul(w[2 + d] - 1);
            let padded = padding[d]
                .checked_mul(2)
                .and_then(|p| p.checked_add(x[2 + d]));
            let (Some(span), Some(padded)) = (span.map(|s| s.saturating_add(1)), padded) else {
                let name = if span.is_none() {
                    "dilation"
                } else {
                    "padding"
                };
                return Err(attr_err(name, format!("`{name}` is too large")));
            };
            if padded < span {
                return Err(operand_err(
                    1,
                    format!(
                        "kernel {}x{} (dilated extent {span}) is larger than the padded input ({padded})",
                        w[2], w[3]
                    ),
                ));
            }
            shape.push((padded - span) / stride[d] + 1);
        }
        Ok(shape)
    }

    fn pool2d(&mut self) -> Result<Vec<TensorType>> {
        let dtype = self.float_dtype(&[0])?;
        self.expect_rank(0, 4, "[N, C, H, W]")?;
        let x = self.input(0).clone();
        let kernel = self.window_ints(key::KERNEL, 1)?;
        if self.attrs.get(key::STRIDE.name).is_none() {
            self.attrs.set(
                "stride",
                Attr::ints(&kernel.iter().map(|&k| k as i64).collect::<Vec<_>>()),
            );
        }
        Ok(vec![TensorType::new(dtype, self.pool_output(&x.shape)?)])
    }

    /// Output extents of pooling an `[N, C, H, W]` input.
    fn pool_output(&self, x: &[usize]) -> Result<Shape> {
        let kernel = self.window_ints(key::KERNEL, 1)?;
        let stride = self.window_ints(key::STRIDE, 1)?;
        let padding = self.window_ints(key::PADDING, 0)?;
        let mut shape = vec![x[0], x[1]];
        for d in 0..2 {
            if 2 * padding[d] > kernel[d] {
                return Err(attr_err(
                    "padding",
                    format!(
                        "padding {} must be at most half the kernel ({})",
                        padding[d], kernel[d]
                    ),
                ));
            }
            let padded = x[2 + d]
                .checked_add(2 * padding[d])
                .ok_or_else(|| attr_err("padding", "`padding` is too large"))?;
            if padded < kernel[d] {
                return Err(attr_err(
                    "kernel",
                    format!("kernel {kernel:?} is larger than the padded input {x:?}"),
                ));
            }
            shape.push((padded - kernel[d]) / stride[d] + 1);
        }
        Ok(shape)
    }

    fn attention(&mut self) -> Result<Vec<TensorType>> {
        let dtype = self.float_dtype(&[0, 1, 2])?;
        self.expect_rank(0, 4, "[batch, heads, seq, head_dim]")?;
        self.expect_rank(1, 4, "[batch, heads, seq, head_dim]")?;
        self.expect_rank(2, 4, "[batch, heads, seq, head_dim]")?;
        let (q, k, v) = (
            self.input(0).clone(),
            self.input(1).clone(),
            self.input(2).clone(),
        );
        let (b, h, sq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
        let (kv_heads, sk) = (k.shape[1], k.shape[2]);
        // grouped-query attention: k and v may have fewer heads, each shared by a group of
        // query heads
        if !h.is_multiple_of(kv_heads) {
            return Err(operand_err(
                1,
                format!(
                    "`k` has {kv_heads} heads and `q` {h}: the key/value heads must divide \
                     the query heads (each serves a group of consecutive query heads)"
                ),
            ));
        }
        self.expect_shape(1, &[b, kv_heads, sk, d], "batch and head_dim of q")?;
        self.expect_shape(
            2,
            &[b, kv_heads, sk, v.shape[3]],
            "batch, heads and seq of k",
        )?;
        let mask_kind = self.attrs.of(key::MASK_KIND);
        if self.inputs.len() == 4 {
            let m = self.input(3).clone();
            if mask_kind == crate::attr::MaskKind::Additive {
                self.float_dtype(&[0, 3])?;
            }
            if !broadcasts_to(&m.shape, &[b, h, sq, sk]) {
                return Err(operand_err(
                    3,
                    format!("mask {m} does not broadcast to the scores [{b}, {h}, {sq}, {sk}]"),
                ));
            }
        }
        if self.attrs.get(key::SCALE.name).is_none() {
            self.attrs.put(key::SCALE, 1.0 / (d as f64).sqrt());
        }
        if !self.attrs.of(key::SCALE).is_finite() {
            return Err(attr_err("scale", "scale must be finite"));
        }
        if self.int(key::WINDOW) < 0 {
            return Err(attr_err(
                "window",
                "window must be 0 (no window) or positive",
            ));
        }
        Ok(vec![TensorType::new(dtype, vec![b, h, sq, v.shape[3]])])
    }

    fn sgd(&mut self) -> Result<Vec<TensorType>> {
        let p = self.input(0).clone();
        let momentum = self.non_negative(key::MOMENTUM)?;
        // the operands: param, grad, the buffer exactly with momentum, then an optional lr
        let tensors = (2 + usize::from(momentum != 0.0)).min(self.inputs.len());
        for i in 0..self.inputs.len() {
            self.expect_dtype(i, DType::F32)?;
            if i < tensors {
                self.expect_shape(i, &p.shape, "the param's shape")?;
            }
        }
        let lr_operand = self.inputs.len() > tensors;
        if lr_operand {
            let at = self.inputs.len() - 1;
            if momentum == 0.0 && self.inputs.len() == 3 && self.input(2).shape != [0usize; 0] {
                return Err(operand_err(
                    2,
                    "`sgd` without momentum takes no momentum buffer (a third operand is the \
                     step's learning rate, f32[])",
                ));
            }
            self.expect_shape(at, &[], "the step's learning rate, a scalar")?;
            if self.attrs.get(key::LR.name).is_some() {
                return Err(attr_err(
                    "lr",
                    "`sgd` takes the learning rate either as the operand or as `lr=`, not both",
                ));
            }
        } else if self.attrs.get(key::LR.name).is_none() {
            return Err(
                TypeError::new(Blame::Op, "`sgd` needs the attribute `lr`").hint("add `lr=...`")
            );
        } else {
            self.non_negative(key::LR)?;
        }
        self.non_negative(key::WEIGHT_DECAY)?;
        let dampening = self.attrs.of(key::DAMPENING);
        if !dampening.is_finite() {
            return Err(attr_err(
                "dampening",
                format!("dampening={dampening} must be finite"),
            ));
        }
        let has_buf = tensors == 3;
        if momentum != 0.0 && !has_buf {
            return Err(TypeError::new(Blame::Op, "`sgd` with momentum needs a momentum buffer operand")
                .hint("sgd(param, grad, buf, lr=..., momentum=...) with `buf` a state of the param's shape"));
        }
        if self.inputs.len() > tensors + 1 {
            return Err(operand_err(
                tensors + 1,
                "`sgd` takes param, grad, the momentum buffer (with momentum) and the lr",
            ));
        }
        if self.attrs.of(key::NESTEROV) && (momentum == 0.0 || self.attrs.of(key::DAMPENING) != 0.0)
        {
            return Err(attr_err(
                "nesterov",
                "nesterov needs momentum > 0 and dampening = 0",
            ));
        }
        Ok(vec![p; tensors - 1])
    }
}

fn reduced_shape(shape: &[usize], axes: &[usize], keepdim: bool) -> Shape {
    shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| match (axes.contains(&i), keepdim) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(
        op: Op,
        inputs: &[TensorType],
        attrs: Attrs,
    ) -> std::result::Result<Vec<TensorType>, String> {
        let mut attrs = attrs;
        infer(op, inputs, &mut attrs).map_err(|e| e.message)
    }

    fn f(shape: &[usize]) -> TensorType {
        TensorType::f32(shape.to_vec())
    }

    #[test]
    fn matmul_follows_torch() {
        assert_eq!(
            check(Op::Matmul, &[f(&[3]), f(&[3])], Attrs::new()),
            Ok(vec![f(&[])])
        );
        assert_eq!(
            check(Op::Matmul, &[f(&[2, 3]), f(&[3])], Attrs::new()),
            Ok(vec![f(&[2])])
        );
        assert_eq!(
            check(Op::Matmul, &[f(&[3]), f(&[3, 4])], Attrs::new()),
            Ok(vec![f(&[4])])
        );
        assert_eq!(
            check(Op::Matmul, &[f(&[5, 1, 2, 3]), f(&[7, 3, 4])], Attrs::new()),
            Ok(vec![f(&[5, 7, 2, 4])])
        );
        assert!(check(Op::Matmul, &[f(&[2, 3]), f(&[2, 3])], Attrs::new()).is_err());
    }

    #[test]
    fn reductions_normalize_axes() {
        let mut attrs = Attrs::new().with("axes", Attr::ints(&[-1]));
        let out = infer(Op::Sum, &[f(&[2, 3, 4])], &mut attrs).unwrap();
        assert_eq!(out, vec![f(&[2, 3])]);
        assert_eq!(attrs.of(key::AXES), vec![2]);
        assert!(!attrs.of(key::KEEPDIM));
    }

    #[test]
    fn conv_output_size() {
        let attrs = Attrs::new()
            .with("stride", Attr::Int(2))
            .with("padding", Attr::Int(1));
        assert_eq!(
            check(Op::Conv2d, &[f(&[1, 3, 7, 7]), f(&[8, 3, 3, 3])], attrs),
            Ok(vec![f(&[1, 8, 4, 4])])
        );
    }

    #[test]
    fn reshape_infers_minus_one() {
        let attrs = Attrs::new().with("shape", Attr::ints(&[-1, 6]));
        assert_eq!(
            check(Op::Reshape, &[f(&[2, 3, 4])], attrs),
            Ok(vec![f(&[4, 6])])
        );
    }

    #[test]
    fn attention_derives_scale() {
        let mut attrs = Attrs::new();
        infer(
            Op::Attention,
            &[f(&[1, 2, 5, 16]), f(&[1, 2, 7, 16]), f(&[1, 2, 7, 8])],
            &mut attrs,
        )
        .unwrap();
        assert_eq!(attrs.of(key::SCALE), 0.25);
    }

    #[test]
    fn unknown_attr_is_blamed() {
        let mut attrs = Attrs::new().with("axs", Attr::Int(0));
        let err = infer(Op::Softmax, &[f(&[2])], &mut attrs).unwrap_err();
        assert_eq!(err.blame, Blame::Attr("axs".into()));
    }
}
