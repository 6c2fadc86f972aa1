//! Lowering: a verified, composite-free graph becomes a [`Schedule`] — buffers, and an ordered
//! list of kernel steps over views of them.
//!
//! View ops produce views and no step. Scalar constants and `iota` feeding elementwise ops are
//! folded into the consumer's body. Values no output or assign needs are not computed.
//!
//! **Invariant:** every step writes only fresh buffers (or disjoint slices of one fresh buffer,
//! for `concat`), so steps never overwrite a value that is still to be read.

use sinter_ir::key;
use std::collections::HashMap;

use sinter_ir::types::contiguous_strides;
use sinter_ir::{DType, Graph, Node, Op, TensorType, ValueDef, ValueId};

use crate::error::CompileError;
use crate::kernel::*;
use crate::layout::{BufferId, View};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferKind {
    /// Computed during a run.
    Temp,
    /// Written by the caller before a run.
    Input(ValueId),
    /// Lives across runs at a fixed place.
    Persistent(ValueId),
}

#[derive(Clone, Debug)]
pub struct Buffer {
    pub ty: TensorType,
    pub kind: BufferKind,
    /// Names of the values stored in it, for the arena map.
    pub label: String,
}

#[derive(Clone, Debug)]
pub struct Step {
    pub plan: KernelPlan,
    /// The source ops this step implements, as `value = op`.
    pub ops: Vec<String>,
}

/// A named tensor the caller reads after a run: a contiguous view.
#[derive(Clone, Debug)]
pub struct OutputView {
    pub name: String,
    pub ty: TensorType,
    pub view: View,
}

#[derive(Clone, Debug, Default)]
pub struct Schedule {
    pub buffers: Vec<Buffer>,
    pub steps: Vec<Step>,
    pub outputs: Vec<OutputView>,
    /// `assign target = source`: the persistent target's buffer and the source's contiguous view.
    pub assigns: Vec<(ValueId, View)>,
    /// i32 inputs read as indices, with the number of rows or classes they index.
    pub index_bounds: HashMap<ValueId, usize>,
}

pub fn lower(g: &Graph) -> Result<Schedule, CompileError> {
    let mut cx = Lowering {
        g,
        sched: Schedule::default(),
        views: HashMap::new(),
        needed: needed_values(g),
    };
    for v in g.value_ids() {
        let value = g.value(v);
        let kind = match value.def {
            ValueDef::Input => BufferKind::Input(v),
            ValueDef::Param(_) | ValueDef::State(_) => BufferKind::Persistent(v),
            ValueDef::Node { .. } => continue,
        };
        let view = cx.new_buffer(value.ty.clone(), kind, &value.name);
        cx.views.insert(v, view);
    }
    for node in &g.nodes {
        if node.outputs.iter().any(|o| cx.needed[o.index()]) {
            cx.lower_node(node)?;
        }
    }
    for &v in &g.outputs {
        let view = cx.contiguous_view(v)?;
        let value = g.value(v);
        cx.sched.outputs.push(OutputView {
            name: value.name.clone(),
            ty: value.ty.clone(),
            view,
        });
    }
    for a in &g.assigns {
        let view = cx.contiguous_view(a.source)?;
        cx.sched.assigns.push((a.target, view));
    }
    Ok(cx.sched)
}

/// Values that some output or assign depends on.
fn needed_values(g: &Graph) -> Vec<bool> {
    let mut needed = vec![false; g.values.len()];
    for &v in &g.outputs {
        needed[v.index()] = true;
    }
    for a in &g.assigns {
        needed[a.source.index()] = true;
    }
    for node in g.nodes.iter().rev() {
        if node.outputs.iter().any(|o| needed[o.index()]) {
            for &i in &node.inputs {
                needed[i.index()] = true;
            }
        }
    }
    needed
}

struct Lowering<'g> {
    g: &'g Graph,
    sched: Schedule,
    views: HashMap<ValueId, View>,
    needed: Vec<bool>,
}

/// What an elementwise body reads: a value, or something folded into the body.
enum Source {
    Value(ValueId),
    Const(f32),
    /// Index along this axis of the output.
    Coord(usize),
}

impl Lowering<'_> {
    fn new_buffer(&mut self, ty: TensorType, kind: BufferKind, label: &str) -> View {
        let id = BufferId(self.sched.buffers.len() as u32);
        let view = View::contiguous(id, &ty.shape);
        self.sched.buffers.push(Buffer {
            ty,
            kind,
            label: label.to_string(),
        });
        view
    }

    /// Allocates `out`'s buffer, pushes the step `make` builds around its view, and binds it.
    fn write_new(&mut self, out: ValueId, label: String, make: impl FnOnce(View) -> KernelPlan) {
        let dst = self.temp(out);
        self.push(make(dst.clone()), vec![label]);
        self.views.insert(out, dst);
    }

    /// Records that the input behind `view` (if it is one) indexes `bound` rows or classes.
    fn note_index_input(&mut self, view: &View, bound: usize) {
        if let BufferKind::Input(input) = self.sched.buffers[view.buffer.0 as usize].kind {
            let entry = self.sched.index_bounds.entry(input).or_insert(bound);
            *entry = (*entry).min(bound);
        }
    }

    fn temp(&mut self, v: ValueId) -> View {
        let value = self.g.value(v);
        self.new_buffer(value.ty.clone(), BufferKind::Temp, &value.name)
    }

    fn dtype(&self, v: ValueId) -> DType {
        self.g.ty(v).dtype
    }

    fn op_label(&self, node: &Node) -> String {
        let names: Vec<&str> = node.outputs.iter().map(|&o| self.g.name_of(o)).collect();
        format!("{} = {}", names.join(", "), node.op.name())
    }

    fn push(&mut self, plan: KernelPlan, ops: Vec<String>) {
        self.sched.steps.push(Step { plan, ops });
    }

    /// The view of a value, materializing folded constants when a non-elementwise op needs them.
    fn view(&mut self, v: ValueId) -> Result<View, CompileError> {
        if let Some(view) = self.views.get(&v) {
            return Ok(view.clone());
        }
        let node = self
            .g
            .node(self.g.producer(v).expect("declarations have views"));
        let label = self.op_label(node);
        let source = self.fold(v).expect("only folded values lack views");
        let out = self.temp(v);
        let shape = out.shape.clone();
        self.elementwise(
            &shape,
            &[source],
            &[(out.clone(), DType::F32)],
            label,
            |_, loads| vec![loads[0]],
        );
        self.views.insert(v, out.clone());
        Ok(out)
    }

    /// A scalar constant or an iota, which elementwise consumers compute in place.
    fn fold(&self, v: ValueId) -> Option<Source> {
        let node = self.g.node(self.g.producer(v)?);
        match node.op {
            Op::Constant => Some(Source::Const(node.attrs.of(key::VALUE) as f32)),
            Op::Iota => Some(Source::Coord(node.attrs.of(key::AXIS))),
            _ => None,
        }
    }

    fn source(&self, v: ValueId) -> Source {
        self.fold(v).unwrap_or(Source::Value(v))
    }

    fn contiguous_view(&mut self, v: ValueId) -> Result<View, CompileError> {
        let view = self.view(v)?;
        if view.is_contiguous() {
            return Ok(View {
                strides: contiguous_strides(&view.shape),
                ..view
            });
        }
        let out = self.temp(v);
        let label = format!("{} = copy", self.g.name_of(v));
        self.copy(&view, self.dtype(v), &out, label);
        Ok(out)
    }

    fn copy(&mut self, from: &View, dtype: DType, to: &View, label: String) {
        let e = Elementwise {
            shape: to.shape.clone(),
            inputs: vec![Operand {
                view: from.clone(),
                dtype,
            }],
            insts: vec![Inst::Load(0)],
            outputs: vec![(
                Operand {
                    view: to.clone(),
                    dtype,
                },
                0,
            )],
        };
        self.push(KernelPlan::Elementwise(e), vec![label]);
    }

    /// Emits an elementwise step over `shape`; `body` gets the instruction list and the load
    /// (or folded value) of each source, and returns the instruction stored to each output.
    fn elementwise(
        &mut self,
        shape: &[usize],
        sources: &[Source],
        outputs: &[(View, DType)],
        label: String,
        body: impl FnOnce(&mut Vec<Inst>, &[usize]) -> Vec<usize>,
    ) {
        let mut inputs: Vec<Operand> = Vec::new();
        let mut insts = Vec::new();
        let mut loads = Vec::new();
        for s in sources {
            let inst = match *s {
                Source::Value(v) => {
                    let view = self.views[&v].broadcast_to(shape);
                    let operand = Operand {
                        view,
                        dtype: self.dtype(v),
                    };
                    let i = match inputs.iter().position(|o| *o == operand) {
                        Some(i) => i,
                        None => {
                            inputs.push(operand);
                            inputs.len() - 1
                        }
                    };
                    Inst::Load(i)
                }
                Source::Const(c) => Inst::Const(c),
                Source::Coord(axis) => Inst::Coord(axis),
            };
            loads.push(intern(&mut insts, inst));
        }
        let results = body(&mut insts, &loads);
        let outputs = outputs
            .iter()
            .zip(results)
            .map(|((view, dtype), r)| {
                (
                    Operand {
                        view: view.clone(),
                        dtype: *dtype,
                    },
                    r,
                )
            })
            .collect();
        self.push(
            KernelPlan::Elementwise(Elementwise {
                shape: shape.to_vec(),
                inputs,
                insts,
                outputs,
            }),
            vec![label],
        );
    }

    /// Sources of an elementwise node, with iota axes shifted to the output's rank.
    fn sources(&mut self, node: &Node, out_rank: usize) -> Result<Vec<Source>, CompileError> {
        let mut sources = Vec::new();
        for &v in &node.inputs {
            let s = match self.source(v) {
                Source::Coord(axis) => {
                    let rank = self.g.ty(v).rank();
                    Source::Coord(axis + out_rank - rank)
                }
                Source::Value(v) => {
                    self.view(v)?;
                    Source::Value(v)
                }
                s => s,
            };
            sources.push(s);
        }
        Ok(sources)
    }

    fn lower_node(&mut self, node: &Node) -> Result<(), CompileError> {
        let label = self.op_label(node);
        let out = node.outputs[0];
        let out_ty = self.g.ty(out).clone();
        use Op::*;
        match node.op {
            Neg | Abs | Exp | Log | Sqrt | Rsqrt | Reciprocal | Square | Relu | Sigmoid | Tanh
            | Silu | Sin | Cos | Gelu => {
                let f = unary_fn(node);
                self.map(node, label, move |insts, l| {
                    vec![push(insts, Inst::Unary(f, l[0]))]
                })?;
            }
            Add | Sub | Mul | Div | Pow | Maximum | Minimum | Eq | Lt | Le | Gt | Ge => {
                let f = binary_fn(node.op);
                self.map(node, label, move |insts, l| {
                    vec![push(insts, Inst::Binary(f, l[0], l[1]))]
                })?;
            }
            Where => self.map(node, label, |insts, l| {
                vec![push(insts, Inst::Select(l[0], l[1], l[2]))]
            })?,
            Cast => {
                let dtype = out_ty.dtype;
                self.map(node, label, move |insts, l| {
                    vec![push(insts, Inst::Cast(dtype, l[0]))]
                })?;
            }
            // Folded into consumers; materialized by `view` if a non-elementwise op reads them.
            Constant | Iota => {}
            Sum | Mean | Max | Min | Logsumexp => {
                let kind = match node.op {
                    Sum => RowKind::Sum,
                    Mean => RowKind::Mean,
                    Max => RowKind::Max,
                    Min => RowKind::Min,
                    _ => RowKind::Logsumexp,
                };
                let axes = node.attr(key::AXES);
                self.reduce(node, kind, &axes, label)?;
            }
            Argmax => {
                let axis = node.attr(key::AXIS);
                self.reduce(node, RowKind::Argmax, &[axis], label)?;
            }
            Reshape => {
                let x = self.view(node.inputs[0])?;
                let view = match x.reshape(&out_ty.shape) {
                    Some(v) => v,
                    None => {
                        let tmp = self.temp(out);
                        let dense = View::contiguous(tmp.buffer, &x.shape);
                        self.copy(&x, out_ty.dtype, &dense, label);
                        tmp
                    }
                };
                self.views.insert(out, view);
            }
            Permute => {
                let perm = node.attr(key::PERM);
                let v = self.view(node.inputs[0])?.permute(&perm);
                self.views.insert(out, v);
            }
            Transpose => {
                let (d0, d1) = (node.attr(key::DIM0), node.attr(key::DIM1));
                let mut perm: Vec<usize> = (0..out_ty.rank()).collect();
                perm.swap(d0, d1);
                let v = self.view(node.inputs[0])?.permute(&perm);
                self.views.insert(out, v);
            }
            BroadcastTo => {
                let v = self.view(node.inputs[0])?.broadcast_to(&out_ty.shape);
                self.views.insert(out, v);
            }
            Unsqueeze => {
                let v = self
                    .view(node.inputs[0])?
                    .unsqueeze(node.attrs.of(key::AXIS));
                self.views.insert(out, v);
            }
            Squeeze => {
                let v = self.view(node.inputs[0])?.squeeze(node.attrs.of(key::AXIS));
                self.views.insert(out, v);
            }
            Slice => {
                let axis = node.attr(key::AXIS);
                let (start, step) = (node.attr(key::START), node.attr(key::STEP));
                let v = self
                    .view(node.inputs[0])?
                    .slice(axis, start, out_ty.shape[axis], step);
                self.views.insert(out, v);
            }
            Concat => {
                let axis = node.attr(key::AXIS);
                let dst = self.temp(out);
                let mut at = 0;
                for &x in &node.inputs {
                    let xv = self.view(x)?;
                    let len = xv.shape[axis];
                    let part = dst.slice(axis, at, len, 1);
                    self.copy(&xv, out_ty.dtype, &part, label.clone());
                    at += len;
                }
                self.views.insert(out, dst);
            }
            Matmul => self.matmul(node, label)?,
            Softmax | LogSoftmax => {
                let kind = if node.op == Softmax {
                    RowKind::Softmax
                } else {
                    RowKind::LogSoftmax
                };
                let axis = node.attr(key::AXIS);
                self.row_map(node, kind, &[axis], label)?;
            }
            LayerNorm | RmsNorm => {
                let eps = node.attr(key::EPS) as f32;
                let kind = if node.op == LayerNorm {
                    RowKind::LayerNorm { eps }
                } else {
                    RowKind::RmsNorm { eps }
                };
                let last = out_ty.rank() - 1;
                self.row_map(node, kind, &[last], label)?;
            }
            GroupNorm => self.group_norm(node, label)?,
            Conv2d => {
                let x = self.view(node.inputs[0])?;
                let w = self.view(node.inputs[1])?;
                let bias = match node.inputs.get(2) {
                    Some(&b) => Some(self.view(b)?),
                    None => None,
                };
                self.write_new(out, label, |out| {
                    KernelPlan::Conv2d(crate::kernel::Conv2d {
                        x,
                        w,
                        bias,
                        out,
                        stride: pair(node, key::STRIDE),
                        padding: pair(node, key::PADDING),
                        dilation: pair(node, key::DILATION),
                        groups: node.attr(key::GROUPS),
                    })
                });
            }
            MaxPool2d | AvgPool2d => {
                let x = self.view(node.inputs[0])?;
                self.write_new(out, label, |out| {
                    KernelPlan::Pool2d(Pool2d {
                        max: node.op == MaxPool2d,
                        x,
                        out,
                        kernel: pair(node, key::KERNEL),
                        stride: pair(node, key::STRIDE),
                        padding: pair(node, key::PADDING),
                    })
                });
            }
            Embedding => {
                let table = self.view(node.inputs[0])?;
                let ids = self.view(node.inputs[1])?;
                self.note_index_input(&ids, table.shape[0]);
                self.write_new(out, label, |out| {
                    KernelPlan::Gather(Gather { table, ids, out })
                });
            }
            Conv2dGradInput | Conv2dGradWeight => {
                let a = self.view(node.inputs[0])?;
                let b = self.view(node.inputs[1])?;
                self.write_new(out, label, |out| {
                    KernelPlan::Conv2dGrad(Conv2dGrad {
                        wrt_weight: node.op == Conv2dGradWeight,
                        a,
                        b,
                        out,
                        stride: pair(node, key::STRIDE),
                        padding: pair(node, key::PADDING),
                        dilation: pair(node, key::DILATION),
                        groups: node.attr(key::GROUPS),
                    })
                });
            }
            MaxPool2dGrad | AvgPool2dGrad => {
                let (x, dy) = if node.op == MaxPool2dGrad {
                    (Some(self.view(node.inputs[0])?), self.view(node.inputs[1])?)
                } else {
                    (None, self.view(node.inputs[0])?)
                };
                self.write_new(out, label, |out| {
                    KernelPlan::Pool2dGrad(Pool2dGrad {
                        x,
                        dy,
                        out,
                        kernel: pair(node, key::KERNEL),
                        stride: pair(node, key::STRIDE),
                        padding: pair(node, key::PADDING),
                    })
                });
            }
            EmbeddingGrad => {
                let dy = self.view(node.inputs[0])?;
                let ids = self.view(node.inputs[1])?;
                self.note_index_input(&ids, node.attr(key::NUM_EMBEDDINGS));
                self.write_new(out, label, |out| {
                    KernelPlan::ScatterAdd(ScatterAdd { dy, ids, out })
                });
            }
            SliceGrad => {
                let dy = self.view(node.inputs[0])?;
                self.write_new(out, label, |out| {
                    KernelPlan::SliceGrad(crate::kernel::SliceGrad {
                        dy,
                        out,
                        axis: node.attr(key::AXIS),
                        start: node.attr(key::START),
                        step: node.attr(key::STEP),
                    })
                });
            }
            CrossEntropy => self.cross_entropy(node, label)?,
            MseLoss => self.mse_loss(node, label)?,
            Sgd | Adam | AdamW => self.optimizer(node, label)?,
            Attention => {
                return Err(CompileError::Internal(
                    "attention must be expanded before lowering".into(),
                ));
            }
            Grad => {
                return Err(CompileError::NeedsAutodiff {
                    value: self.g.name_of(out).to_string(),
                });
            }
        }
        Ok(())
    }

    /// One elementwise step computing every result of `node` over the output shape.
    fn map(
        &mut self,
        node: &Node,
        label: String,
        body: impl FnOnce(&mut Vec<Inst>, &[usize]) -> Vec<usize>,
    ) -> Result<(), CompileError> {
        let shape = self.g.ty(node.outputs[0]).shape.clone();
        let sources = self.sources(node, shape.len())?;
        let mut outs = Vec::new();
        for &o in &node.outputs {
            let view = self.temp(o);
            self.views.insert(o, view.clone());
            outs.push((view, self.dtype(o)));
        }
        self.elementwise(&shape, &sources, &outs, label, body);
        Ok(())
    }

    fn row_operand(
        &self,
        view: &View,
        dtype: DType,
        kept: &[usize],
        reduced: &[usize],
    ) -> RowOperand {
        RowOperand {
            buffer: view.buffer,
            dtype,
            offset: view.offset,
            kept_strides: view.axes(kept).1,
            reduced_strides: view.axes(reduced).1,
        }
    }

    /// A reduction to one value per row: output contiguous in kept order.
    fn reduce(
        &mut self,
        node: &Node,
        kind: RowKind,
        axes: &[usize],
        label: String,
    ) -> Result<(), CompileError> {
        let x = node.inputs[0];
        let xv = self.view(x)?;
        let kept: Vec<usize> = (0..xv.rank()).filter(|a| !axes.contains(a)).collect();
        let (kept_shape, _) = xv.axes(&kept);
        let (reduced_shape, _) = xv.axes(axes);
        let input = self.row_operand(&xv, self.dtype(x), &kept, axes);
        let out = node.outputs[0];
        let dst = self.temp(out);
        let output = RowOperand {
            buffer: dst.buffer,
            dtype: self.dtype(out),
            offset: 0,
            kept_strides: contiguous_strides(&kept_shape),
            reduced_strides: vec![0; axes.len()],
        };
        let rows = Rows {
            kind,
            kept: kept_shape,
            reduced: reduced_shape,
            inputs: vec![input],
            outputs: vec![output],
        };
        self.push(KernelPlan::Rows(rows), vec![label]);
        self.views.insert(out, dst);
        Ok(())
    }

    /// A row kernel whose output has the input's shape (softmax, norms): every input is
    /// broadcast to the output shape and split into kept and reduced axes.
    fn row_map(
        &mut self,
        node: &Node,
        kind: RowKind,
        axes: &[usize],
        label: String,
    ) -> Result<(), CompileError> {
        let out = node.outputs[0];
        let shape = self.g.ty(out).shape.clone();
        let dst = self.temp(out);
        let rows = self.row_map_views(node, kind, &shape, axes, dst.clone(), |_, v| {
            v.broadcast_to(&shape)
        })?;
        self.push(KernelPlan::Rows(rows), vec![label]);
        self.views.insert(out, dst);
        Ok(())
    }

    fn row_map_views(
        &mut self,
        node: &Node,
        kind: RowKind,
        shape: &[usize],
        axes: &[usize],
        dst: View,
        shape_view: impl Fn(usize, &View) -> View,
    ) -> Result<Rows, CompileError> {
        let kept: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
        let mut inputs = Vec::new();
        for (i, &v) in node.inputs.iter().enumerate() {
            let view = shape_view(i, &self.view(v)?);
            inputs.push(self.row_operand(&view, self.dtype(v), &kept, axes));
        }
        let dst_view = shape_view(usize::MAX, &dst);
        let output = self.row_operand(&dst_view, DType::F32, &kept, axes);
        let full = View::contiguous(dst.buffer, shape);
        Ok(Rows {
            kind,
            kept: full.axes(&kept).0,
            reduced: full.axes(axes).0,
            inputs,
            outputs: vec![output],
        })
    }

    fn group_norm(&mut self, node: &Node, label: String) -> Result<(), CompileError> {
        let out = node.outputs[0];
        let shape = self.g.ty(out).shape.clone();
        let groups = node.attr(key::GROUPS);
        let (c, per_group) = (shape[1], shape[1] / groups);
        // View [N, C, *S] as [N, G, C/G, *S]; reduce everything but N and G.
        let mut split = shape.clone();
        split.splice(1..2, [groups, per_group]);
        let axes: Vec<usize> = (2..split.len()).collect();
        let dst = self.temp(out);
        let eps = node.attr(key::EPS) as f32;
        let rank = shape.len();
        let rows = self.row_map_views(
            node,
            RowKind::LayerNorm { eps },
            &split,
            &axes,
            dst.clone(),
            |i, v| {
                if i == 0 || i == usize::MAX {
                    v.split_axis(1, &[groups, per_group])
                } else {
                    // gamma/beta [C] → [1, C, 1...] → broadcast → split.
                    let mut per_channel = v.clone();
                    per_channel = per_channel.unsqueeze(0);
                    for _ in 2..rank {
                        per_channel = per_channel.unsqueeze(per_channel.rank());
                    }
                    debug_assert_eq!(per_channel.shape[1], c);
                    per_channel
                        .broadcast_to(&shape)
                        .split_axis(1, &[groups, per_group])
                }
            },
        )?;
        self.push(KernelPlan::Rows(rows), vec![label]);
        self.views.insert(out, dst);
        Ok(())
    }

    fn matmul(&mut self, node: &Node, label: String) -> Result<(), CompileError> {
        let (a, b) = (node.inputs[0], node.inputs[1]);
        let mut av = self.view(a)?;
        let mut bv = self.view(b)?;
        if av.rank() == 1 {
            av = av.unsqueeze(0);
        }
        if bv.rank() == 1 {
            bv = bv.unsqueeze(1);
        }
        let (m, k) = (av.shape[av.rank() - 2], av.shape[av.rank() - 1]);
        let n = bv.shape[bv.rank() - 1];
        let batch = sinter_ir::types::broadcast_shapes(
            &av.shape[..av.rank() - 2],
            &bv.shape[..bv.rank() - 2],
        )
        .expect("verified");
        let full = |mut s: Vec<usize>, x: usize, y: usize| {
            s.extend([x, y]);
            s
        };
        let av = av.broadcast_to(&full(batch.clone(), m, k));
        let bv = bv.broadcast_to(&full(batch.clone(), k, n));
        let out = node.outputs[0];
        let dst = self.temp(out);
        let out_view = View::contiguous(dst.buffer, &full(batch.clone(), m, n));
        let plan = crate::kernel::Matmul {
            batch,
            m,
            n,
            k,
            a: av,
            b: bv,
            out: out_view,
        };
        self.push(KernelPlan::Matmul(plan), vec![label]);
        self.views.insert(out, dst);
        Ok(())
    }

    fn cross_entropy(&mut self, node: &Node, label: String) -> Result<(), CompileError> {
        let (logits, labels) = (node.inputs[0], node.inputs[1]);
        let lv = self.view(logits)?;
        let yv = self.view(labels)?;
        self.note_index_input(&yv, lv.shape[1]);
        let yv = yv.unsqueeze(1).broadcast_to(&lv.shape);
        let n = lv.shape[0];
        let out = node.outputs[0];
        let reduction = node.attr(key::REDUCTION).to_string();
        let per_row_ty = TensorType::f32(vec![n]);
        let per_row = if reduction == "none" {
            self.temp(out)
        } else {
            self.new_buffer(
                per_row_ty,
                BufferKind::Temp,
                &format!("{}.rows", self.g.name_of(out)),
            )
        };
        let rows = Rows {
            kind: RowKind::CrossEntropy,
            kept: vec![n],
            reduced: vec![lv.shape[1]],
            inputs: vec![
                self.row_operand(&lv, DType::F32, &[0], &[1]),
                self.row_operand(&yv, DType::I32, &[0], &[1]),
            ],
            outputs: vec![RowOperand {
                buffer: per_row.buffer,
                dtype: DType::F32,
                offset: 0,
                kept_strides: vec![1],
                reduced_strides: vec![0],
            }],
        };
        self.push(KernelPlan::Rows(rows), vec![label.clone()]);
        if reduction == "none" {
            self.views.insert(out, per_row);
            return Ok(());
        }
        let kind = if reduction == "mean" {
            RowKind::Mean
        } else {
            RowKind::Sum
        };
        let dst = self.temp(out);
        let total = Rows {
            kind,
            kept: vec![],
            reduced: vec![n],
            inputs: vec![RowOperand {
                buffer: per_row.buffer,
                dtype: DType::F32,
                offset: 0,
                kept_strides: vec![],
                reduced_strides: vec![1],
            }],
            outputs: vec![RowOperand {
                buffer: dst.buffer,
                dtype: DType::F32,
                offset: 0,
                kept_strides: vec![],
                reduced_strides: vec![0],
            }],
        };
        self.push(KernelPlan::Rows(total), vec![label]);
        self.views.insert(out, dst);
        Ok(())
    }

    fn mse_loss(&mut self, node: &Node, label: String) -> Result<(), CompileError> {
        let reduction = node.attr(key::REDUCTION).to_string();
        if reduction == "none" {
            return self.map(node, label, |insts, l| {
                let d = push(insts, Inst::Binary(BinaryFn::Sub, l[0], l[1]));
                vec![push(insts, Inst::Unary(UnaryFn::Square, d))]
            });
        }
        let shape = self.g.ty(node.inputs[0]).shape.clone();
        let axes: Vec<usize> = (0..shape.len()).collect();
        let mut inputs = Vec::new();
        for &v in &node.inputs {
            let view = self.view(v)?;
            inputs.push(self.row_operand(&view, DType::F32, &[], &axes));
        }
        let out = node.outputs[0];
        let dst = self.temp(out);
        let rows = Rows {
            kind: RowKind::SquaredError {
                mean: reduction == "mean",
            },
            kept: vec![],
            reduced: shape,
            inputs,
            outputs: vec![RowOperand {
                buffer: dst.buffer,
                dtype: DType::F32,
                offset: 0,
                kept_strides: vec![],
                reduced_strides: vec![0; axes.len()],
            }],
        };
        self.push(KernelPlan::Rows(rows), vec![label]);
        self.views.insert(out, dst);
        Ok(())
    }

    fn optimizer(&mut self, node: &Node, label: String) -> Result<(), CompileError> {
        let a = &node.attrs;
        let c = |insts: &mut Vec<Inst>, v: f64| intern(insts, Inst::Const(v as f32));
        match node.op {
            Op::Sgd => {
                let (lr, momentum, dampening, wd) = (
                    a.of(key::LR),
                    a.of(key::MOMENTUM),
                    a.of(key::DAMPENING),
                    a.of(key::WEIGHT_DECAY),
                );
                let nesterov = a.of(key::NESTEROV);
                self.map(node, label, move |insts, l| {
                    let (p, g) = (l[0], l[1]);
                    let g = if wd != 0.0 {
                        let k = c(insts, wd);
                        let decay = push(insts, Inst::Binary(BinaryFn::Mul, k, p));
                        push(insts, Inst::Binary(BinaryFn::Add, g, decay))
                    } else {
                        g
                    };
                    let mut results = Vec::new();
                    let update = if momentum != 0.0 {
                        let (km, kd) = (c(insts, momentum), c(insts, 1.0 - dampening));
                        let mb = push(insts, Inst::Binary(BinaryFn::Mul, km, l[2]));
                        let dg = push(insts, Inst::Binary(BinaryFn::Mul, kd, g));
                        let buf = push(insts, Inst::Binary(BinaryFn::Add, mb, dg));
                        results.push(buf);
                        if nesterov {
                            let mbuf = push(insts, Inst::Binary(BinaryFn::Mul, km, buf));
                            push(insts, Inst::Binary(BinaryFn::Add, g, mbuf))
                        } else {
                            buf
                        }
                    } else {
                        g
                    };
                    let klr = c(insts, lr);
                    let step = push(insts, Inst::Binary(BinaryFn::Mul, klr, update));
                    let p_new = push(insts, Inst::Binary(BinaryFn::Sub, p, step));
                    results.insert(0, p_new);
                    results
                })
            }
            _ => {
                let decoupled = node.op == Op::AdamW;
                let (lr, b1, b2, eps, wd) = (
                    a.of(key::LR),
                    a.of(key::BETA1),
                    a.of(key::BETA2),
                    a.of(key::EPS),
                    a.of(key::WEIGHT_DECAY),
                );
                self.map(node, label, move |insts, l| {
                    let (p, g, m, v, t) = (l[0], l[1], l[2], l[3], l[4]);
                    let bin = |insts: &mut Vec<Inst>, f, x, y| push(insts, Inst::Binary(f, x, y));
                    let mut p = p;
                    let mut g = g;
                    if wd != 0.0 {
                        if decoupled {
                            let k = c(insts, 1.0 - lr * wd);
                            p = bin(insts, BinaryFn::Mul, p, k);
                        } else {
                            let k = c(insts, wd);
                            let decay = bin(insts, BinaryFn::Mul, k, p);
                            g = bin(insts, BinaryFn::Add, g, decay);
                        }
                    }
                    let (kb1, k1b1, kb2, k1b2) = (
                        c(insts, b1),
                        c(insts, 1.0 - b1),
                        c(insts, b2),
                        c(insts, 1.0 - b2),
                    );
                    let m1 = bin(insts, BinaryFn::Mul, kb1, m);
                    let m2 = bin(insts, BinaryFn::Mul, k1b1, g);
                    let m_new = bin(insts, BinaryFn::Add, m1, m2);
                    let g2 = push(insts, Inst::Unary(UnaryFn::Square, g));
                    let v1 = bin(insts, BinaryFn::Mul, kb2, v);
                    let v2 = bin(insts, BinaryFn::Mul, k1b2, g2);
                    let v_new = bin(insts, BinaryFn::Add, v1, v2);
                    let one = c(insts, 1.0);
                    let pb1 = bin(insts, BinaryFn::Pow, kb1, t);
                    let bc1 = bin(insts, BinaryFn::Sub, one, pb1);
                    let pb2 = bin(insts, BinaryFn::Pow, kb2, t);
                    let bc2 = bin(insts, BinaryFn::Sub, one, pb2);
                    let m_hat = bin(insts, BinaryFn::Div, m_new, bc1);
                    let v_hat = bin(insts, BinaryFn::Div, v_new, bc2);
                    let root = push(insts, Inst::Unary(UnaryFn::Sqrt, v_hat));
                    let keps = c(insts, eps);
                    let denom = bin(insts, BinaryFn::Add, root, keps);
                    let ratio = bin(insts, BinaryFn::Div, m_hat, denom);
                    let klr = c(insts, lr);
                    let step = bin(insts, BinaryFn::Mul, klr, ratio);
                    let p_new = bin(insts, BinaryFn::Sub, p, step);
                    vec![p_new, m_new, v_new]
                })
            }
        }
    }
}

fn push(insts: &mut Vec<Inst>, inst: Inst) -> usize {
    insts.push(inst);
    insts.len() - 1
}

/// Pushes `inst` unless an identical instruction exists (loads and constants are shared).
fn intern(insts: &mut Vec<Inst>, inst: Inst) -> usize {
    match insts.iter().position(|&i| i == inst) {
        Some(i) => i,
        None => push(insts, inst),
    }
}

fn unary_fn(node: &Node) -> UnaryFn {
    match node.op {
        Op::Neg => UnaryFn::Neg,
        Op::Abs => UnaryFn::Abs,
        Op::Exp => UnaryFn::Exp,
        Op::Log => UnaryFn::Log,
        Op::Sqrt => UnaryFn::Sqrt,
        Op::Rsqrt => UnaryFn::Rsqrt,
        Op::Reciprocal => UnaryFn::Reciprocal,
        Op::Square => UnaryFn::Square,
        Op::Relu => UnaryFn::Relu,
        Op::Sigmoid => UnaryFn::Sigmoid,
        Op::Tanh => UnaryFn::Tanh,
        Op::Silu => UnaryFn::Silu,
        Op::Sin => UnaryFn::Sin,
        Op::Cos => UnaryFn::Cos,
        Op::Gelu if node.attr(key::APPROXIMATE) == "tanh" => UnaryFn::GeluTanh,
        Op::Gelu => UnaryFn::GeluErf,
        other => unreachable!("{} is not unary", other.name()),
    }
}

fn binary_fn(op: Op) -> BinaryFn {
    match op {
        Op::Add => BinaryFn::Add,
        Op::Sub => BinaryFn::Sub,
        Op::Mul => BinaryFn::Mul,
        Op::Div => BinaryFn::Div,
        Op::Pow => BinaryFn::Pow,
        Op::Maximum => BinaryFn::Maximum,
        Op::Minimum => BinaryFn::Minimum,
        Op::Eq => BinaryFn::Eq,
        Op::Lt => BinaryFn::Lt,
        Op::Le => BinaryFn::Le,
        Op::Gt => BinaryFn::Gt,
        Op::Ge => BinaryFn::Ge,
        other => unreachable!("{} is not binary", other.name()),
    }
}

/// A two-entry list attribute (stride, padding, ...) of a verified node.
fn pair(node: &Node, key: sinter_ir::Key<sinter_ir::attr::kind::Indices>) -> [usize; 2] {
    let v = node.attr(key);
    [v[0], v[1]]
}
