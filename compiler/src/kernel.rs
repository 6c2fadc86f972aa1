//! Kernel plans: what each dispatch computes, in terms of views of planned buffers, with each
//! kernel's variant chosen (lowering makes them; codegen only reads them).
//!
//! A plan says everything codegen needs except where buffers live; the memory plan supplies
//! that. The WGSL of a plan depends only on its *structure* (ranks, dtypes, op, which arena
//! each operand is in); the numbers (extents, strides, offsets) go into the param block, so
//! dispatches of the same structure share one shader.

use crate::fused::{Access, Axis, Inst, Program};
use crate::layout::View;
use crate::matmul::Tile;

/// Invocations per workgroup of every kernel but the flash kernels' tilings of 128 (wgpu's
/// default limit).
pub const WORKGROUP: u32 = 256;

/// A fused kernel's plan: the program and the views it reads and writes.
#[derive(Clone, Debug, PartialEq)]
pub struct FusedKernel {
    pub program: Program,
    pub operands: Vec<View>,
    pub outputs: Vec<View>,
}

impl FusedKernel {
    /// Every tensor the kernel reads or writes: how the program accesses it, and its view
    /// (operands, then outputs).
    pub(crate) fn tensors(&self) -> impl Iterator<Item = (&Access, &View)> {
        let p = &self.program;
        p.operands
            .iter()
            .zip(&self.operands)
            .chain(p.outputs.iter().map(|o| &o.access).zip(&self.outputs))
    }
}

/// Strides of `view` per space axis of `p`, for a tensor accessed with `access`.
pub(crate) fn space_strides(p: &Program, access: &Access, view: &View) -> Vec<usize> {
    let mut strides = vec![0; p.domain.len() + p.reduce.len()];
    for (j, a) in access.axes.iter().enumerate() {
        if let Some(k) = a.space() {
            strides[k as usize] += view.strides[j];
        }
    }
    strides
}

/// `k` with space axes `a` and `a + 1` (both domain axes or both reduce axes) made one, of their
/// extents' product, when that changes no address: every tensor indexes both or neither, as
/// adjacent axes of one run (the outer axis's stride is the inner one's extent times its stride),
/// or the outer extent is 1; no instruction reads either coordinate, and no collapsed axis stands
/// for either. `None` otherwise.
pub fn merge_axes(k: &FusedKernel, a: usize) -> Option<FusedKernel> {
    let p = &k.program;
    let d = p.domain.len();
    let b = a + 1;
    let in_reduce = a >= d;
    if b >= d + p.reduce.len() || (!in_reduce && b >= d) {
        return None;
    }
    let extent = |x: usize| if x < d { p.domain[x] } else { p.reduce[x - d] };
    let reads_coords = p
        .insts
        .iter()
        .any(|inst| matches!(inst, Inst::Coord(c) if *c as usize == a || *c as usize == b));
    let collapsed = |c: u8| in_reduce && (c as usize + d == a || c as usize + d == b);
    let tensors: Vec<(&Access, &View)> = k.tensors().collect();
    let windowed = |acc: &Access| {
        acc.axes
            .iter()
            .any(|x| matches!(x, Axis::Shifted { k, .. } if *k as usize == a || *k as usize == b))
    };
    let mergeable = !reads_coords
        && !tensors.iter().any(|(acc, _)| windowed(acc))
        && tensors.iter().all(|(acc, view)| {
            let at = |axis: usize| acc.axes.iter().position(|x| *x == Axis::Space(axis as u8));
            let one_run = match (at(a), at(b)) {
                (None, None) => true,
                (Some(ja), Some(jb)) => {
                    jb == ja + 1
                        && (extent(a) == 1 || view.strides[ja] == extent(b) * view.strides[jb])
                }
                // an outer axis of extent 1 is coordinate 0 however a tensor reads it
                _ => extent(a) == 1,
            };
            one_run
                && !acc
                    .axes
                    .iter()
                    .any(|x| matches!(x, Axis::Collapsed(c) if collapsed(*c)))
        });
    if !mergeable {
        return None;
    }
    let renumber = |x: &Axis| match *x {
        Axis::Space(c) if c as usize > a => Axis::Space(c - 1),
        Axis::Shifted { k, by, len } if k as usize > a => Axis::Shifted { k: k - 1, by, len },
        Axis::Collapsed(c) if in_reduce && c as usize + d > a => Axis::Collapsed(c - 1),
        other => other,
    };
    let mut program = p.clone();
    if in_reduce {
        program.reduce[a - d] *= program.reduce.remove(b - d);
    } else {
        program.domain[a] *= program.domain.remove(b);
    }
    for inst in &mut program.insts {
        if let Inst::Coord(c) = inst
            && *c as usize > b
        {
            *c -= 1;
        }
    }
    let merge = |acc: &mut Access, view: &mut View| {
        if let Some(ja) = acc.axes.iter().position(|x| *x == Axis::Space(a as u8)) {
            acc.axes.remove(ja);
            let outer = view.shape.remove(ja);
            view.strides.remove(ja);
            if outer != 1 {
                view.shape[ja] *= outer;
            }
        }
        acc.axes = acc.axes.iter().map(renumber).collect();
    };
    let (mut operands, mut outputs) = (k.operands.clone(), k.outputs.clone());
    for (acc, view) in program.operands.iter_mut().zip(&mut operands) {
        merge(acc, view);
    }
    for (o, view) in program.outputs.iter_mut().zip(&mut outputs) {
        merge(&mut o.access, view);
    }
    Some(FusedKernel {
        program,
        operands,
        outputs,
    })
}

/// Batched matrix product `out[b, m, n] = sum_k a[b, m, k] * b[b, k, n]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Matmul {
    pub batch: Vec<usize>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Views of rank `batch.len() + 2`: a `[.., m, k]`, b `[.., k, n]`, out `[.., m, n]`.
    pub a: View,
    pub b: View,
    pub out: View,
    /// An elementwise program applied to each product element before it is stored (its
    /// operand 0 is the product).
    pub epilogue: Option<FusedKernel>,
    /// The block shape (the product's variant, [`crate::matmul::variant`]).
    pub tile: Tile,
    /// The dtype stored (f16 rounds the accumulated f32 sum once).
    pub out_dtype: sinter_ir::DType,
}

/// The second pass of a split-K matmul ([`Matmul`] over K chunks):
/// `out[.., m, n] = epilogue(sum over s of partials[s, .., m, n])`.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitSum {
    /// The chunks' partial products, a contiguous `[splits, .., m, n]` buffer.
    pub partials: View,
    /// `[.., m, n]`.
    pub out: View,
    /// As [`Matmul::epilogue`]: operand 0 is the summed product.
    pub epilogue: Option<FusedKernel>,
    /// The sum of the whole flash backward's `dQ` partial sums (one per group of key blocks),
    /// not of a split-K matmul's chunks: named `flash_dq_sum` in inspection.
    pub flash_dq: bool,
    /// The dtype stored.
    pub out_dtype: sinter_ir::DType,
}

/// The largest `|dO|` of each chunk of each batch entry's `[sq, dv]` slice
/// ([`crate::flash::variant::scale_chunks`] chunks an entry), from which the flash
/// backward on tensor cores ([`crate::codegen::flash::coop`]) takes the power of two it stages
/// `dO` at, so that gradients of a mean loss do not underflow `f16`.
#[derive(Clone, Debug, PartialEq)]
pub struct FlashScale {
    /// `dO [batch.., sq, dv]`.
    pub d_o: View,
    /// `[batch.., chunks, 1]`.
    pub out: View,
}

/// A flash attention kernel (see [`crate::flash`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Flash {
    pub spec: crate::flash::FlashSpec,
    /// Batch extents (the score space without its last two axes).
    pub batch: Vec<usize>,
    pub sq: usize,
    pub sk: usize,
    /// Head dimension of q and k, and of v.
    pub d: usize,
    pub dv: usize,
    /// `q [batch.., sq, d]`, `k [batch.., sk, d]`, `v [batch.., sk, dv]`, broadcast to the batch
    /// (stride 0 where shared).
    pub q: View,
    pub k: View,
    pub v: View,
    /// Backward kernels: `dO [batch.., sq, dv]`, `L` and `D` as `[batch.., sq, 1]`.
    pub d_o: Option<View>,
    pub lse: Option<View>,
    pub delta: Option<View>,
    /// The tensor-core backward kernels: `dO`'s [`FlashScale`] maxima, `[batch.., chunks, 1]`.
    pub d_o_scale: Option<View>,
    /// Views of the score function's other operands, and of its backward's.
    pub score_extras: Vec<View>,
    pub dscore_extras: Vec<View>,
    /// Forward: `O`, `L`; dK/dV: `dK [batch.., sk, d]`, `dV`; dQ: `dQ`; the whole backward:
    /// `dK`, `dV` and the first group's `dQ` partial sum (`[batch.., sq, d]`; group `g`'s lies
    /// `g · dq_group_stride` words on).
    pub outputs: Vec<View>,
    /// The whole backward ([`crate::flash::FlashKind::Backward`]): words between two groups'
    /// `dQ` partial sums.
    pub dq_group_stride: usize,
    /// How the kernel runs: form, tiling, launch order, blocks or groups
    /// ([`crate::flash::variant::choose`]).
    pub variant: crate::flash::variant::Variant,
}

/// 2-D convolution, NCHW / OIHW.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv2d {
    pub x: View,
    pub w: View,
    pub bias: Option<View>,
    pub out: View,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
    /// Applied to each output element (bias included) as it is stored; its operand 0 is that
    /// element, its space the output's `[n, o, y, x]`.
    pub epilogue: Option<FusedKernel>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Pool2d {
    pub max: bool,
    pub x: View,
    pub out: View,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

/// Gradient of conv2d with respect to its input (`dy` and `w` given) or its weight (`x` and
/// `dy` given); the shapes and attributes are the forward conv's.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv2dGrad {
    pub wrt_weight: bool,
    /// `dy` for the input gradient, `x` for the weight gradient.
    pub a: View,
    /// `w` for the input gradient, `dy` for the weight gradient.
    pub b: View,
    pub out: View,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}

/// Gradient of pooling with respect to its input; `x` is given for max pooling.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool2dGrad {
    pub x: Option<View>,
    pub dy: View,
    pub out: View,
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

/// `out[v, d] = sum over positions p with ids[p] == v of dy[p, d]`.
#[derive(Clone, Debug, PartialEq)]
pub struct ScatterAdd {
    pub dy: View,
    pub ids: View,
    pub out: View,
}

/// Zeros with `dy` placed where `slice(axis, start, .., step)` reads.
#[derive(Clone, Debug, PartialEq)]
pub struct SliceGrad {
    pub dy: View,
    pub out: View,
    pub axis: usize,
    pub start: usize,
    pub step: usize,
}

/// `out = cumsum(x, axis, exclusive, reverse)`: a running sum along `axis` of each line of `x`
/// (one line per position of the other axes).
#[derive(Clone, Debug, PartialEq)]
pub struct Scan {
    pub x: View,
    pub out: View,
    pub axis: usize,
    pub exclusive: bool,
    pub reverse: bool,
}

/// `out[i.., d] = table[ids[i..], d]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gather {
    pub table: View,
    pub ids: View,
    pub out: View,
}

/// What a kernel is, by the shape of its work: the name `sinter inspect` lists as its pattern
/// and kernel names end with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pattern {
    /// A fused program without reduction.
    Elementwise,
    /// A fused program whose outputs are one value per row.
    Reduce,
    /// A fused program with outputs over the reduced axes too (softmax).
    RowMap,
    Matmul,
    MatmulEpilogue,
    /// The second pass of a split-K matmul.
    SplitKSum,
    SplitKSumEpilogue,
    /// The sum of the whole flash backward's `dQ` partial sums.
    FlashDqSum,
    Conv2d,
    Conv2dEpilogue,
    MaxPool2d,
    AvgPool2d,
    Gather,
    Conv2dGradWeight,
    Conv2dGradInput,
    MaxPool2dGrad,
    AvgPool2dGrad,
    ScatterAdd,
    SliceGrad,
    /// A prefix sum along an axis.
    Cumsum,
    FlashForward,
    FlashBackwardDkDv,
    FlashBackwardDq,
    /// The whole flash backward in one kernel.
    FlashBackward,
    /// The tensor-core flash backward's `dO` maxima.
    FlashGradientScale,
}

impl Pattern {
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Elementwise => "elementwise",
            Pattern::Reduce => "reduce",
            Pattern::RowMap => "row_map",
            Pattern::Matmul => "matmul",
            Pattern::MatmulEpilogue => "matmul_epilogue",
            Pattern::SplitKSum => "splitk_sum",
            Pattern::SplitKSumEpilogue => "splitk_sum_epilogue",
            Pattern::FlashDqSum => "flash_dq_sum",
            Pattern::Conv2d => "conv2d",
            Pattern::Conv2dEpilogue => "conv2d_epilogue",
            Pattern::MaxPool2d => "max_pool2d",
            Pattern::AvgPool2d => "avg_pool2d",
            Pattern::Gather => "gather",
            Pattern::Conv2dGradWeight => "conv2d_grad_weight",
            Pattern::Conv2dGradInput => "conv2d_grad_input",
            Pattern::MaxPool2dGrad => "max_pool2d_grad",
            Pattern::AvgPool2dGrad => "avg_pool2d_grad",
            Pattern::ScatterAdd => "scatter_add",
            Pattern::SliceGrad => "slice_grad",
            Pattern::Cumsum => "cumsum",
            Pattern::FlashForward => "flash_attention_fwd",
            Pattern::FlashBackwardDkDv => "flash_attention_bwd_dkdv",
            Pattern::FlashBackwardDq => "flash_attention_bwd_dq",
            Pattern::FlashBackward => "flash_attention_bwd",
            Pattern::FlashGradientScale => "flash_attention_bwd_scale",
        }
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum KernelPlan {
    /// A fused kernel program (elementwise maps, reductions, row kernels).
    Fused(FusedKernel),
    Matmul(Matmul),
    SplitSum(SplitSum),
    Conv2d(Conv2d),
    Pool2d(Pool2d),
    Gather(Gather),
    Conv2dGrad(Conv2dGrad),
    Pool2dGrad(Pool2dGrad),
    ScatterAdd(ScatterAdd),
    SliceGrad(SliceGrad),
    Scan(Scan),
    Flash(Box<Flash>),
    FlashScale(FlashScale),
}

impl KernelPlan {
    /// What the kernel is (`sinter inspect --json`'s `pattern`).
    pub fn pattern(&self) -> Pattern {
        match self {
            KernelPlan::Fused(f) => f.program.pattern(),
            KernelPlan::Matmul(m) if m.epilogue.is_some() => Pattern::MatmulEpilogue,
            KernelPlan::Matmul(_) => Pattern::Matmul,
            KernelPlan::SplitSum(s) if s.epilogue.is_some() => Pattern::SplitKSumEpilogue,
            KernelPlan::SplitSum(s) if s.flash_dq => Pattern::FlashDqSum,
            KernelPlan::SplitSum(_) => Pattern::SplitKSum,
            KernelPlan::Conv2d(c) if c.epilogue.is_some() => Pattern::Conv2dEpilogue,
            KernelPlan::Conv2d(_) => Pattern::Conv2d,
            KernelPlan::Pool2d(p) if p.max => Pattern::MaxPool2d,
            KernelPlan::Pool2d(_) => Pattern::AvgPool2d,
            KernelPlan::Gather(_) => Pattern::Gather,
            KernelPlan::Conv2dGrad(c) if c.wrt_weight => Pattern::Conv2dGradWeight,
            KernelPlan::Conv2dGrad(_) => Pattern::Conv2dGradInput,
            KernelPlan::Pool2dGrad(p) if p.x.is_some() => Pattern::MaxPool2dGrad,
            KernelPlan::Pool2dGrad(_) => Pattern::AvgPool2dGrad,
            KernelPlan::ScatterAdd(_) => Pattern::ScatterAdd,
            KernelPlan::Flash(f) => f.spec.pattern(),
            KernelPlan::FlashScale(_) => Pattern::FlashGradientScale,
            KernelPlan::SliceGrad(_) => Pattern::SliceGrad,
            KernelPlan::Scan(_) => Pattern::Cumsum,
        }
    }

    /// Bytes the kernel reads and writes: for each view it touches, its distinct elements (a
    /// broadcast axis counts once).
    pub fn bytes_moved(&self) -> u64 {
        let distinct = |v: &View| -> u64 {
            v.shape
                .iter()
                .zip(&v.strides)
                .filter(|(_, s)| **s != 0)
                .map(|(&d, _)| d as u64)
                .product::<u64>()
                * sinter_ir::artifact::WORD_BYTES
        };
        let (reads, writes) = self.views();
        reads.into_iter().chain(writes).map(distinct).sum()
    }

    /// Calls `f` on every view the plan holds, an epilogue's included.
    pub fn views_mut(&mut self, f: &mut dyn FnMut(&mut View)) {
        let mut fused = |k: &mut FusedKernel| {
            k.operands
                .iter_mut()
                .chain(&mut k.outputs)
                .for_each(&mut *f);
        };
        match self {
            KernelPlan::Fused(k) => fused(k),
            KernelPlan::Matmul(m) => {
                m.epilogue.iter_mut().for_each(&mut fused);
                [&mut m.a, &mut m.b, &mut m.out].into_iter().for_each(f);
            }
            KernelPlan::SplitSum(s) => {
                s.epilogue.iter_mut().for_each(&mut fused);
                [&mut s.partials, &mut s.out].into_iter().for_each(f);
            }
            KernelPlan::Conv2d(c) => {
                c.epilogue.iter_mut().for_each(&mut fused);
                [&mut c.x, &mut c.w, &mut c.out]
                    .into_iter()
                    .chain(&mut c.bias)
                    .for_each(f);
            }
            KernelPlan::Pool2d(p) => [&mut p.x, &mut p.out].into_iter().for_each(f),
            KernelPlan::Gather(g) => [&mut g.table, &mut g.ids, &mut g.out]
                .into_iter()
                .for_each(f),
            KernelPlan::Conv2dGrad(c) => [&mut c.a, &mut c.b, &mut c.out].into_iter().for_each(f),
            KernelPlan::Pool2dGrad(p) => [&mut p.dy, &mut p.out]
                .into_iter()
                .chain(&mut p.x)
                .for_each(f),
            KernelPlan::ScatterAdd(s) => {
                [&mut s.dy, &mut s.ids, &mut s.out].into_iter().for_each(f)
            }
            KernelPlan::SliceGrad(s) => [&mut s.dy, &mut s.out].into_iter().for_each(f),
            KernelPlan::Scan(s) => [&mut s.x, &mut s.out].into_iter().for_each(f),
            KernelPlan::Flash(k) => {
                let k = &mut **k;
                [&mut k.q, &mut k.k, &mut k.v]
                    .into_iter()
                    .chain(&mut k.d_o)
                    .chain(&mut k.lse)
                    .chain(&mut k.delta)
                    .chain(&mut k.d_o_scale)
                    .chain(&mut k.score_extras)
                    .chain(&mut k.dscore_extras)
                    .chain(&mut k.outputs)
                    .for_each(f);
            }
            KernelPlan::FlashScale(s) => [&mut s.d_o, &mut s.out].into_iter().for_each(f),
        }
    }

    /// Buffers read and written, for liveness (an epilogue's operands are read).
    pub fn buffers(&self) -> (Vec<crate::layout::BufferId>, Vec<crate::layout::BufferId>) {
        let (reads, writes) = self.views();
        (
            reads.iter().map(|v| v.buffer).collect(),
            writes.iter().map(|v| v.buffer).collect(),
        )
    }
}

impl Flash {
    /// Every view the kernel reads.
    pub fn reads(&self) -> Vec<&View> {
        let mut v = vec![&self.q, &self.k, &self.v];
        v.extend(self.d_o.iter().chain(&self.lse).chain(&self.delta));
        v.extend(&self.d_o_scale);
        v.extend(self.score_extras.iter().chain(&self.dscore_extras));
        v
    }

    /// The dtype the kernel stores result `i` in: [`crate::flash::FlashSpec::half`]'s, but
    /// the whole backward's `dQ` partial sums are `f32` (the sum kernel after it rounds).
    pub fn result_dtype(&self, i: usize) -> sinter_ir::DType {
        use crate::flash::FlashKind;
        let partials = self.spec.kind == FlashKind::Backward && i == 2;
        if self.spec.half.contains(i) && !partials {
            sinter_ir::DType::F16
        } else {
            sinter_ir::DType::F32
        }
    }
}

/// The tensors an epilogue reads besides the value it is applied to (its operand 0).
fn epilogue_reads(epilogue: &Option<FusedKernel>) -> &[View] {
    epilogue.as_ref().map_or(&[], |e| &e.operands[1..])
}

impl std::fmt::Display for KernelPlan {
    /// One line: the pattern, its variant where it has one, what it reads and what it writes
    /// (views: buffer, shape, and offset and strides where not contiguous).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.pattern())?;
        match self {
            KernelPlan::Matmul(m) => write!(f, " [tile {}]", m.tile)?,
            KernelPlan::Flash(k) => write!(f, " [{}]", k.variant)?,
            _ => {}
        }
        let (reads, writes) = self.views();
        let list = |vs: &[&View]| -> String {
            let v: Vec<String> = vs.iter().map(|v| v.to_string()).collect();
            v.join(", ")
        };
        write!(f, ": {} -> {}", list(&reads), list(&writes))
    }
}

impl KernelPlan {
    /// The views the plan reads (an epilogue's operands included) and writes, in order.
    pub fn views(&self) -> (Vec<&View>, Vec<&View>) {
        match self {
            KernelPlan::Fused(k) => (k.operands.iter().collect(), k.outputs.iter().collect()),
            KernelPlan::Matmul(m) => {
                let mut r = vec![&m.a, &m.b];
                r.extend(epilogue_reads(&m.epilogue));
                (r, vec![&m.out])
            }
            KernelPlan::SplitSum(s) => {
                let mut r = vec![&s.partials];
                r.extend(epilogue_reads(&s.epilogue));
                (r, vec![&s.out])
            }
            KernelPlan::Conv2d(c) => {
                let mut r: Vec<&View> = [&c.x, &c.w].into_iter().chain(&c.bias).collect();
                r.extend(epilogue_reads(&c.epilogue));
                (r, vec![&c.out])
            }
            KernelPlan::Pool2d(p) => (vec![&p.x], vec![&p.out]),
            KernelPlan::Gather(g) => (vec![&g.table, &g.ids], vec![&g.out]),
            KernelPlan::Conv2dGrad(c) => (vec![&c.a, &c.b], vec![&c.out]),
            KernelPlan::Pool2dGrad(p) => ([&p.dy].into_iter().chain(&p.x).collect(), vec![&p.out]),
            KernelPlan::ScatterAdd(s) => (vec![&s.dy, &s.ids], vec![&s.out]),
            KernelPlan::SliceGrad(s) => (vec![&s.dy], vec![&s.out]),
            KernelPlan::Scan(s) => (vec![&s.x], vec![&s.out]),
            KernelPlan::Flash(k) => (k.reads(), k.outputs.iter().collect()),
            KernelPlan::FlashScale(s) => (vec![&s.d_o], vec![&s.out]),
        }
    }
}
