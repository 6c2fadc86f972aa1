//! The semantics of a [`Program`], as a direct evaluator in f64 over the interpreter's
//! tensors. It is the oracle for fusion: a fused program must compute what its parts computed
//! (tests evaluate both), and the GPU kernel generated from a program must agree with it.

use sinter_ir::interp::{Tensor, scalar, to_i32};
use sinter_ir::{DType, Op, TensorType};

use super::{Access, Axis, Combine, Inst, Program, Scalar};

/// The shape of a tensor accessed with `access` in `p`'s space.
pub fn shape_of(p: &Program, access: &Access) -> Vec<usize> {
    access
        .axes
        .iter()
        .map(|a| match *a {
            Axis::Space(k) => p.extent(k as usize),
            Axis::Shifted { len, .. } => len as usize,
            Axis::One | Axis::Collapsed(_) => 1,
        })
        .collect()
}

/// Evaluates `p` on `operands` (one tensor per operand, of the shape its access gives) and
/// returns one tensor per output.
pub fn eval(p: &Program, operands: &[Tensor]) -> Vec<Tensor> {
    let d = p.domain.len();
    let mut outs: Vec<Tensor> = p
        .outputs
        .iter()
        .map(|o| {
            let shape = shape_of(p, &o.access);
            let n = shape.iter().product();
            Tensor::new(TensorType::new(o.access.dtype, shape), vec![0.0; n])
        })
        .collect();
    let dtypes = p.dtypes();
    let mut values = vec![0.0; p.insts.len()];
    let mut reduced = vec![f64::NAN; p.phases.len()];
    let reduce_points: usize = p.reduce.iter().product();
    for dom in Points::new(&p.domain) {
        let point = |r: &[usize]| -> Vec<usize> { dom.iter().chain(r).copied().collect() };
        for (k, phase) in p.phases.iter().enumerate() {
            let mut acc = Acc::new(phase.combine);
            for (flat, r) in Points::new(&p.reduce).enumerate() {
                run(p, &point(&r), operands, &reduced, &dtypes, &mut values);
                acc.add(values[phase.value as usize], flat);
            }
            reduced[k] = acc.result();
        }
        let rows_only = |o: &super::Output| {
            !o.access
                .axes
                .iter()
                .any(|a| matches!(a, Axis::Space(k) if *k as usize >= d))
        };
        let r0 = vec![0; p.reduce.len()];
        run(p, &point(&r0), operands, &reduced, &dtypes, &mut values);
        for (o, out) in p.outputs.iter().zip(outs.iter_mut()) {
            if rows_only(o) {
                store(out, &o.access, &point(&r0), values[o.value as usize]);
            }
        }
        if p.outputs.iter().any(|o| !rows_only(o)) {
            for r in Points::new(&p.reduce).take(reduce_points.max(1)) {
                let at = point(&r);
                run(p, &at, operands, &reduced, &dtypes, &mut values);
                for (o, out) in p.outputs.iter().zip(outs.iter_mut()) {
                    if !rows_only(o) {
                        store(out, &o.access, &at, values[o.value as usize]);
                    }
                }
            }
        }
    }
    outs
}

/// Every instruction at one point of the space.
fn run(
    p: &Program,
    at: &[usize],
    operands: &[Tensor],
    reduced: &[f64],
    dtypes: &[DType],
    values: &mut [f64],
) {
    for (i, inst) in p.insts.iter().enumerate() {
        values[i] = match inst {
            Inst::Load(o) => {
                let t = &operands[*o as usize];
                match offset(&p.operands[*o as usize], t.shape(), at) {
                    Some(i) => t.data[i],
                    None => 0.0,
                }
            }
            Inst::Const(bits) => f32::from_bits(*bits) as f64,
            Inst::Coord(k) => at[*k as usize] as f64,
            Inst::Map(Scalar::Cast(to), args) => {
                let v = values[args[0] as usize];
                match (dtypes[args[0] as usize], to) {
                    (DType::F32, DType::I32) => to_i32(v) as f64,
                    _ => v,
                }
            }
            Inst::Map(Scalar::GeluTanh, args) => {
                scalar(Op::Gelu, true, &[values[args[0] as usize]])
            }
            Inst::Map(Scalar::Op(op), args) => {
                let a: Vec<f64> = args.iter().map(|&x| values[x as usize]).collect();
                scalar(*op, false, &a)
            }
            Inst::Reduced(k) => reduced[*k as usize],
        };
    }
}

/// The flat index of the point `at` in a tensor of `shape` accessed with `access`; `None`
/// outside a window ([`Axis::Shifted`]).
fn offset(access: &Access, shape: &[usize], at: &[usize]) -> Option<usize> {
    let mut off = 0;
    for (j, a) in access.axes.iter().enumerate() {
        let c = match *a {
            Axis::Space(k) => at[k as usize],
            Axis::Shifted { k, by, len } => {
                let c = at[k as usize].checked_sub(by as usize)?;
                (c < len as usize).then_some(c)?
            }
            Axis::One | Axis::Collapsed(_) => 0,
        };
        off = off * shape[j] + c;
    }
    Some(off)
}

fn store(t: &mut Tensor, access: &Access, at: &[usize], v: f64) {
    let shape = t.shape().to_vec();
    let i = offset(access, &shape, at).expect("outputs are not windowed");
    t.data[i] = v;
}

/// A phase's running combination.
struct Acc {
    combine: Combine,
    value: f64,
    index: usize,
    started: bool,
}

impl Acc {
    fn new(combine: Combine) -> Acc {
        Acc {
            combine,
            value: 0.0,
            index: 0,
            started: false,
        }
    }

    fn add(&mut self, v: f64, flat: usize) {
        if !self.started {
            (self.value, self.index, self.started) = (v, flat, true);
            return;
        }
        let nan = |x: f64| x.is_nan();
        match self.combine {
            Combine::Sum => self.value += v,
            Combine::Max | Combine::Min if nan(self.value) => {}
            Combine::Max | Combine::Min if nan(v) => self.value = v,
            Combine::Max => self.value = self.value.max(v),
            Combine::Min => self.value = self.value.min(v),
            Combine::ArgMax { last } => {
                let takes = if last {
                    nan(v) || (!nan(self.value) && v >= self.value)
                } else {
                    !nan(self.value) && (v > self.value || nan(v))
                };
                if takes {
                    (self.value, self.index) = (v, flat);
                }
            }
        }
    }

    fn result(&self) -> f64 {
        match self.combine {
            Combine::ArgMax { .. } => self.index as f64,
            _ => self.value,
        }
    }
}

/// The points of a box in C order (one empty point for an empty box).
struct Points {
    shape: Vec<usize>,
    next: Option<Vec<usize>>,
}

impl Points {
    fn new(shape: &[usize]) -> Points {
        Points {
            shape: shape.to_vec(),
            next: Some(vec![0; shape.len()]),
        }
    }
}

impl Iterator for Points {
    type Item = Vec<usize>;

    fn next(&mut self) -> Option<Vec<usize>> {
        let cur = self.next.take()?;
        let mut n = cur.clone();
        let mut a = n.len();
        loop {
            if a == 0 {
                break;
            }
            a -= 1;
            n[a] += 1;
            if n[a] < self.shape[a] {
                self.next = Some(n);
                break;
            }
            n[a] = 0;
        }
        Some(cur)
    }
}
