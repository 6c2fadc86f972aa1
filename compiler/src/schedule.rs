//! Lowering: a [`KernelGraph`] (decomposed, and optimized unless `--no-opt`) becomes a
//! [`Schedule`] — buffers, and an ordered list of kernel steps over views of them.
//!
//! View ops produce views and no step. Every elementwise primitive and reduction becomes a fused
//! kernel of one op ([`crate::fused::Program`]); the optimizer's fused kernels are lowered as they
//! are. Scalar constants and `iota` feeding an elementwise op are folded into its program. Values
//! no output or assign needs are not computed.
//!
//! **Invariant:** every step writes only fresh buffers (or disjoint slices of one fresh buffer,
//! for `concat`), so steps never overwrite a value that is still to be read. The one exception
//! is made by the next pass, [`crate::in_place`]: a param's or state's update written over it
//! where no later step reads the old value.

use std::collections::HashMap;

use sinter_ir::artifact::Storage;
use sinter_ir::types::contiguous_strides;
use sinter_ir::{DType, Op, TensorType, key};

use crate::error::CompileError;
use crate::flash::FlashKind;
use crate::fused::{Arg, Program, Scalar};
use crate::kernel::*;
use crate::kgraph::{KDef, KNode, KValueId, KernelGraph, KernelOp};
use crate::layout::{BufferId, View};
use crate::matmul::{self, Tile};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferKind {
    /// Computed during a run.
    Temp,
    /// Written by the caller before a run.
    Input(KValueId),
    /// Lives across runs at a fixed place.
    Persistent(KValueId),
}

#[derive(Clone, Debug)]
pub struct Buffer {
    pub ty: TensorType,
    /// How its elements are stored ([`crate::Target::storage`]).
    pub storage: Storage,
    pub kind: BufferKind,
    /// Names of the values stored in it, for the arena map.
    pub label: String,
}

impl Buffer {
    /// The bytes it takes in its arena: its elements at its storage's width (an `f16` value in
    /// word storage takes 4 bytes an element).
    pub fn size_bytes(&self) -> u64 {
        (self.ty.numel() as u64).saturating_mul(self.storage.bytes())
    }
}

#[derive(Clone, Debug)]
pub struct Step {
    pub plan: KernelPlan,
    /// The source ops this step implements, as `value = op`.
    pub ops: Vec<String>,
    /// The rewrite rules that built its kernel.
    pub rules: Vec<String>,
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
    pub assigns: Vec<(KValueId, View)>,
    /// Params and states whose assign a step does by writing over them ([`crate::in_place`]).
    pub updated_in_place: Vec<KValueId>,
    /// The copies that join a `concat`'s operands: per copy, its step, the operand's view and
    /// the part of the result it fills ([`crate::in_place::write_parts_in_place`]).
    pub concat_parts: Vec<ConcatPart>,
}

/// A copy of one `concat` operand into its part of the result.
#[derive(Clone, Debug)]
pub struct ConcatPart {
    pub step: usize,
    pub source: View,
    pub part: View,
}

/// Refuses an f16 tensor at the program's interface (read or written by the caller, in the
/// dtype's bytes) where the target stores f16 values as f32 words.
fn interface_storage(
    role: &'static str,
    name: &str,
    dtype: DType,
    target: &crate::Target,
) -> Result<(), CompileError> {
    if dtype == DType::F16 && target.storage(dtype) != Storage::Half {
        return Err(CompileError::Storage {
            role,
            name: name.to_string(),
            dtype,
            target: target.name.clone(),
            help: "make it f32 and cast inside the program, or compile for a target with f16 \
                   (`--target portable`)"
                .into(),
        });
    }
    Ok(())
}

/// Lowers `g` with `options`' target and forced variants.
pub fn lower(g: &KernelGraph, options: &crate::Options) -> Result<Schedule, CompileError> {
    let mut cx = Lowering {
        g,
        sched: Schedule::default(),
        views: HashMap::new(),
        pending_copies: HashMap::new(),
        needed: needed_values(g),
        target: &options.target,
        matmul: options.matmul,
        flash: options.flash,
        widening: false,
        flash_scales: HashMap::new(),
    };
    for (i, value) in g.values.iter().enumerate() {
        let v = KValueId(i as u32);
        let kind = match value.def {
            KDef::Input => BufferKind::Input(v),
            KDef::Param(_) | KDef::State(_) => BufferKind::Persistent(v),
            KDef::Node { .. } => continue,
        };
        let role = if value.def == KDef::Input {
            "input"
        } else {
            "param or state"
        };
        interface_storage(role, &value.name, value.ty.dtype, &options.target)?;
        let view = cx.new_buffer(value.ty.clone(), kind, &value.name);
        cx.views.insert(v, view);
    }
    for node in &g.nodes {
        if node.outputs.iter().any(|o| cx.needed[o.index()]) {
            cx.lower_node(node)?;
        }
    }
    for (name, v) in &g.outputs {
        interface_storage("output", name, g.ty(*v).dtype, &options.target)?;
        let view = cx.copyable_view(*v)?;
        cx.sched.outputs.push(OutputView {
            name: name.clone(),
            ty: g.ty(*v).clone(),
            view,
        });
    }
    for &(target, source) in &g.assigns {
        let view = cx.copyable_view(source)?;
        cx.sched.assigns.push((target, view));
    }
    Ok(cx.sched)
}

/// Values that some output or assign depends on.
fn needed_values(g: &KernelGraph) -> Vec<bool> {
    let mut needed = vec![false; g.values.len()];
    for &(_, v) in &g.outputs {
        needed[v.index()] = true;
    }
    for &(_, source) in &g.assigns {
        needed[source.index()] = true;
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
    g: &'g KernelGraph,
    sched: Schedule,
    views: HashMap<KValueId, View>,
    /// Reshapes whose source view cannot be reshaped without moving data, by value: the source
    /// view and the step's label. The copy is made where the value is first read (`view`),
    /// unless a `concat` reads it first: that copies the source straight into its part of the
    /// result, viewed in the source's shape, saving a pass over the value.
    pending_copies: HashMap<KValueId, (View, String)>,
    needed: Vec<bool>,
    target: &'g crate::Target,
    /// Block shapes and splits forced on every matmul.
    matmul: crate::matmul::Forced,
    /// What the flash kernels' variants may take.
    flash: crate::flash::variant::Choices,
    /// Results of the node being lowered get f32 buffers where their type is f16
    /// ([`Lowering::lower_widened`]).
    widening: bool,
    /// The [`FlashScale`] of each `dO` (over a score batch) made so far: the dQ and dK/dV
    /// kernels share one.
    flash_scales: HashMap<(KValueId, Vec<usize>), View>,
}

impl Lowering<'_> {
    fn new_buffer(&mut self, ty: TensorType, kind: BufferKind, label: &str) -> View {
        let id = BufferId(self.sched.buffers.len() as u32);
        let view = View::contiguous(id, &ty.shape);
        self.sched.buffers.push(Buffer {
            storage: self.target.storage(ty.dtype),
            ty,
            kind,
            label: label.to_string(),
        });
        view
    }

    /// Allocates `out`'s buffer, pushes the step `make` builds around its view, and binds it.
    fn write_new(&mut self, out: KValueId, label: String, make: impl FnOnce(View) -> KernelPlan) {
        let dst = self.temp(out);
        self.push(make(dst.clone()), vec![label]);
        self.views.insert(out, dst);
    }

    fn temp(&mut self, v: KValueId) -> View {
        let value = self.g.value(v);
        let ty = if self.widening && value.ty.dtype == DType::F16 {
            TensorType::f32(value.ty.shape.clone())
        } else {
            value.ty.clone()
        };
        self.new_buffer(ty, BufferKind::Temp, &value.name)
    }

    /// Whether `node`'s kernel reads and writes f32 only, so that f16 operands and results pass
    /// through f32 copies ([`Lowering::lower_widened`]): convolution, pooling, gathers, their
    /// backward kernels. Fused kernels and matmuls read and write f16 themselves, and the flash
    /// kernels read f16 operands (their results are f32).
    fn needs_f32(&self, node: &KNode) -> bool {
        let kernel_is_f32 = match &node.op {
            KernelOp::Flash(_) => false,
            KernelOp::Epilogue(anchor, ..) => *anchor != Op::Matmul,
            KernelOp::Fused(_) => false,
            KernelOp::Ir(op, _) => matches!(
                op,
                Op::Conv2d
                    | Op::MaxPool2d
                    | Op::AvgPool2d
                    | Op::Embedding
                    | Op::Conv2dGradInput
                    | Op::Conv2dGradWeight
                    | Op::MaxPool2dGrad
                    | Op::AvgPool2dGrad
                    | Op::EmbeddingGrad
                    | Op::SliceGrad
            ),
        };
        kernel_is_f32
            && node
                .inputs
                .iter()
                .chain(&node.outputs)
                .any(|&v| self.dtype(v) == DType::F16)
    }

    /// Lowers `node` as an f32 kernel: its f16 operands copied to f32 first, its f16 results
    /// written as f32 and rounded into f16 buffers after (exactly the op's semantics on f16:
    /// computed in f32, rounded once).
    fn lower_widened(&mut self, node: &KNode) -> Result<(), CompileError> {
        let label = node.sources.join("; ");
        let mut saved = Vec::new();
        for &v in &node.inputs {
            if self.dtype(v) != DType::F16 || saved.iter().any(|&(s, _)| s == v) {
                continue;
            }
            let half = self.view(v)?;
            let ty = TensorType::f32(half.shape.clone());
            let name = format!("{} (as f32)", self.g.name_of(v));
            let wide = self.new_buffer(ty, BufferKind::Temp, &name);
            self.copy(
                &half,
                DType::F32,
                &wide,
                format!("{label} (f16 operand to f32)"),
            );
            saved.push((v, self.views.insert(v, wide)));
        }
        self.widening = true;
        let lowered = self.lower_node_kernel(node);
        self.widening = false;
        for (v, old) in saved {
            match old {
                Some(view) => self.views.insert(v, view),
                None => self.views.remove(&v),
            };
        }
        lowered?;
        for &o in &node.outputs {
            if self.dtype(o) != DType::F16 {
                continue;
            }
            let Some(wide) = self.views.get(&o).cloned() else {
                continue; // not computed: no reader needs it
            };
            let half = self.new_buffer(self.g.ty(o).clone(), BufferKind::Temp, self.g.name_of(o));
            self.copy(
                &wide,
                DType::F16,
                &half,
                format!("{label} (f32 result to f16)"),
            );
            self.views.insert(o, half);
        }
        Ok(())
    }

    fn dtype(&self, v: KValueId) -> DType {
        self.g.ty(v).dtype
    }

    fn push(&mut self, plan: KernelPlan, ops: Vec<String>) {
        self.sched.steps.push(Step {
            plan,
            ops,
            rules: Vec::new(),
        });
    }

    /// [`Lowering::push`] for a step that lowers `node`, carrying its rules.
    fn push_node(&mut self, plan: KernelPlan, node: &KNode) {
        self.sched.steps.push(Step {
            plan,
            ops: node.sources.clone(),
            rules: node.rules.clone(),
        });
    }

    /// The view of a value, materializing folded constants when a non-elementwise op needs them.
    fn view(&mut self, v: KValueId) -> Result<View, CompileError> {
        if let Some(view) = self.views.get(&v) {
            return Ok(view.clone());
        }
        if let Some((src, label)) = self.pending_copies.remove(&v) {
            let tmp = self.temp(v);
            let dense = View::contiguous(tmp.buffer, &src.shape);
            self.copy(&src, self.dtype(v), &dense, label);
            self.views.insert(v, tmp.clone());
            return Ok(tmp);
        }
        let node = self.g.producer(v).expect("declarations have views");
        let label = node.sources.join("; ");
        let arg = self.fold(v).expect("only folded values lack views");
        let shape = self.g.ty(v).shape.clone();
        let program = Program::map(&shape, Scalar::Cast(DType::F32), &[arg], DType::F32);
        let out = self.temp(v);
        self.fused(program, Vec::new(), vec![out.clone()], label);
        self.views.insert(v, out.clone());
        Ok(out)
    }

    /// A scalar constant or an iota, which elementwise consumers compute in place.
    fn fold(&self, v: KValueId) -> Option<Arg> {
        let node = self.g.producer(v)?;
        match node.ir()? {
            Op::Constant => Some(Arg::Const(node.attr(key::VALUE) as f32)),
            Op::Iota => Some(Arg::Coord {
                axis: node.attr(key::AXIS),
                rank: self.g.ty(v).rank(),
            }),
            _ => None,
        }
    }

    fn contiguous_view(&mut self, v: KValueId) -> Result<View, CompileError> {
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

    /// A fused kernel copying `from` to `to` as `dtype` (`from`'s own buffer type, or another
    /// float dtype: a conversion).
    /// A contiguous view of `v` that starts on a [`COPY_ALIGN`] boundary, as buffer copies
    /// (readbacks, assigns) need: an f16 view at an odd element is copied first.
    ///
    /// [`COPY_ALIGN`]: sinter_ir::artifact::COPY_ALIGN
    fn copyable_view(&mut self, v: KValueId) -> Result<View, CompileError> {
        let view = self.contiguous_view(v)?;
        let bytes = self.sched.buffers[view.buffer.0 as usize].storage.bytes() as usize;
        if (view.offset * bytes).is_multiple_of(sinter_ir::artifact::COPY_ALIGN as usize) {
            return Ok(view);
        }
        let out = self.temp(v);
        let label = format!("{} = copy", self.g.name_of(v));
        self.copy(&view, self.dtype(v), &out, label);
        Ok(out)
    }

    fn copy(&mut self, from: &View, dtype: DType, to: &View, label: String) {
        let from_dtype = self.sched.buffers[from.buffer.0 as usize].ty.dtype;
        let ty = TensorType::new(from_dtype, from.shape.clone());
        let program = Program::map(&from.shape, Scalar::Cast(dtype), &[Arg::Operand(ty)], dtype);
        self.fused(program, vec![from.clone()], vec![to.clone()], label);
    }

    fn fused(&mut self, program: Program, operands: Vec<View>, outputs: Vec<View>, label: String) {
        self.push(
            KernelPlan::Fused(FusedKernel {
                program,
                operands,
                outputs,
            }),
            vec![label],
        );
    }

    /// A fused kernel computing `node`'s results from its inputs' views into fresh buffers;
    /// inputs that are literals or iotas are folded into the program.
    fn fused_node(&mut self, node: &KNode, program: Program) -> Result<(), CompileError> {
        let mut program = program;
        let mut operands = Vec::new();
        let mut folded = 0;
        for (i, &v) in node.inputs.iter().enumerate() {
            match self.fold(v) {
                Some(arg) => {
                    program = program.substitute(i - folded, &arg);
                    folded += 1;
                }
                None => operands.push(self.view(v)?),
            }
        }
        let mut outputs = Vec::new();
        for &o in &node.outputs {
            let view = self.temp(o);
            self.views.insert(o, view.clone());
            outputs.push(view);
        }
        self.push_node(
            KernelPlan::Fused(FusedKernel {
                program,
                operands,
                outputs,
            }),
            node,
        );
        Ok(())
    }

    fn lower_node(&mut self, node: &KNode) -> Result<(), CompileError> {
        if self.needs_f32(node) {
            self.lower_widened(node)
        } else {
            self.lower_node_kernel(node)
        }
    }

    fn lower_node_kernel(&mut self, node: &KNode) -> Result<(), CompileError> {
        let op = match &node.op {
            KernelOp::Fused(program) => return self.fused_node(node, (**program).clone()),
            KernelOp::Epilogue(anchor, _, program) => {
                let label = node.sources.join("; ");
                return match anchor {
                    Op::Matmul => self.matmul(node, label, Some(program)),
                    Op::Conv2d => self.conv2d(node, Some(program)),
                    other => unreachable!("`{}` takes no epilogue", other.name()),
                };
            }
            KernelOp::Flash(spec) => return self.flash(node, spec),
            KernelOp::Ir(op, attrs) => (*op, attrs),
        };
        let (op, attrs) = op;
        let label = node.sources.join("; ");
        let out = node.outputs[0];
        let out_ty = self.g.ty(out).clone();
        use Op::*;
        match op {
            // Folded into consumers; materialized by `view` if a non-elementwise op reads them.
            Constant | Iota => {}
            // one-op fused programs
            Neg | Abs | Exp | Log | Sqrt | Rsqrt | Reciprocal | Square | Relu | Sigmoid | Tanh
            | Silu | Sin | Cos | Gelu | Add | Sub | Mul | Div | Pow | Maximum | Minimum | Eq
            | Lt | Le | Gt | Ge | Where | Cast | Sum | Max | Min | Argmax => {
                let inputs: Vec<TensorType> =
                    node.inputs.iter().map(|&v| self.g.ty(v).clone()).collect();
                let program = Program::of_primitive(op, attrs, &inputs, &out_ty, false)
                    .ok_or_else(|| {
                        CompileError::Internal(format!(
                            "`{}` has no one-op fused program",
                            op.name()
                        ))
                    })?;
                self.fused_node(node, program)?;
            }
            Reshape => {
                let x = self.view(node.inputs[0])?;
                match x.reshape(&out_ty.shape) {
                    Some(view) => {
                        self.views.insert(out, view);
                    }
                    None => {
                        self.pending_copies.insert(out, (x, label));
                    }
                }
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
                let v = self.view(node.inputs[0])?.unsqueeze(node.attr(key::AXIS));
                self.views.insert(out, v);
            }
            Squeeze => {
                let v = self.view(node.inputs[0])?.squeeze(node.attr(key::AXIS));
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
                    let len = self.g.ty(x).shape[axis];
                    let part = dst.slice(axis, at, len, 1);
                    at += len;
                    // a pending reshape copies its source into the part, seen in that shape
                    let direct = self.pending_copies.get(&x).and_then(|(src, reshape)| {
                        let seen = part.reshape(&src.shape)?;
                        Some((src.clone(), seen, format!("{reshape}; {label}")))
                    });
                    let (source, seen, copy_label) = match direct {
                        Some(direct) => direct,
                        None => (self.view(x)?, part.clone(), label.clone()),
                    };
                    self.sched.concat_parts.push(ConcatPart {
                        step: self.sched.steps.len(),
                        source: source.clone(),
                        part,
                    });
                    self.copy(&source, out_ty.dtype, &seen, copy_label);
                }
                self.views.insert(out, dst);
            }
            Matmul => self.matmul(node, label, None)?,
            Conv2d => self.conv2d(node, None)?,
            MaxPool2d | AvgPool2d => {
                let x = self.view(node.inputs[0])?;
                self.write_new(out, label, |out| {
                    KernelPlan::Pool2d(Pool2d {
                        max: op == MaxPool2d,
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
                self.write_new(out, label, |out| {
                    KernelPlan::Gather(Gather { table, ids, out })
                });
            }
            Conv2dGradInput | Conv2dGradWeight => {
                let a = self.view(node.inputs[0])?;
                let b = self.view(node.inputs[1])?;
                self.write_new(out, label, |out| {
                    KernelPlan::Conv2dGrad(Conv2dGrad {
                        wrt_weight: op == Conv2dGradWeight,
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
                let (x, dy) = if op == MaxPool2dGrad {
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
            Cumsum => {
                let x = self.view(node.inputs[0])?;
                self.write_new(out, label, |out| {
                    KernelPlan::Scan(crate::kernel::Scan {
                        x,
                        out,
                        axis: node.attr(key::AXIS),
                        exclusive: node.attr(key::EXCLUSIVE),
                        reverse: node.attr(key::REVERSE),
                    })
                });
            }
            Mean | Logsumexp | Softmax | LogSoftmax | LayerNorm | RmsNorm | GroupNorm
            | CrossEntropy | MseLoss | Sgd | Adam | AdamW | Attention => {
                return Err(CompileError::Internal(format!(
                    "`{}` must be decomposed before lowering",
                    op.name()
                )));
            }
            Grad => {
                return Err(CompileError::NeedsAutodiff {
                    value: self.g.name_of(out).to_string(),
                });
            }
        }
        Ok(())
    }

    /// A flash attention kernel: operands as views over the score space's batch axes.
    fn flash(&mut self, node: &KNode, spec: &crate::flash::FlashSpec) -> Result<(), CompileError> {
        let space = &spec.score.domain;
        let nb = space.len() - 2;
        let batch = space[..nb].to_vec();
        let (sq, sk) = (space[nb], space[nb + 1]);
        let mut views = Vec::new();
        for &v in &node.inputs {
            views.push(self.view(v)?);
        }
        // a [batch'.., rows, cols] operand over the full batch
        let over_batch = |v: &View| {
            let mut shape = batch.clone();
            shape.extend_from_slice(&v.shape[v.rank() - 2..]);
            v.broadcast_to(&shape)
        };
        let (d, dv) = (
            views[0].shape[views[0].rank() - 1],
            views[2].shape[views[2].rank() - 1],
        );
        let fixed = spec.fixed_inputs();
        let backward = fixed == 6;
        let score_extras = views[fixed..fixed + spec.score_extras()].to_vec();
        let dscore_extras = views[fixed + spec.score_extras()..].to_vec();
        let mut outputs = Vec::new();
        for &o in &node.outputs {
            let view = self.temp(o);
            self.views.insert(o, view.clone());
            outputs.push(view);
        }
        let (q_ty, v_ty) = (self.g.ty(node.inputs[0]), self.g.ty(node.inputs[2]));
        let variant = crate::flash::variant::choose(self.target, &self.flash, spec, q_ty, v_ty);
        // the whole backward: dQ through one partial sum per group of key blocks
        let mut dq_sum = None;
        if spec.kind == FlashKind::Backward {
            let dq = outputs.pop().expect("dK, dV and dQ");
            let mut shape = vec![variant.blocks];
            shape.extend(&dq.shape);
            let label = format!(
                "{} (flash dQ partial sums)",
                self.sched.buffers[dq.buffer.0 as usize].label
            );
            let partials =
                self.new_buffer(TensorType::new(DType::F32, shape), BufferKind::Temp, &label);
            outputs.push(View {
                shape: dq.shape.clone(),
                strides: partials.strides[1..].to_vec(),
                ..partials.clone()
            });
            dq_sum = Some(SplitSum {
                partials,
                out: dq,
                epilogue: None,
                flash_dq: true,
                // dQ as the spec stores it: the partial sums are f32, the sum rounds once
                out_dtype: self.g.ty(node.outputs[2]).dtype,
            });
        }
        let dq_group_stride = outputs.last().map_or(0, |v| v.shape.iter().product());
        // the kernel's f16 operands take dO scaled
        let d_o_scale = variant
            .scales_gradients(spec.kind)
            .then(|| self.flash_scale(node, over_batch(&views[3]), &batch));
        let plan = crate::kernel::Flash {
            spec: spec.clone(),
            batch: batch.clone(),
            sq,
            sk,
            d,
            dv,
            q: over_batch(&views[0]),
            k: over_batch(&views[1]),
            v: over_batch(&views[2]),
            d_o: backward.then(|| over_batch(&views[3])),
            lse: backward.then(|| over_batch(&views[4])),
            delta: backward.then(|| over_batch(&views[5])),
            d_o_scale,
            score_extras,
            dscore_extras,
            outputs,
            dq_group_stride,
            variant,
        };
        self.push_node(KernelPlan::Flash(Box::new(plan)), node);
        if let Some(sum) = dq_sum {
            self.push_node(KernelPlan::SplitSum(sum), node);
        }
        Ok(())
    }

    /// The [`FlashScale`] of the flash backward `node`'s `dO` (its view over the score space's
    /// `batch`), made before the first kernel that reads it.
    fn flash_scale(&mut self, node: &KNode, d_o: View, batch: &[usize]) -> View {
        let value = node.inputs[3];
        let key = (value, batch.to_vec());
        if let Some(view) = self.flash_scales.get(&key) {
            return view.clone();
        }
        let r = d_o.rank();
        let chunks = crate::flash::variant::scale_chunks(d_o.shape[r - 2] * d_o.shape[r - 1]);
        let mut shape = batch.to_vec();
        shape.extend([chunks, 1]);
        let label = format!("{} (flash dO maxima)", self.g.name_of(value));
        let out = self.new_buffer(TensorType::new(DType::F32, shape), BufferKind::Temp, &label);
        let plan = FlashScale {
            d_o,
            out: out.clone(),
        };
        self.push_node(KernelPlan::FlashScale(plan), node);
        self.flash_scales.insert(key, out.clone());
        out
    }

    fn matmul(
        &mut self,
        node: &KNode,
        label: String,
        epilogue: Option<&Program>,
    ) -> Result<(), CompileError> {
        let (a, b) = (node.inputs[0], node.inputs[1]);
        let av = self.view(a)?;
        let bv = self.view(b)?;
        // 1-D operands were promoted by `expand_composites`.
        debug_assert!(av.rank() >= 2 && bv.rank() >= 2);
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
        let epilogue = match epilogue {
            Some(p) => Some(self.epilogue(node, p, &out_view)?),
            None => None,
        };
        let mut product = Product {
            batch,
            m,
            a: av,
            b: bv,
            out: out_view,
            epilogue,
        };
        while product.fold_batch_axis(self.target.limits.workgroups_per_dimension) {}
        let Product {
            batch,
            m,
            a: av,
            b: bv,
            out: out_view,
            epilogue,
        } = product;
        let shape = matmul::Shape {
            batch: batch.iter().product(),
            m,
            n,
            k,
        };
        let b_along_n = bv.strides[bv.rank() - 1] == 1;
        let f16_operands = (node.inputs[..2].iter()).all(|&v| self.dtype(v) == DType::F16);
        let matmul::Variant { tile, splits } = matmul::variant(
            self.target,
            shape,
            self.matmul,
            self.target.limits.max_binding,
            b_along_n,
            matmul::form(self.target, f16_operands, m),
        );
        let step = KNode {
            sources: vec![label],
            ..node.clone()
        };
        let out_dtype = self.dtype(out);
        if splits > 1 {
            self.split_k(
                &step,
                splits,
                tile,
                (av, bv),
                (out_view, out_dtype),
                epilogue,
            );
        } else {
            let plan = crate::kernel::Matmul {
                epilogue,
                batch,
                m,
                n,
                k,
                a: av,
                b: bv,
                out: out_view,
                tile,
                out_dtype,
            };
            self.push_node(KernelPlan::Matmul(plan), &step);
        }
        self.views.insert(out, dst);
        Ok(())
    }

    /// The epilogue of an anchor node (matmul, conv2d) storing to `out`: operand 0 is the
    /// anchor's result itself, never loaded; constants among the other operands are folded in.
    fn epilogue(
        &mut self,
        node: &KNode,
        p: &Program,
        out: &View,
    ) -> Result<FusedKernel, CompileError> {
        let mut program = p.clone();
        let mut operands = vec![out.clone()];
        let mut folded = 0;
        for (i, &v) in node.inputs[node.anchor_operands()..].iter().enumerate() {
            match self.fold(v) {
                Some(arg) => {
                    program = program.substitute(i + 1 - folded, &arg);
                    folded += 1;
                }
                None => operands.push(self.view(v)?),
            }
        }
        Ok(FusedKernel {
            program,
            operands,
            outputs: vec![out.clone()],
        })
    }

    /// A conv2d node, or a conv2d with an epilogue.
    fn conv2d(&mut self, node: &KNode, epilogue: Option<&Program>) -> Result<(), CompileError> {
        let x = self.view(node.inputs[0])?;
        let w = self.view(node.inputs[1])?;
        let bias = match node.anchor_operands() {
            3 => Some(self.view(node.inputs[2])?),
            _ => None,
        };
        let out = node.outputs[0];
        let dst = self.temp(out);
        let epilogue = match epilogue {
            Some(p) => Some(self.epilogue(node, p, &dst)?),
            None => None,
        };
        let plan = crate::kernel::Conv2d {
            x,
            w,
            bias,
            out: dst.clone(),
            stride: pair(node, key::STRIDE),
            padding: pair(node, key::PADDING),
            dilation: pair(node, key::DILATION),
            groups: node.attr(key::GROUPS),
            epilogue,
        };
        let step = KNode {
            sources: vec![node.sources.join("; ")],
            ..node.clone()
        };
        self.push_node(KernelPlan::Conv2d(plan), &step);
        self.views.insert(out, dst);
        Ok(())
    }

    /// Split-K: the product of `[.., m, k]` by `[.., k, n]` as `splits` products of K chunks
    /// (views of the operands with a leading chunk axis: a batched matmul) into a temporary
    /// `[splits, .., m, n]` buffer, then a [`SplitSum`] that adds the chunks, applies the
    /// epilogue and writes `out`.
    fn split_k(
        &mut self,
        node: &KNode,
        splits: usize,
        tile: Tile,
        (a, b): (View, View),
        (out, out_dtype): (View, DType),
        epilogue: Option<FusedKernel>,
    ) {
        let rb = out.rank() - 2;
        let (m, k, n) = (a.shape[rb], a.shape[rb + 1], b.shape[rb + 1]);
        debug_assert!(splits > 1 && k % splits == 0);
        let chunk = k / splits;
        let chunked = |v: &View, axis: usize| {
            let mut shape = vec![splits];
            shape.extend(&v.shape);
            shape[axis + 1] = chunk;
            let mut strides = vec![chunk * v.strides[axis]];
            strides.extend(&v.strides);
            View {
                buffer: v.buffer,
                offset: v.offset,
                shape,
                strides,
            }
        };
        let mut partial_shape = vec![splits];
        partial_shape.extend(&out.shape);
        let label = format!(
            "{} (split-K partial products)",
            self.sched.buffers[out.buffer.0 as usize].label
        );
        let partials = self.new_buffer(
            TensorType::new(DType::F32, partial_shape.clone()),
            BufferKind::Temp,
            &label,
        );
        let plan = crate::kernel::Matmul {
            epilogue: None,
            batch: partial_shape[..rb + 1].to_vec(),
            m,
            n,
            k: chunk,
            a: chunked(&a, rb + 1),
            b: chunked(&b, rb),
            out: partials.clone(),
            tile,
            out_dtype: DType::F32,
        };
        self.push_node(KernelPlan::Matmul(plan), node);
        let sum = SplitSum {
            partials,
            out,
            epilogue,
            flash_dq: false,
            out_dtype,
        };
        self.push_node(KernelPlan::SplitSum(sum), node);
    }
}

/// A matmul's operands, output and epilogue over its batch axes, before lowering picks its
/// block shape.
struct Product {
    batch: Vec<usize>,
    m: usize,
    a: View,
    b: View,
    out: View,
    epilogue: Option<FusedKernel>,
}

impl Product {
    /// Folds the batch axis next to m into m when no address changes: `b` is broadcast along it
    /// and `a`, the output and every tensor of the epilogue step it as a run of m rows (or its
    /// extent is 1). A `[4, 512, 768] x [768, 3072]` product then runs as `[2048, 768] x
    /// [768, 3072]`: its blocks compute no batch offsets, which cost 128 x 128 blocks a second
    /// block per SM (registers) and much of their speed on the H200, and the block-shape model
    /// sees m as it is. An axis stays when the folded rows would need more
    /// row blocks than one dispatch has (the batch has its own grid axis). Returns whether it
    /// folded an axis.
    fn fold_batch_axis(&mut self, max_groups: u32) -> bool {
        let Some(&outer) = self.batch.last() else {
            return false;
        };
        let j = self.batch.len() - 1;
        let rows_run = |v: &View| outer == 1 || v.strides[j] == self.m * v.strides[j + 1];
        // the folded rows must still fit one dispatch's row blocks at the smallest block height
        let row_blocks = (self.m * outer).div_ceil(matmul::Tile::SMALL.bm as usize);
        if !(rows_run(&self.a) && rows_run(&self.out) && (outer == 1 || self.b.strides[j] == 0))
            || row_blocks > max_groups as usize
        {
            return false;
        }
        let epilogue = match &self.epilogue {
            Some(e) => match crate::kernel::merge_axes(e, j) {
                Some(merged) => Some(merged),
                None => return false,
            },
            None => None,
        };
        let fold = |v: &mut View, into_next: bool| {
            v.shape.remove(j);
            v.strides.remove(j);
            if into_next {
                v.shape[j] *= outer;
            }
        };
        fold(&mut self.a, true);
        fold(&mut self.b, false);
        fold(&mut self.out, true);
        self.epilogue = epilogue;
        self.m *= outer;
        self.batch.pop();
        true
    }
}

/// A two-entry list attribute (stride, padding, ...) of a verified node.
fn pair(node: &KNode, key: sinter_ir::Key<sinter_ir::attr::kind::Indices>) -> [usize; 2] {
    let v = node.attr(key);
    [v[0], v[1]]
}

impl std::fmt::Display for Schedule {
    /// The buffers (`bN label: type (kind)`), then one line per step (its plan: pattern,
    /// variant, views read -> written) with the source ops it implements, then the outputs and
    /// assigns by view, and the params and states updated in place.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "schedule: {} steps over {} buffers",
            self.steps.len(),
            self.buffers.len()
        )?;
        for (i, b) in self.buffers.iter().enumerate() {
            let kind = match b.kind {
                BufferKind::Temp => "temp",
                BufferKind::Input(_) => "input",
                BufferKind::Persistent(_) => "persistent",
            };
            writeln!(f, "  {} {}: {} ({kind})", BufferId(i as u32), b.label, b.ty)?;
        }
        for (i, step) in self.steps.iter().enumerate() {
            writeln!(f, "  step {i}: {}", step.plan)?;
            writeln!(f, "      from: {}", step.ops.join("; "))?;
        }
        for o in &self.outputs {
            writeln!(f, "  output {}: {}", o.name, o.view)?;
        }
        // a persistent value by its buffer's label
        let label = |v: KValueId| {
            self.buffers
                .iter()
                .find(|b| b.kind == BufferKind::Persistent(v))
                .map_or_else(|| v.to_string(), |b| b.label.clone())
        };
        for &(target, ref view) in &self.assigns {
            writeln!(f, "  assign {} = {view}", label(target))?;
        }
        if !self.updated_in_place.is_empty() {
            let names: Vec<String> = self.updated_in_place.iter().map(|&v| label(v)).collect();
            writeln!(f, "  updated in place: {}", names.join(", "))?;
        }
        Ok(())
    }
}
