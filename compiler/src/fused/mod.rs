//! The fused-kernel IR: one generic kernel program that every elementwise chain, reduction,
//! row kernel (softmax, norms, losses and their backward) and optimizer update is an instance
//! of. The optimizer builds programs by rewriting (each primitive is a one-op program, and
//! [`Bound::inline`] fuses a producer into a consumer); codegen compiles them from data.
//!
//! A program runs over an iteration **space** of `domain` axes (parallel) followed by `reduce`
//! axes. For every point `d` of the domain, its **phases** run in order; phase `k` combines
//! (sum, max, min, argmax) one value over every point `r` of the reduce axes, and later
//! instructions read the result through [`Inst::Reduced`]. **Outputs** are written per point of
//! the space they are indexed by: once per `d` (a reduction's result) or for every `(d, r)` (a
//! row map such as softmax's normalized row).
//!
//! Every tensor a program touches (operand or output) has an [`Access`]: for each axis of the
//! tensor, the space axis that indexes it (or none, for an extent-1 axis). Views (permute,
//! broadcast, slice, reshape) are not part of a program: lowering turns an access and a view into
//! one stride per space axis, so the program's text depends only on its structure.
//!
//! **Invariant:** `insts` is in SSA order (arguments before uses); phase `k`'s value depends on
//! `Reduced(j)` only for `j < k`; an output indexed by the domain alone has a value that does
//! not vary over the reduce axes. [`Program::check`] verifies all three.

use rustc_hash::FxHashMap as HashMap;

mod display;
pub mod eval;

use sinter_ir::{DType, Op, OpClass};

/// How a tensor axis is indexed by the program's space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Axis {
    /// By space axis `k` (`domain` axes first, then `reduce` axes).
    Space(u8),
    /// An extent-1 axis (coordinate 0).
    One,
    /// An extent-1 axis that stands for reduce axis `k` collapsed by a reduction with
    /// `keepdim`; read as coordinate 0, and remembered so that fusion can line the reduction up
    /// with its consumer.
    Collapsed(u8),
    /// By space axis `k` through the window `by..by + len`: the tensor's coordinate is the
    /// space coordinate minus `by` (its extent is `len`), and a load outside the window reads
    /// +0.0. Operands only: a `slice_grad`'s operand, a `concat`'s parts.
    Shifted { k: u8, by: u32, len: u32 },
}

impl Axis {
    /// The space axis that indexes this tensor axis, shifted or not.
    pub fn space(self) -> Option<u8> {
        match self {
            Axis::Space(k) | Axis::Shifted { k, .. } => Some(k),
            Axis::One | Axis::Collapsed(_) => None,
        }
    }

    /// This axis with its space axis renamed as `rename` renames `Axis::Space`; `None` for a
    /// shifted axis whose space axis `rename` maps to none.
    fn renamed(self, rename: &dyn Fn(Axis) -> Axis) -> Option<Axis> {
        match self {
            Axis::Shifted { k, by, len } => match rename(Axis::Space(k)) {
                Axis::Space(k) => Some(Axis::Shifted { k, by, len }),
                _ => None,
            },
            other => Some(rename(other)),
        }
    }
}

/// How a program reads an operand or writes an output.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Access {
    pub dtype: DType,
    /// One entry per axis of the tensor, outermost first.
    pub axes: Vec<Axis>,
}

impl Access {
    /// The space axes the tensor's axes name, in tensor-axis order.
    pub(crate) fn space_axes(&self) -> impl Iterator<Item = usize> + '_ {
        self.axes.iter().filter_map(|a| a.space().map(usize::from))
    }

    /// Whether some axis is read through a window ([`Axis::Shifted`]).
    pub fn is_shifted(&self) -> bool {
        self.axes.iter().any(|a| matches!(a, Axis::Shifted { .. }))
    }

    /// The access with every axis renamed by `rename` (see [`Axis::renamed`]).
    fn renamed(&self, rename: &dyn Fn(Axis) -> Axis) -> Option<Access> {
        Some(Access {
            dtype: self.dtype,
            axes: self
                .axes
                .iter()
                .map(|a| a.renamed(rename))
                .collect::<Option<_>>()?,
        })
    }
}

/// A scalar function of an instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scalar {
    /// An elementwise op of the IR (unary, binary, comparison or `where`), with the IR's
    /// semantics for NaN and infinities; `gelu` is the erf form.
    Op(Op),
    /// `gelu(approximate="tanh")`.
    GeluTanh,
    Cast(DType),
}

impl Scalar {
    /// The IR's elementwise ops (the op table's unary, binary, comparison and select families).
    pub fn of(op: Op) -> Option<Scalar> {
        matches!(
            op.class(),
            OpClass::Unary | OpClass::Binary | OpClass::Compare | OpClass::Select
        )
        .then_some(Scalar::Op(op))
    }

    pub fn arity(self) -> usize {
        match self {
            Scalar::Op(op) => match op.class() {
                OpClass::Unary => 1,
                OpClass::Select => 3,
                _ => 2,
            },
            Scalar::GeluTanh | Scalar::Cast(_) => 1,
        }
    }

    /// Rough cost in f32 operations, for the cost model.
    pub fn flops(self) -> u32 {
        use Op::*;
        match self {
            Scalar::Op(Exp | Log | Sin | Cos | Sqrt | Rsqrt) => 4,
            Scalar::Op(Sigmoid | Tanh | Silu | Pow | Div) => 6,
            Scalar::Op(Gelu) | Scalar::GeluTanh => 12,
            Scalar::Op(
                Neg | Abs | Reciprocal | Square | Relu | Add | Sub | Mul | Maximum | Minimum | Eq
                | Lt | Le | Gt | Ge | Where,
            )
            | Scalar::Cast(_) => 1,
            // not scalar functions (`Scalar::of` gives none for them)
            Scalar::Op(
                Sum | Mean | Max | Min | Logsumexp | Argmax | Cumsum | Reshape | Permute
                | Transpose | BroadcastTo | Unsqueeze | Squeeze | Slice | Concat | Cast | Matmul
                | Softmax | LogSoftmax | LayerNorm | RmsNorm | GroupNorm | Conv2d | MaxPool2d
                | AvgPool2d | Embedding | CrossEntropy | MseLoss | Conv2dGradInput
                | Conv2dGradWeight | MaxPool2dGrad | AvgPool2dGrad | EmbeddingGrad | SliceGrad
                | Attention | Constant | Iota | Grad | Sgd | Adam | AdamW,
            ) => 1,
        }
    }
}

/// How a phase combines its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Combine {
    Sum,
    /// NaN if any value is NaN.
    Max,
    Min,
    /// The (i32) flat reduce index of the first maximum (the last where `last`); a NaN counts
    /// as the maximum.
    ArgMax {
        last: bool,
    },
}

impl Combine {
    pub fn dtype(self) -> DType {
        match self {
            Combine::ArgMax { .. } => DType::I32,
            _ => DType::F32,
        }
    }
}

/// One scalar instruction; arguments are indices of earlier instructions.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Inst {
    /// The element of operand `i` at the current point.
    Load(u32),
    /// An f32 literal, by bit pattern.
    Const(u32),
    /// The coordinate along space axis `k`, as f32 (an `iota`).
    Coord(u8),
    Map(Scalar, Vec<u32>),
    /// The result of phase `k` (per domain point).
    Reduced(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Phase {
    pub combine: Combine,
    pub value: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Output {
    pub value: u32,
    pub access: Access,
}

/// A fused kernel (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Program {
    pub domain: Vec<usize>,
    pub reduce: Vec<usize>,
    pub operands: Vec<Access>,
    pub insts: Vec<Inst>,
    pub phases: Vec<Phase>,
    pub outputs: Vec<Output>,
}

/// Whether an instruction's value varies over the reduce axes (`Element`) or is one value per
/// domain point (`Row`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Row,
    Element,
}

/// Largest programs fusion builds: instructions, operands, phases.
pub const MAX_INSTS: usize = 192;
pub const MAX_OPERANDS: usize = 24;
pub const MAX_PHASES: usize = 6;

/// Longest axis a program compares coordinates along: coordinates are f32, exact up to 2^24.
const EXACT_COORD: usize = 1 << 24;

/// The access of tensor axis `axis` (extent `len`) read through the window `start..start + len`
/// of space axis `axis`; `None` for an empty window or one past u32.
fn window(axis: usize, start: usize, len: usize) -> Option<Axis> {
    Some(Axis::Shifted {
        k: u8::try_from(axis).ok()?,
        by: u32::try_from(start).ok()?,
        len: u32::try_from(len).ok().filter(|&n| n > 0)?,
    })
}

/// Right-aligned numpy broadcasting of a tensor of `shape` into a space whose axes
/// `0..target.len()` have extents `target` (extent-1 tensor axes are [`Axis::One`]).
pub fn broadcast_access(dtype: DType, shape: &[usize], target: &[usize]) -> Access {
    let lead = target.len() - shape.len();
    Access {
        dtype,
        axes: shape
            .iter()
            .enumerate()
            .map(|(j, &d)| {
                if d == 1 {
                    Axis::One
                } else {
                    Axis::Space((lead + j) as u8)
                }
            })
            .collect(),
    }
}

impl Program {
    fn space_len(&self) -> usize {
        self.domain.len() + self.reduce.len()
    }

    /// The space axes of extent above 1, in order.
    pub fn wide_axes(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.space_len()).filter(|&k| self.extent(k) > 1)
    }

    /// Extent of space axis `k`.
    pub fn extent(&self, k: usize) -> usize {
        if k < self.domain.len() {
            self.domain[k]
        } else {
            self.reduce[k - self.domain.len()]
        }
    }

    pub fn is_reduce_axis(&self, k: usize) -> bool {
        k >= self.domain.len()
    }

    /// The dtype of every instruction's value.
    pub fn dtypes(&self) -> Vec<DType> {
        let mut types: Vec<DType> = Vec::with_capacity(self.insts.len());
        for inst in &self.insts {
            let t = match inst {
                Inst::Load(i) => self.operands[*i as usize].dtype,
                Inst::Const(_) | Inst::Coord(_) => DType::F32,
                Inst::Map(Scalar::Cast(to), _) => *to,
                Inst::Map(Scalar::Op(Op::Where), args) => types[args[1] as usize],
                Inst::Map(_, _) => DType::F32,
                Inst::Reduced(k) => self.phases[*k as usize].combine.dtype(),
            };
            types.push(t);
        }
        types
    }

    /// The level of every instruction (see [`Level`]).
    pub fn levels(&self) -> Vec<Level> {
        let d = self.domain.len();
        let mut levels: Vec<Level> = Vec::with_capacity(self.insts.len());
        for inst in &self.insts {
            let l = match inst {
                Inst::Load(i) => {
                    if self.operands[*i as usize].space_axes().any(|k| k >= d) {
                        Level::Element
                    } else {
                        Level::Row
                    }
                }
                Inst::Const(_) | Inst::Reduced(_) => Level::Row,
                Inst::Coord(k) => {
                    if (*k as usize) >= d {
                        Level::Element
                    } else {
                        Level::Row
                    }
                }
                Inst::Map(_, args) => {
                    if args.iter().any(|&a| levels[a as usize] == Level::Element) {
                        Level::Element
                    } else {
                        Level::Row
                    }
                }
            };
            levels.push(l);
        }
        levels
    }

    /// For every instruction, the highest phase index it reads (through `Reduced`), plus one;
    /// 0 when it reads none.
    pub fn phase_needs(&self) -> Vec<usize> {
        let mut needs: Vec<usize> = Vec::with_capacity(self.insts.len());
        for inst in &self.insts {
            let n = match inst {
                Inst::Reduced(k) => *k as usize + 1,
                Inst::Map(_, args) => args.iter().map(|&a| needs[a as usize]).max().unwrap_or(0),
                _ => 0,
            };
            needs.push(n);
        }
        needs
    }

    /// Which operands the instructions `values` need load (through phases too), by index.
    pub fn loaded(&self, values: impl Iterator<Item = u32>) -> Vec<bool> {
        let mut need = vec![false; self.insts.len()];
        let mut need_phase = vec![false; self.phases.len()];
        let mut loads = vec![false; self.operands.len()];
        let mut stack: Vec<u32> = values.collect();
        while let Some(i) = stack.pop() {
            if std::mem::replace(&mut need[i as usize], true) {
                continue;
            }
            match &self.insts[i as usize] {
                Inst::Load(o) => loads[*o as usize] = true,
                Inst::Map(_, args) => stack.extend(args),
                Inst::Reduced(k) if !need_phase[*k as usize] => {
                    need_phase[*k as usize] = true;
                    stack.push(self.phases[*k as usize].value);
                }
                _ => {}
            }
        }
        loads
    }

    /// Checks the invariants of the module docs; `Err` names the broken one.
    pub fn check(&self) -> Result<(), String> {
        let space = self.space_len();
        if self.reduce.is_empty() != self.phases.is_empty() {
            return Err("phases exist exactly when there are reduce axes".into());
        }
        let axis_ok = |a: &Axis| match *a {
            Axis::Space(k) => (k as usize) < space,
            Axis::One => true,
            Axis::Collapsed(k) => (k as usize) < self.reduce.len(),
            Axis::Shifted { k, by, len } => {
                (k as usize) < space && len > 0 && (by + len) as usize <= self.extent(k as usize)
            }
        };
        if self.outputs.iter().any(|o| o.access.is_shifted()) {
            return Err("an output is written through a window".into());
        }
        for acc in self
            .operands
            .iter()
            .chain(self.outputs.iter().map(|o| &o.access))
        {
            if !acc.axes.iter().all(axis_ok) {
                return Err(format!("an access names a missing axis: {acc:?}"));
            }
        }
        for (i, inst) in self.insts.iter().enumerate() {
            let ok = match inst {
                Inst::Load(o) => (*o as usize) < self.operands.len(),
                Inst::Coord(k) => (*k as usize) < space,
                Inst::Map(s, args) => {
                    args.len() == s.arity() && args.iter().all(|&a| (a as usize) < i)
                }
                Inst::Reduced(k) => (*k as usize) < self.phases.len(),
                Inst::Const(_) => true,
            };
            if !ok {
                return Err(format!("instruction {i} ({inst:?}) is malformed"));
            }
        }
        let needs = self.phase_needs();
        for (k, p) in self.phases.iter().enumerate() {
            if p.value as usize >= self.insts.len() || needs[p.value as usize] > k {
                return Err(format!("phase {k} reads its own or a later result"));
            }
        }
        let levels = self.levels();
        for o in &self.outputs {
            if o.value as usize >= self.insts.len() {
                return Err("an output names a missing instruction".into());
            }
            let over_reduce = o.access.space_axes().any(|k| self.is_reduce_axis(k));
            if !over_reduce && levels[o.value as usize] == Level::Element {
                return Err("a per-row output varies over the reduce axes".into());
            }
        }
        Ok(())
    }

    /// One elementwise scalar function over `shape`, reading `operands` (each broadcast to
    /// `shape`); `coords` lists extra arguments that are space coordinates (iota) or
    /// literals, in argument order, mixed with the operands as `args` says.
    pub fn map(shape: &[usize], scalar: Scalar, args: &[Arg], out: DType) -> Program {
        let mut p = Program {
            domain: shape.to_vec(),
            reduce: Vec::new(),
            operands: Vec::new(),
            insts: Vec::new(),
            phases: Vec::new(),
            outputs: Vec::new(),
        };
        let ids: Vec<u32> = args.iter().map(|a| p.arg(a, shape)).collect();
        let mut value = p.push(Inst::Map(scalar, ids));
        if out == DType::F16 && scalar != Scalar::Cast(DType::F16) {
            // an op on f16 values rounds its result once (IR.md)
            value = p.push(Inst::Map(Scalar::Cast(DType::F16), vec![value]));
        }
        p.outputs.push(Output {
            value,
            access: broadcast_access(out, shape, shape),
        });
        p
    }

    /// `slice_grad` along `axis` from `start` with step 1: `x` in the window `start..start +
    /// its extent` of `out`'s axis, +0.0 elsewhere. `None` past the window's integer range.
    pub fn padded(
        out: &sinter_ir::TensorType,
        x: &sinter_ir::TensorType,
        axis: usize,
        start: usize,
    ) -> Option<Program> {
        let mut p = Program::map(
            &out.shape,
            Scalar::Cast(x.dtype),
            &[Arg::Operand(x.clone())],
            out.dtype,
        );
        p.operands[0].axes[axis] = window(axis, start, x.shape[axis])?;
        Some(p)
    }

    /// `concat` of `parts` along `axis`: each part read through its window of the axis, and
    /// each point's value chosen from the part its coordinate falls in. `None` for parts of
    /// another dtype, empty parts, axes longer than f32's exact integers (the coordinate is
    /// compared as f32), and parts that are contiguous ranges of the result (no axis before
    /// `axis` wider than 1), which lowering has their producers write in place instead
    /// (`in_place::write_parts_in_place`).
    pub fn concat(
        out: &sinter_ir::TensorType,
        parts: &[sinter_ir::TensorType],
        axis: usize,
    ) -> Option<Program> {
        if out.shape[..axis].iter().all(|&d| d == 1)
            || out.shape[axis] > EXACT_COORD
            || parts.iter().any(|t| t.dtype != out.dtype)
        {
            return None;
        }
        let mut p = Program::over(out.shape.clone(), Vec::new());
        let (mut at, mut loads) = (0, Vec::new());
        for t in parts {
            let mut access = broadcast_access(t.dtype, &t.shape, &out.shape);
            access.axes[axis] = window(axis, at, t.shape[axis])?;
            at += t.shape[axis];
            p.operands.push(access);
            let load = p.push(Inst::Load((p.operands.len() - 1) as u32));
            loads.push((load, at));
        }
        let coord = p.push(Inst::Coord(axis as u8));
        let mut value = loads.last()?.0;
        for &(load, end) in loads.iter().rev().skip(1) {
            let end = p.push(Inst::Const((end as f32).to_bits()));
            let before = p.push(Inst::Map(Scalar::Op(Op::Lt), vec![coord, end]));
            value = p.push(Inst::Map(Scalar::Op(Op::Where), vec![before, load, value]));
        }
        p.outputs.push(Output {
            value,
            access: broadcast_access(out.dtype, &out.shape, &out.shape),
        });
        Some(p)
    }

    /// `x` of `shape` reduced over `axes` with `combine` (`keepdim` keeps extent-1 axes).
    pub fn reduction(
        shape: &[usize],
        axes: &[usize],
        keepdim: bool,
        combine: Combine,
        dtype: DType,
    ) -> Program {
        if axes.is_empty() {
            // over no axis: each element is its own result
            let ty = sinter_ir::TensorType::new(dtype, shape.to_vec());
            return Program::map(shape, Scalar::Cast(dtype), &[Arg::Operand(ty)], dtype);
        }
        let kept: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
        let space_of = |a: usize| -> Axis {
            if let Some(i) = kept.iter().position(|&k| k == a) {
                Axis::Space(i as u8)
            } else {
                let r = axes.iter().position(|&k| k == a).expect("reduced");
                Axis::Space((kept.len() + r) as u8)
            }
        };
        let x_axes = (0..shape.len())
            .map(|a| {
                if shape[a] == 1 {
                    Axis::One
                } else {
                    space_of(a)
                }
            })
            .collect();
        let mut out_axes = Vec::new();
        for (a, &extent) in shape.iter().enumerate() {
            if let Some(r) = axes.iter().position(|&k| k == a) {
                if keepdim {
                    out_axes.push(Axis::Collapsed(r as u8));
                }
            } else if extent == 1 {
                out_axes.push(Axis::One);
            } else {
                out_axes.push(space_of(a));
            }
        }
        let mut p = Program {
            domain: kept.iter().map(|&a| shape[a]).collect(),
            reduce: axes.iter().map(|&a| shape[a]).collect(),
            operands: vec![Access {
                dtype,
                axes: x_axes,
            }],
            insts: vec![Inst::Load(0)],
            phases: vec![Phase { combine, value: 0 }],
            outputs: Vec::new(),
        };
        let mut value = p.push(Inst::Reduced(0));
        let out = match combine {
            Combine::ArgMax { .. } => DType::I32,
            Combine::Sum | Combine::Max | Combine::Min => dtype,
        };
        if out == DType::F16 {
            // combined in f32, rounded once (IR.md)
            value = p.push(Inst::Map(Scalar::Cast(DType::F16), vec![value]));
        }
        p.outputs.push(Output {
            value,
            access: Access {
                dtype: out,
                axes: out_axes,
            },
        });
        p
    }

    /// The one-op program of an IR primitive that fused kernels are made of — elementwise ops
    /// (`gelu` with `approximate="tanh"` as [`Scalar::GeluTanh`]), `cast`, the reductions `sum`,
    /// `max`, `min` and `argmax`, and with `leaves`, `constant` and `iota` — with operands of
    /// `inputs` and result `out`; `None` for any other op. The optimizer's fusion and lowering
    /// both build programs here.
    pub fn of_primitive(
        op: Op,
        attrs: &sinter_ir::Attrs,
        inputs: &[sinter_ir::TensorType],
        out: &sinter_ir::TensorType,
        leaves: bool,
    ) -> Option<Program> {
        use sinter_ir::key;
        if let Some(scalar) = Scalar::of(op) {
            let scalar =
                if op == Op::Gelu && attrs.of(key::APPROXIMATE) == sinter_ir::GeluForm::Tanh {
                    Scalar::GeluTanh
                } else {
                    scalar
                };
            let args: Vec<Arg> = inputs.iter().cloned().map(Arg::Operand).collect();
            return Some(Program::map(&out.shape, scalar, &args, out.dtype));
        }
        let reduction = |axes: &[usize], combine: Combine| {
            Program::reduction(
                &inputs[0].shape,
                axes,
                attrs.of(key::KEEPDIM),
                combine,
                inputs[0].dtype,
            )
        };
        match op {
            Op::Cast => Some(Program::map(
                &out.shape,
                Scalar::Cast(out.dtype),
                &[Arg::Operand(inputs[0].clone())],
                out.dtype,
            )),
            Op::Sum => Some(reduction(&attrs.of(key::AXES), Combine::Sum)),
            Op::Max => Some(reduction(&attrs.of(key::AXES), Combine::Max)),
            Op::Min => Some(reduction(&attrs.of(key::AXES), Combine::Min)),
            Op::Argmax => Some(reduction(
                &[attrs.of(key::AXIS)],
                Combine::ArgMax {
                    last: attrs.of(key::LAST),
                },
            )),
            Op::Constant if leaves => Some(Program::map(
                &[],
                Scalar::Cast(DType::F32),
                &[Arg::Const(attrs.of(key::VALUE) as f32)],
                DType::F32,
            )),
            Op::Iota if leaves => {
                let shape = attrs.of(key::SHAPE);
                let arg = Arg::Coord {
                    axis: attrs.of(key::AXIS),
                    rank: shape.len(),
                };
                Some(Program::map(
                    &shape,
                    Scalar::Cast(DType::F32),
                    &[arg],
                    DType::F32,
                ))
            }
            _ => None,
        }
    }

    /// A program over `domain` and `reduce` with nothing in it yet.
    fn over(domain: Vec<usize>, reduce: Vec<usize>) -> Program {
        Program {
            domain,
            reduce,
            operands: Vec::new(),
            insts: Vec::new(),
            phases: Vec::new(),
            outputs: Vec::new(),
        }
    }

    fn push(&mut self, inst: Inst) -> u32 {
        self.insts.push(inst);
        (self.insts.len() - 1) as u32
    }

    fn arg(&mut self, arg: &Arg, shape: &[usize]) -> u32 {
        match arg {
            Arg::Operand(ty) => {
                self.operands
                    .push(broadcast_access(ty.dtype, &ty.shape, shape));
                let i = (self.operands.len() - 1) as u32;
                self.push(Inst::Load(i))
            }
            Arg::Const(v) => self.push(Inst::Const(v.to_bits())),
            Arg::Coord { axis, rank } => {
                // an iota of rank `rank`, broadcast (right-aligned) into `shape`
                let k = shape.len() - rank + axis;
                if shape[k] == 1 {
                    self.push(Inst::Const(0f32.to_bits()))
                } else {
                    self.push(Inst::Coord(k as u8))
                }
            }
        }
    }

    /// The kernel's shape, for `sinter inspect`: elementwise (no reduction), reduce (every
    /// output one value per row) or row map (outputs over the reduced axes too, as softmax).
    pub fn pattern(&self) -> crate::kernel::Pattern {
        use crate::kernel::Pattern;
        if self.reduce.is_empty() {
            return Pattern::Elementwise;
        }
        let d = self.domain.len();
        let over_reduce = self.outputs.iter().any(|o| {
            o.access
                .axes
                .iter()
                .any(|a| matches!(a, Axis::Space(k) if *k as usize >= d))
        });
        if over_reduce {
            Pattern::RowMap
        } else {
            Pattern::Reduce
        }
    }

    /// The same program without identity casts and without instructions, operands and phases
    /// that no output needs (operands keep their order; `keep` says which survive).
    pub fn simplified(&self) -> (Program, Vec<bool>) {
        let dtypes = self.dtypes();
        // identity casts forward to their argument
        let mut alias: Vec<u32> = (0..self.insts.len() as u32).collect();
        for (i, inst) in self.insts.iter().enumerate() {
            if let Inst::Map(Scalar::Cast(to), args) = inst
                && dtypes[args[0] as usize] == *to
            {
                alias[i] = alias[args[0] as usize];
            }
        }
        let mut need = vec![false; self.insts.len()];
        let mut need_phase = vec![false; self.phases.len()];
        let mut stack: Vec<u32> = self
            .outputs
            .iter()
            .map(|o| alias[o.value as usize])
            .collect();
        while let Some(i) = stack.pop() {
            let i = alias[i as usize] as usize;
            if need[i] {
                continue;
            }
            need[i] = true;
            match &self.insts[i] {
                Inst::Map(_, args) => stack.extend(args.iter().map(|&a| alias[a as usize])),
                Inst::Reduced(k) if !need_phase[*k as usize] => {
                    need_phase[*k as usize] = true;
                    stack.push(self.phases[*k as usize].value);
                }
                _ => {}
            }
        }
        let mut keep = vec![false; self.operands.len()];
        for (i, inst) in self.insts.iter().enumerate() {
            if let (true, Inst::Load(o)) = (need[i], inst) {
                keep[*o as usize] = true;
            }
        }
        let mut operand_index = vec![0u32; self.operands.len()];
        let mut next = 0;
        for (o, &k) in keep.iter().enumerate() {
            operand_index[o] = next;
            next += u32::from(k);
        }
        let mut phase_index = vec![0u8; self.phases.len()];
        let mut next = 0;
        for (k, &n) in need_phase.iter().enumerate() {
            phase_index[k] = next;
            next += u8::from(n);
        }
        let mut index = vec![0u32; self.insts.len()];
        let mut insts = Vec::new();
        for (i, inst) in self.insts.iter().enumerate() {
            if !need[i] {
                continue;
            }
            index[i] = insts.len() as u32;
            insts.push(match inst {
                Inst::Load(o) => Inst::Load(operand_index[*o as usize]),
                Inst::Map(f, args) => Inst::Map(
                    *f,
                    args.iter()
                        .map(|&a| index[alias[a as usize] as usize])
                        .collect(),
                ),
                Inst::Reduced(k) => Inst::Reduced(phase_index[*k as usize]),
                other => other.clone(),
            });
        }
        let p = Program {
            domain: self.domain.clone(),
            reduce: self.reduce.clone(),
            operands: self
                .operands
                .iter()
                .zip(&keep)
                .filter(|(_, k)| **k)
                .map(|(a, _)| a.clone())
                .collect(),
            insts,
            phases: self
                .phases
                .iter()
                .zip(&need_phase)
                .filter(|(_, n)| **n)
                .map(|(ph, _)| Phase {
                    combine: ph.combine,
                    value: index[alias[ph.value as usize] as usize],
                })
                .collect(),
            outputs: self
                .outputs
                .iter()
                .map(|o| Output {
                    value: index[alias[o.value as usize] as usize],
                    access: o.access.clone(),
                })
                .collect(),
        };
        (p, keep)
    }

    /// This program with operand `i` replaced by a literal or an `iota` coordinate (the operand
    /// is removed; later operands move down by one). For an iota of rank `rank` along `axis`,
    /// the coordinate is the space axis that indexes that tensor axis. An operand read through
    /// windows gives the value inside them and +0.0 outside, as its loads did.
    pub fn substitute(&self, i: usize, arg: &Arg) -> Program {
        if matches!(arg, Arg::Operand(_)) {
            return self.clone();
        }
        let axes = self.operands[i].axes.clone();
        let mut p = Program {
            insts: Vec::with_capacity(self.insts.len()),
            ..self.clone()
        };
        let mut index: Vec<u32> = Vec::with_capacity(self.insts.len());
        for inst in &self.insts {
            let at = match inst {
                Inst::Load(o) if *o as usize == i => {
                    let value = match *arg {
                        Arg::Const(v) => p.push(Inst::Const(v.to_bits())),
                        Arg::Coord { axis, .. } => match axes[axis] {
                            Axis::Space(k) => p.push(Inst::Coord(k)),
                            Axis::Shifted { k, by, .. } => p.shifted_coord(k, by),
                            _ => p.push(Inst::Const(0f32.to_bits())),
                        },
                        Arg::Operand(_) => unreachable!("returned above"),
                    };
                    p.guarded(value, &axes)
                }
                Inst::Load(o) if *o as usize > i => p.push(Inst::Load(o - 1)),
                Inst::Map(f, args) => {
                    let args = args.iter().map(|&x| index[x as usize]).collect();
                    p.push(Inst::Map(*f, args))
                }
                other => p.push(other.clone()),
            };
            index.push(at);
        }
        let remap = |v: u32| index[v as usize];
        for ph in &mut p.phases {
            ph.value = remap(ph.value);
        }
        for o in &mut p.outputs {
            o.value = remap(o.value);
        }
        p.operands.remove(i);
        p
    }

    /// The coordinate along space axis `k` less `by` (a window's start), as f32.
    fn shifted_coord(&mut self, k: u8, by: u32) -> u32 {
        let at = self.push(Inst::Coord(k));
        if by == 0 {
            return at;
        }
        let by = self.push(Inst::Const((by as f32).to_bits()));
        self.push(Inst::Map(Scalar::Op(Op::Sub), vec![at, by]))
    }

    /// `value` where every window of `axes` ([`Axis::Shifted`]) holds the current point, +0.0
    /// elsewhere (the value stays the `where`'s first choice, which gives the result its dtype).
    fn guarded(&mut self, mut value: u32, axes: &[Axis]) -> u32 {
        for &a in axes {
            let Axis::Shifted { k, by, len } = a else {
                continue;
            };
            let zero = self.push(Inst::Const(0f32.to_bits()));
            let at = self.push(Inst::Coord(k));
            if by > 0 {
                let start = self.push(Inst::Const((by as f32).to_bits()));
                let after = self.push(Inst::Map(Scalar::Op(Op::Ge), vec![at, start]));
                value = self.push(Inst::Map(Scalar::Op(Op::Where), vec![after, value, zero]));
            }
            let end = self.push(Inst::Const(((by + len) as f32).to_bits()));
            let inside = self.push(Inst::Map(Scalar::Op(Op::Lt), vec![at, end]));
            value = self.push(Inst::Map(Scalar::Op(Op::Where), vec![inside, value, zero]));
        }
        value
    }

    /// Instruction count weighted by each function's cost, times the points it runs at.
    pub fn flops(&self) -> u64 {
        let per_point: u64 = self
            .insts
            .iter()
            .map(|i| match i {
                Inst::Map(s, _) => s.flops() as u64,
                _ => 0,
            })
            .sum();
        let points: u64 = self
            .domain
            .iter()
            .chain(&self.reduce)
            .map(|&d| d as u64)
            .product();
        per_point * points * (1 + self.phases.len() as u64)
    }
}

/// An argument of [`Program::map`].
#[derive(Clone, Debug)]
pub enum Arg {
    /// The next operand, of this type.
    Operand(sinter_ir::TensorType),
    Const(f32),
    /// An `iota` of rank `rank` along `axis`.
    Coord {
        axis: usize,
        rank: usize,
    },
}

/// A program with the operands it reads (e-classes in the optimizer, buffers after it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Bound<K> {
    pub program: Program,
    pub operands: Vec<K>,
}

impl<K: Copy + Eq + std::hash::Hash + std::fmt::Debug> Bound<K> {
    /// Fuses `producer` (a one-output program computing this program's operand `i`) into this
    /// program: the operand's loads become the producer's computation. `None` when the two
    /// iteration spaces do not line up (see [`line_up`]) or the result would pass the size
    /// limits.
    pub fn inline(&self, i: usize, producer: &Bound<K>) -> Option<Bound<K>> {
        inline(
            &self.program,
            &self.operands,
            i,
            &producer.program,
            &producer.operands,
        )
    }
}

/// [`Bound::inline`] of borrowed programs: `c` reading `c_kids` with its operand `i` computed
/// by `p` reading `p_kids`.
pub fn inline<K: Copy + Eq + std::hash::Hash + std::fmt::Debug>(
    c: &Program,
    c_kids: &[K],
    i: usize,
    p: &Program,
    p_kids: &[K],
) -> Option<Bound<K>> {
    if p.outputs.len() != 1 || p.phases.len() + c.phases.len() > MAX_PHASES {
        return None;
    }
    let same = |a: Axis| a;
    if c.operands[i].is_shifted() {
        // the producer moved into the consumer's space, its axes already the consumer's
        let shifted = windowed(c, &c.operands[i], p)?;
        let producer = Merged {
            p: &shifted,
            kids: p_kids,
            axis: &same,
        };
        let consumer = Merged {
            p: c,
            kids: c_kids,
            axis: &same,
        };
        return fused(c.domain.clone(), c.reduce.clone(), &producer, &consumer, i);
    }
    let plan = line_up(c, &c.operands[i], p)?;
    let p_axis = |a: Axis| match a {
        Axis::Space(k) => plan.producer[k as usize],
        _ => Axis::One,
    };
    let c_axis = |a: Axis| match a {
        Axis::Space(k) => Axis::Space(plan.consumer[k as usize] as u8),
        other => other,
    };
    let renames = |q: &Program, axis: &dyn Fn(Axis) -> Axis| {
        q.operands.iter().all(|a| a.renamed(axis).is_some())
    };
    if !renames(p, &p_axis) || !renames(c, &c_axis) {
        return None;
    }
    let consumer = Merged {
        p: c,
        kids: c_kids,
        axis: &c_axis,
    };
    let producer = Merged {
        p,
        kids: p_kids,
        axis: &p_axis,
    };
    // the operand limit, checked before building what it would reject
    if c_kids.len() + p_kids.len() > MAX_OPERANDS + 1
        && operand_count(&consumer, i, &producer) > MAX_OPERANDS
    {
        return None;
    }
    fused(
        plan.domain.clone(),
        plan.reduce.clone(),
        &producer,
        &consumer,
        i,
    )
}

/// The program over `domain` and `reduce` that computes `consumer` with its operand `i`
/// computed by `producer`, simplified; `None` past the size limits.
fn fused<K: Copy + Eq + std::hash::Hash + std::fmt::Debug>(
    domain: Vec<usize>,
    reduce: Vec<usize>,
    producer: &Merged<K>,
    consumer: &Merged<K>,
    i: usize,
) -> Option<Bound<K>> {
    let mut out = Program::over(domain, reduce);
    let mut kids: Vec<K> = Vec::new();
    let mut merge = Merge::new(&mut out, &mut kids);
    // the producer first, so that its phases come first
    let ids = merge.copy(producer.p, producer.kids, producer.axis, &[], false);
    let value = ids[producer.p.outputs[0].value as usize].expect("the output was copied");
    merge.copy(
        consumer.p,
        consumer.kids,
        consumer.axis,
        &[(i as u32, value)],
        true,
    );
    let (out, kids) = simplified_with(&out, kids);
    if out.insts.len() > MAX_INSTS || kids.len() > MAX_OPERANDS {
        return None;
    }
    let result = Bound {
        program: out,
        operands: kids,
    };
    debug_assert!(
        result.program.check().is_ok(),
        "{:?}\n{result:?}",
        result.program.check()
    );
    result.program.check().ok()?;
    Some(result)
}

/// Elementwise `p` rewritten over `c`'s space (every axis a domain axis, so that its accesses
/// and coordinates name `c`'s axes), as `c` reads its result through `access`, which has
/// windows ([`Axis::Shifted`]): `p` runs at `c`'s points shifted back by each window's start,
/// reads its own operands through the same windows, and gives +0.0 outside them, as a load
/// through the window would. `None` unless `p` has no reduce axes and every axis of its result
/// meets one axis of `access` of the same extent.
fn windowed(c: &Program, access: &Access, p: &Program) -> Option<Program> {
    if !p.reduce.is_empty() || p.outputs.len() != 1 {
        return None;
    }
    let out = &p.outputs[0].access;
    if out.axes.len() != access.axes.len() {
        return None;
    }
    // each producer axis: the consumer axis it becomes and the window's start and length
    let mut onto: Vec<Option<(u8, u32, u32)>> = vec![None; p.domain.len()];
    for (&pa, &ca) in out.axes.iter().zip(&access.axes) {
        let (k, to) = match (pa, ca) {
            (Axis::Space(k), Axis::Space(a)) => (k, (a, 0, c.extent(a as usize) as u32)),
            (Axis::Space(k), Axis::Shifted { k: a, by, len }) => (k, (a, by, len)),
            (Axis::Space(k), Axis::One | Axis::Collapsed(_)) if p.domain[k as usize] == 1 => {
                continue;
            }
            (Axis::One, Axis::Space(_) | Axis::One | Axis::Collapsed(_)) => continue,
            _ => return None,
        };
        if p.domain[k as usize] != to.2 as usize || onto[k as usize].replace(to).is_some() {
            return None;
        }
    }
    if (0..p.domain.len()).any(|k| onto[k].is_none() && p.domain[k] != 1) {
        return None;
    }
    // the windows narrower than the consumer's axis, which the result is guarded by
    let windows: Vec<Axis> = onto
        .iter()
        .flatten()
        .filter(|&&(a, by, len)| by != 0 || len as usize != c.extent(a as usize))
        .map(|&(k, by, len)| Axis::Shifted { k, by, len })
        .collect();
    if windows.iter().any(|a| {
        a.space()
            .is_some_and(|k| c.extent(k as usize) > EXACT_COORD)
    }) {
        return None;
    }
    let rename = |x: Axis| -> Option<Axis> {
        Some(match x {
            Axis::Space(k) => match onto[k as usize] {
                Some((a, 0, len)) if len as usize == c.extent(a as usize) => Axis::Space(a),
                Some((a, by, len)) => Axis::Shifted { k: a, by, len },
                None => Axis::One,
            },
            Axis::Shifted { k, by, len } => {
                let (a, at, _) = onto[k as usize]?;
                Axis::Shifted {
                    k: a,
                    by: at + by,
                    len,
                }
            }
            other => other,
        })
    };
    let mut q = Program::over(
        (0..c.space_len()).map(|k| c.extent(k)).collect(),
        Vec::new(),
    );
    for acc in &p.operands {
        let axes = acc.axes.iter().map(|&x| rename(x)).collect::<Option<_>>()?;
        q.operands.push(Access {
            dtype: acc.dtype,
            axes,
        });
    }
    // p's instruction i is q's instruction index[i]
    let mut index: Vec<u32> = Vec::with_capacity(p.insts.len());
    for inst in &p.insts {
        let at = match inst {
            Inst::Coord(k) => match onto[*k as usize] {
                Some((a, by, _)) => q.shifted_coord(a, by),
                None => q.push(Inst::Const(0f32.to_bits())),
            },
            Inst::Map(f, args) => {
                let args = args.iter().map(|&x| index[x as usize]).collect();
                q.push(Inst::Map(*f, args))
            }
            other => q.push(other.clone()),
        };
        index.push(at);
    }
    let value = q.guarded(index[p.outputs[0].value as usize], &windows);
    q.outputs.push(Output {
        value,
        access: Access {
            dtype: p.outputs[0].access.dtype,
            axes: (0..q.domain.len()).map(|k| Axis::Space(k as u8)).collect(),
        },
    });
    Some(q)
}

/// `p` simplified (see [`Program::simplified`]) with the operand keys `kids` it keeps.
fn simplified_with<K>(p: &Program, kids: Vec<K>) -> (Program, Vec<K>) {
    let (p, keep) = p.simplified();
    let kids = kids
        .into_iter()
        .zip(keep)
        .filter(|(_, k)| *k)
        .map(|(k, _)| k)
        .collect();
    (p, kids)
}

/// A program as [`inline`] copies it: its operands' keys and its axes renamed into the result.
struct Merged<'a, K> {
    p: &'a Program,
    kids: &'a [K],
    axis: &'a dyn Fn(Axis) -> Axis,
}

/// The operand count of `consumer` with its operand `i` computed by `producer`, as
/// [`inline`] would build it: the distinct (operand, renamed access) pairs that the result's
/// outputs load (what [`Program::simplified`] keeps), without building the result.
fn operand_count<K: Copy + Eq + std::hash::Hash>(
    consumer: &Merged<K>,
    i: usize,
    producer: &Merged<K>,
) -> usize {
    let mut keys: rustc_hash::FxHashSet<(K, Access)> = Default::default();
    let mut add = |m: &Merged<K>, o: usize| {
        if let Some(acc) = m.p.operands[o].renamed(m.axis) {
            keys.insert((m.kids[o], acc));
        }
    };
    let c_loads = consumer
        .p
        .loaded(consumer.p.outputs.iter().map(|o| o.value));
    for o in (0..c_loads.len()).filter(|&o| c_loads[o] && o != i) {
        add(consumer, o);
    }
    if c_loads[i] {
        let p_loads = producer.p.loaded([producer.p.outputs[0].value].into_iter());
        for o in (0..p_loads.len()).filter(|&o| p_loads[o]) {
            add(producer, o);
        }
    }
    keys.len()
}

/// Builds a merged program instruction by instruction, sharing identical operands,
/// instructions and phases.
struct Merge<'a, K> {
    out: &'a mut Program,
    kids: &'a mut Vec<K>,
    memo: HashMap<Inst, u32>,
    operand_memo: HashMap<(K, Access), u32>,
}

/// One program being copied into a [`Merge`].
struct Source<'p, K> {
    p: &'p Program,
    kids: &'p [K],
    axis: &'p dyn Fn(Axis) -> Axis,
    /// Loads of these operands become these instructions of the result.
    replace: &'p [(u32, u32)],
    ids: Vec<Option<u32>>,
    phases: Vec<Option<u8>>,
}

impl<'a, K: Copy + Eq + std::hash::Hash> Merge<'a, K> {
    fn new(out: &'a mut Program, kids: &'a mut Vec<K>) -> Self {
        Merge {
            out,
            kids,
            memo: HashMap::default(),
            operand_memo: HashMap::default(),
        }
    }

    fn push(&mut self, inst: Inst) -> u32 {
        if let Some(&i) = self.memo.get(&inst) {
            return i;
        }
        let i = self.out.insts.len() as u32;
        self.out.insts.push(inst.clone());
        self.memo.insert(inst, i);
        i
    }

    /// The result's index of phase `k` of `src`, copying it (and what it needs) on first use;
    /// an identical phase already in the result is shared.
    fn phase(&mut self, src: &mut Source<K>, k: usize) -> u8 {
        if let Some(n) = src.phases[k] {
            return n;
        }
        let ph = src.p.phases[k];
        let value = self.inst(src, ph.value as usize);
        let phase = Phase {
            combine: ph.combine,
            value,
        };
        let n = match self.out.phases.iter().position(|q| *q == phase) {
            Some(n) => n,
            None => {
                self.out.phases.push(phase);
                self.out.phases.len() - 1
            }
        } as u8;
        src.phases[k] = Some(n);
        n
    }

    /// The result's index of instruction `i` of `src`, copying it on first use.
    fn inst(&mut self, src: &mut Source<K>, i: usize) -> u32 {
        if let Some(id) = src.ids[i] {
            return id;
        }
        let new = match &src.p.insts[i] {
            Inst::Load(o) if let Some(&(_, to)) = src.replace.iter().find(|(t, _)| t == o) => to,
            Inst::Load(o) => {
                // callers check that every access renames (`inline`, `merge_siblings`)
                let acc = src.p.operands[*o as usize]
                    .renamed(src.axis)
                    .expect("the access renames");
                let key = (src.kids[*o as usize], acc);
                let slot = match self.operand_memo.get(&key) {
                    Some(&s) => s,
                    None => {
                        self.out.operands.push(key.1.clone());
                        self.kids.push(key.0);
                        let s = (self.out.operands.len() - 1) as u32;
                        self.operand_memo.insert(key, s);
                        s
                    }
                };
                self.push(Inst::Load(slot))
            }
            Inst::Const(c) => self.push(Inst::Const(*c)),
            Inst::Coord(k) => match (src.axis)(Axis::Space(*k)) {
                Axis::Space(n) => self.push(Inst::Coord(n)),
                _ => self.push(Inst::Const(0f32.to_bits())),
            },
            Inst::Map(s, args) => {
                let (s, args) = (*s, args.clone());
                let args = args.iter().map(|&a| self.inst(src, a as usize)).collect();
                self.push(Inst::Map(s, args))
            }
            Inst::Reduced(k) => {
                let n = self.phase(src, *k as usize);
                self.push(Inst::Reduced(n))
            }
        };
        src.ids[i] = Some(new);
        new
    }

    /// Copies `p` with its axes renamed by `axis`: its phases in order, then (for a program that
    /// keeps its outputs) its outputs; `replace` substitutes the loads of operands. Returns
    /// the result's index of every instruction of `p` that was copied.
    fn copy(
        &mut self,
        p: &Program,
        kids: &[K],
        axis: &dyn Fn(Axis) -> Axis,
        replace: &[(u32, u32)],
        keep_outputs: bool,
    ) -> Vec<Option<u32>> {
        let mut src = Source {
            p,
            kids,
            axis,
            replace,
            ids: vec![None; p.insts.len()],
            phases: vec![None; p.phases.len()],
        };
        for k in 0..p.phases.len() {
            self.phase(&mut src, k);
        }
        for o in &p.outputs {
            let value = self.inst(&mut src, o.value as usize);
            if keep_outputs {
                let access = Access {
                    dtype: o.access.dtype,
                    axes: o.access.axes.iter().map(|&a| axis(a)).collect(),
                };
                self.out.outputs.push(Output { value, access });
            }
        }
        src.ids
    }
}

/// Merges two programs into one kernel with the outputs of both, sharing operands, instructions
/// and phases: siblings (independent programs of one iteration space: multi-output fusion), or
/// `b` reading outputs of `a` (`a_outputs` names the value each output of `a` is), each read
/// where `a` writes it, which `b` then takes from `a`'s instructions instead of loading. A
/// dependent elementwise `b` over `a`'s domain and reduce axes joins `a`'s loop over the row (a
/// layer norm's statistics and its normalized rows in one pass over the row) when the rows are
/// at most [`MAX_JOINED_ROW`] points long. `None` when the
/// spaces do not line up, `b` reads an output of `a` elsewhere than where it is written, or the
/// result passes the size limits.
pub fn merge_siblings<K: Copy + Eq + std::hash::Hash>(
    a: &Bound<K>,
    b: &Bound<K>,
    a_outputs: &[K],
) -> Option<Bound<K>> {
    let (pa, pb) = (&a.program, &b.program);
    let reads: Vec<(u32, usize)> = b
        .operands
        .iter()
        .enumerate()
        .filter_map(|(o, k)| Some((o as u32, a_outputs.iter().position(|x| x == k)?)))
        .collect();
    // `b`'s space axis `k` is `a`'s space axis `onto[k]` (`None`: an extent-1 axis)
    let onto: Vec<Option<u8>> = if pa.domain == pb.domain && pa.reduce == pb.reduce {
        (0..pa.domain.len() + pa.reduce.len())
            .map(|k| Some(k as u8))
            .collect()
    } else if !reads.is_empty()
        && pb.reduce.is_empty()
        && !pa.reduce.is_empty()
        && pa.reduce.iter().product::<usize>() <= MAX_JOINED_ROW
    {
        rows_onto(pa, &pb.domain)?
    } else {
        return None;
    };
    let b_axis = |x: Axis| match x {
        Axis::Space(k) => onto[k as usize].map_or(Axis::One, Axis::Space),
        other => other,
    };
    // `b` reads `a`'s outputs where `a` writes them, not through windows, and its windowed
    // operands keep their axes
    if reads
        .iter()
        .any(|&(o, _)| pb.operands[o as usize].is_shifted())
        || pb.operands.iter().any(|acc| acc.renamed(&b_axis).is_none())
    {
        return None;
    }
    // where `b` reads output `j`, it reads the point `a` writes (extent-1 axes alike)
    let point = |acc: &Access, axis: &dyn Fn(Axis) -> Axis| -> Vec<Option<Axis>> {
        acc.axes
            .iter()
            .map(|&x| match axis(x) {
                Axis::Space(k) => Some(Axis::Space(k)),
                // not a read of `a`'s outputs (checked above)
                Axis::Shifted { .. } | Axis::One | Axis::Collapsed(_) => None,
            })
            .collect()
    };
    if reads.iter().any(|&(o, j)| {
        point(&pb.operands[o as usize], &b_axis) != point(&pa.outputs[j].access, &|x| x)
    }) {
        return None;
    }
    let mut out = Program {
        domain: pa.domain.clone(),
        reduce: pa.reduce.clone(),
        operands: Vec::new(),
        insts: Vec::new(),
        phases: Vec::new(),
        outputs: Vec::new(),
    };
    let mut kids = Vec::new();
    let mut merge = Merge::new(&mut out, &mut kids);
    let same = |a: Axis| a;
    let ids = merge.copy(pa, &a.operands, &same, &[], true);
    let replace: Vec<(u32, u32)> = reads
        .iter()
        .map(|&(o, j)| {
            (
                o,
                ids[pa.outputs[j].value as usize].expect("outputs are copied"),
            )
        })
        .collect();
    merge.copy(pb, &b.operands, &b_axis, &replace, true);
    let (out, kids) = simplified_with(&out, kids);
    if out.insts.len() > MAX_INSTS || kids.len() > MAX_OPERANDS || out.phases.len() > MAX_PHASES {
        return None;
    }
    out.check().ok()?;
    Some(Bound {
        program: out,
        operands: kids,
    })
}

/// Longest row an elementwise reader joins: a row kernel gives each row at most one workgroup,
/// so a reader joining long rows (a whole-tensor reduction and its reader, as gradient clipping
/// by the global norm has) would run on a few workgroups instead of across the GPU. At 4096
/// points a lane of a 256-lane workgroup takes at most 16 of the reader's points.
const MAX_JOINED_ROW: usize = 4096;

/// How an elementwise program over `domain` lines up with the rows of `a` (a program with
/// reduce axes) when it joins `a`'s loop over the row: its axes in order are `a`'s domain and
/// reduce axes in order, leaving out axes of extent 1 on either side (a reduction that keeps
/// its reduced axis has one). Returns `a`'s axis for each axis of `domain`, or `None` when the
/// extents differ.
fn rows_onto(a: &Program, domain: &[usize]) -> Option<Vec<Option<u8>>> {
    let a_axes: Vec<usize> = a.wide_axes().collect();
    let mut next = a_axes.iter();
    let onto: Vec<Option<u8>> = domain
        .iter()
        .map(|&n| match n {
            1 => Some(None),
            n => next
                .next()
                .filter(|&&k| a.extent(k) == n)
                .map(|&k| Some(k as u8)),
        })
        .collect::<Option<_>>()?;
    // every reduce axis of `a` is reached, or the rows would not be whole
    let reduce_reached = (a.domain.len()..a.domain.len() + a.reduce.len())
        .all(|k| a.extent(k) == 1 || onto.contains(&Some(k as u8)));
    (next.next().is_none() && reduce_reached).then_some(onto)
}

/// How two programs' spaces combine when a producer is fused into a consumer.
#[derive(Debug)]
struct LineUp {
    domain: Vec<usize>,
    reduce: Vec<usize>,
    /// New space axis of each consumer space axis.
    consumer: Vec<usize>,
    /// New axis of each producer space axis (`Axis::One` for extent-1 axes).
    producer: Vec<Axis>,
}

/// The space of the program that fuses `producer` into `consumer` through the operand the
/// consumer reads with `access`, or `None` when fusing would be wrong or would recompute a
/// reduction per consumer point.
///
/// The producer's output axes name, through `access`, the consumer axis each producer axis
/// becomes. Producer reduce axes are bound variables: those its output does not name (a
/// reduction read back broadcast, `x − max(x)`) take a consumer axis the operand is broadcast
/// along, of equal extent, which moves to the reduce side (one reduction per row), or else
/// fresh reduce axes when every consumer axis is already a producer domain axis (a per-row
/// epilogue). When both programs reduce, the producer's reduce axes become the consumer's.
fn line_up(consumer: &Program, access: &Access, producer: &Program) -> Option<LineUp> {
    if access.is_shifted() {
        return None;
    }
    let (p_d, p_r) = (producer.domain.len(), producer.reduce.len());
    let (c_d, c_r) = (consumer.domain.len(), consumer.reduce.len());
    let mut sigma: Vec<Option<Axis>> = vec![None; p_d + p_r];
    let out = &producer.outputs[0].access;
    if out.axes.len() != access.axes.len() {
        return None;
    }
    // 1. What the output access names.
    let mut hints: Vec<(usize, usize)> = Vec::new(); // (producer reduce axis, tensor position)
    for (j, (&pa, &ca)) in out.axes.iter().zip(&access.axes).enumerate() {
        match (pa, ca) {
            (Axis::Space(k), Axis::Space(a)) => {
                if producer.extent(k as usize) != consumer.extent(a as usize) {
                    return None;
                }
                match sigma[k as usize] {
                    None => sigma[k as usize] = Some(Axis::Space(a)),
                    Some(prev) if prev == Axis::Space(a) => {}
                    Some(_) => return None,
                }
            }
            (Axis::Space(k), _) => {
                if producer.extent(k as usize) != 1 {
                    return None;
                }
                sigma[k as usize] = Some(Axis::One);
            }
            (Axis::Collapsed(r), _) => hints.push((r as usize, j)),
            (Axis::One, _) => {}
            // outputs are not windowed (`Program::check`)
            (Axis::Shifted { .. }, _) => return None,
        }
    }
    for (k, s) in sigma.iter_mut().enumerate().take(p_d) {
        if s.is_none() {
            if producer.domain[k] != 1 {
                return None;
            }
            *s = Some(Axis::One);
        }
    }
    let named = |s: &[Option<Axis>], range: std::ops::Range<usize>| -> Vec<usize> {
        range
            .filter_map(|k| match s[k] {
                Some(Axis::Space(a)) => Some(a as usize),
                _ => None,
            })
            .collect()
    };
    let p_dom = named(&sigma, 0..p_d);
    // 2. The producer's remaining reduce axes.
    let free_reduce: Vec<usize> = (0..p_r).filter(|&r| sigma[p_d + r].is_none()).collect();
    let mut fresh: Vec<usize> = Vec::new(); // producer reduce axes that get new axes
    if !free_reduce.is_empty() {
        // candidate consumer axes: not named by the producer's output, not read by this operand
        let read: Vec<usize> = access.space_axes().collect();
        let pool: Vec<usize> = if c_r == 0 {
            (0..c_d)
                .filter(|a| !p_dom.contains(a) && !read.contains(a))
                .collect()
        } else {
            (c_d..c_d + c_r).filter(|a| !read.contains(a)).collect()
        };
        let mut taken: Vec<usize> = named(&sigma, p_d..p_d + p_r);
        for &r in &free_reduce {
            let extent = producer.reduce[r];
            let fits = |a: &usize| consumer.extent(*a) == extent && !taken.contains(a);
            // the consumer axis at the collapsed axis' tensor position, as other tensors of the
            // consumer index that position
            let hinted = hints.iter().find(|h| h.0 == r).and_then(|&(_, pos)| {
                pool.iter().copied().filter(fits).find(|&a| {
                    let at_pos = |acc: &Access| acc.axes.get(pos) == Some(&Axis::Space(a as u8));
                    consumer.operands.iter().any(at_pos)
                        || consumer.outputs.iter().any(|o| at_pos(&o.access))
                })
            });
            let candidates: Vec<usize> = pool.iter().copied().filter(fits).collect();
            let chosen = hinted.or(if candidates.len() == 1 {
                Some(candidates[0])
            } else {
                None
            });
            match chosen {
                Some(a) => {
                    taken.push(a);
                    sigma[p_d + r] = Some(Axis::Space(a as u8));
                }
                None if c_r == 0 => fresh.push(r),
                None => return None,
            }
        }
    }
    let p_red = named(&sigma, p_d..p_d + p_r);
    // 3. Consistency.
    let mut all = p_dom.clone();
    all.extend(&p_red);
    let mut distinct = all.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() != all.len() {
        return None;
    }
    let consumer_map: Vec<usize>;
    let (domain, reduce);
    if c_r > 0 {
        if p_r > 0 {
            // the same rows, the same reduce axes
            let mut red = p_red.clone();
            red.sort_unstable();
            if red != (c_d..c_d + c_r).collect::<Vec<_>>()
                || p_dom.iter().any(|&a| a >= c_d)
                || (0..c_d).any(|a| !p_dom.contains(&a) && consumer.domain[a] != 1)
            {
                return None;
            }
        }
        consumer_map = (0..c_d + c_r).collect();
        domain = consumer.domain.clone();
        reduce = consumer.reduce.clone();
    } else if p_r > 0 {
        // consumer axes named by the producer's reduce axes move to the reduce side; every
        // other consumer axis must be a producer domain axis (no reduction recomputed)
        if (0..c_d).any(|a| !p_dom.contains(&a) && !p_red.contains(&a) && consumer.domain[a] != 1) {
            return None;
        }
        let kept: Vec<usize> = (0..c_d).filter(|a| !p_red.contains(a)).collect();
        let mut map = vec![0; c_d];
        for (new, &old) in kept.iter().enumerate() {
            map[old] = new;
        }
        domain = kept.iter().map(|&a| consumer.domain[a]).collect::<Vec<_>>();
        let mut red_axes: Vec<usize> = Vec::new();
        for r in 0..p_r {
            if let Some(Axis::Space(a)) = sigma[p_d + r] {
                map[a as usize] = kept.len() + red_axes.len();
                red_axes.push(consumer.domain[a as usize]);
            } else {
                debug_assert!(fresh.contains(&r));
                sigma[p_d + r] = Some(Axis::Space((c_d + red_axes.len()) as u8));
                red_axes.push(producer.reduce[r]);
            }
        }
        // fresh axes were numbered from c_d; renumber them into the new space
        for r in &fresh {
            if let Some(Axis::Space(a)) = sigma[p_d + r] {
                let new = kept.len() + (a as usize - c_d);
                sigma[p_d + r] = Some(Axis::Space(new as u8));
            }
        }
        // producer axes named through the consumer are renamed with the consumer's
        for (k, s) in sigma.iter_mut().enumerate() {
            if fresh.iter().any(|&r| p_d + r == k) {
                continue;
            }
            if let Some(Axis::Space(a)) = *s {
                *s = Some(Axis::Space(map[a as usize] as u8));
            }
        }
        consumer_map = map;
        reduce = red_axes;
        return Some(LineUp {
            domain,
            reduce,
            consumer: consumer_map,
            producer: sigma.into_iter().map(|s| s.expect("placed")).collect(),
        });
    } else {
        consumer_map = (0..c_d).collect();
        domain = consumer.domain.clone();
        reduce = Vec::new();
    }
    Some(LineUp {
        domain,
        reduce,
        consumer: consumer_map,
        producer: sigma.into_iter().map(|s| s.expect("placed")).collect(),
    })
}
