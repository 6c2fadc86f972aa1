//! Printing then parsing gives back the same graph: a property test over random graphs built
//! through the builder API, and hand-written cases for every construct of the text format.

use proptest::prelude::*;
use sinter_ir::attr::{Attr, Attrs};
use sinter_ir::graph::{Graph, Init, ValueId};
use sinter_ir::op::Op;
use sinter_ir::text::{parse, print};
use sinter_ir::types::{DType, TensorType};

/// Asserts `parse(print(g)) == g`, showing the text and the errors when it does not hold.
fn assert_round_trip(g: &Graph) -> Result<(), TestCaseError> {
    let text = print(g);
    match parse(&text) {
        Ok(back) => {
            prop_assert!(
                &back == g,
                "reparsed graph differs; text:\n{text}\n{back:#?}\n{g:#?}"
            );
            prop_assert_eq!(print(&back), text);
        }
        Err(d) => prop_assert!(false, "{}\n{}", text, d.render("printed.sir", &text)),
    }
    Ok(())
}

/// splitmix64: a small deterministic generator, seeded by proptest.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    fn pick_id(&mut self, items: &[ValueId]) -> Option<ValueId> {
        (!items.is_empty()).then(|| self.pick(items))
    }

    /// A float with a tricky text form: tiny, huge, negative zero, thirds, random bits.
    fn float(&mut self) -> f64 {
        const SPECIAL: [f64; 10] = [
            0.0,
            -0.0,
            1.0,
            -2.5,
            0.1,
            1.0 / 3.0,
            1e-30,
            1e300,
            f64::MIN_POSITIVE,
            5e-324,
        ];
        if self.chance(70) {
            return self.pick(&SPECIAL);
        }
        loop {
            let v = f64::from_bits(self.next());
            if v.is_finite() {
                return v;
            }
        }
    }

    fn non_negative(&mut self) -> f64 {
        self.pick(&[0.0, 1e-3, 0.1, 0.3, 1.0 / 3.0, 2.0, 1e-8])
    }
}

const UNARY: &[Op] = &[
    Op::Neg,
    Op::Abs,
    Op::Exp,
    Op::Log,
    Op::Sqrt,
    Op::Rsqrt,
    Op::Reciprocal,
    Op::Square,
    Op::Relu,
    Op::Sigmoid,
    Op::Tanh,
    Op::Silu,
    Op::Sin,
    Op::Cos,
    Op::Gelu,
];
const BINARY: &[Op] = &[
    Op::Add,
    Op::Sub,
    Op::Mul,
    Op::Div,
    Op::Pow,
    Op::Maximum,
    Op::Minimum,
    Op::Eq,
    Op::Lt,
    Op::Le,
    Op::Gt,
    Op::Ge,
];
const REDUCE: &[Op] = &[Op::Sum, Op::Mean, Op::Max, Op::Min, Op::Logsumexp];

/// Builds a random valid graph by trying random builder calls; rejected calls are skipped.
struct RandomGraph {
    g: Graph,
    rng: Rng,
    counter: usize,
}

impl RandomGraph {
    fn build(seed: u64, steps: usize) -> Graph {
        let mut r = RandomGraph {
            g: Graph::new("random"),
            rng: Rng(seed),
            counter: 0,
        };
        for _ in 0..3 {
            r.declare();
        }
        for _ in 0..steps {
            r.step();
        }
        r.g
    }

    /// A new user name, or `None` for a generated one; sometimes a generated-looking `_N`.
    fn name(&mut self) -> Option<String> {
        self.counter += 1;
        let k = self.counter;
        match self.rng.below(10) {
            0..=4 => None,
            5 => Some(format!("_{}", self.g.values.len() + self.rng.below(4))),
            6 => Some(format!("layer{k}.weight")),
            _ => Some(format!("v{k}")),
        }
    }

    fn user_name(&mut self) -> String {
        self.name().unwrap_or_else(|| format!("n{}", self.counter))
    }

    fn values(&self, pred: impl Fn(&Graph, ValueId) -> bool) -> Vec<ValueId> {
        self.g.value_ids().filter(|&v| pred(&self.g, v)).collect()
    }

    fn f32_values(&self) -> Vec<ValueId> {
        self.values(|g, v| g.ty(v).dtype == DType::F32)
    }

    fn random_f32(&mut self) -> Option<ValueId> {
        // Prefer recent values so that chains (and nesting) form.
        let all = self.f32_values();
        if !all.is_empty() && self.rng.chance(60) {
            let recent = &all[all.len().saturating_sub(3)..];
            return Some(self.rng.pick(recent));
        }
        self.rng.pick_id(&all)
    }

    fn shape(&mut self) -> Vec<usize> {
        let rank = self.rng.below(4);
        (0..rank).map(|_| self.rng.pick(&[1, 2, 3, 4])).collect()
    }

    fn init(&mut self) -> Init {
        match self.rng.below(6) {
            0 => Init::Zeros,
            1 => Init::Ones,
            5 => Init::External,
            2 => Init::Full(if self.rng.chance(20) {
                self.rng.pick(&[f64::INFINITY, f64::NEG_INFINITY])
            } else {
                self.rng.float()
            }),
            3 => Init::Normal {
                mean: self.rng.float(),
                std: self.rng.non_negative(),
                seed: self.rng.pick(&[0, 1, 42, u64::MAX, i64::MAX as u64 + 1]),
            },
            _ => {
                let lo = self.rng.pick(&[-1.0, 0.0, -0.0, 0.5, 1e-3]);
                Init::Uniform {
                    lo,
                    hi: lo + self.rng.pick(&[0.5, 1.0, 2.0]),
                    seed: self.rng.next(),
                }
            }
        }
    }

    fn declare_typed(&mut self, ty: TensorType) -> Option<ValueId> {
        let name = self.user_name();
        let init = self.init();
        let result = match self.rng.below(3) {
            0 => self.g.add_input(name, ty),
            1 => self.g.add_param(name, ty, init),
            _ => self.g.add_state(name, ty, init),
        };
        result.ok()
    }

    fn declare(&mut self) {
        let shape = self.shape();
        let dtype = if self.rng.chance(15) {
            DType::I32
        } else {
            DType::F32
        };
        self.declare_typed(TensorType::new(dtype, shape));
    }

    fn node(&mut self, op: Op, inputs: &[ValueId], attrs: Attrs) -> Option<Vec<ValueId>> {
        let names = self.name().map(|n| vec![n]);
        self.g.add_node(op, inputs, attrs, names.as_deref()).ok()
    }

    fn multi_node(&mut self, op: Op, inputs: &[ValueId], attrs: Attrs, results: usize) {
        let names: Option<Vec<String>> = if self.rng.chance(50) {
            None
        } else {
            Some((0..results).map(|_| self.user_name()).collect())
        };
        // The builder does not check that one call's names differ (see the text parser).
        if let Some(names) = &names
            && (1..names.len()).any(|i| names[..i].contains(&names[i]))
        {
            return;
        }
        let _ = self.g.add_node(op, inputs, attrs, names.as_deref());
    }

    fn axis(&mut self, rank: usize) -> i64 {
        let rank = rank.max(1) as i64;
        self.rng.below(2 * rank as usize) as i64 - rank
    }

    fn step(&mut self) {
        match self.rng.below(24) {
            0 => self.declare(),
            1..=3 => self.unary(),
            4..=6 => self.binary(),
            7 => self.reduce(),
            8 => self.layout(),
            9 => self.slice_or_concat(),
            10 => self.matmul(),
            11 => self.normalize(),
            12 => self.nn(),
            13 => self.loss(),
            14 => self.grad(),
            15 => self.optimizer(),
            16 => self.assign(),
            17 => self.output(),
            18 => self.rename(),
            19 => self.constants(),
            20 => self.attention(),
            21 => self.where_or_cast(),
            _ => self.nested_chain(),
        }
    }

    fn unary(&mut self) {
        let Some(x) = self.random_f32() else { return };
        let op = self.rng.pick(UNARY);
        let mut attrs = Attrs::new();
        if op == Op::Gelu && self.rng.chance(50) {
            attrs.set(
                "approximate",
                Attr::Str(self.rng.pick(&["none", "tanh"]).into()),
            );
        }
        self.node(op, &[x], attrs);
    }

    fn binary(&mut self) {
        let Some(a) = self.random_f32() else { return };
        let b = if self.rng.chance(30) {
            self.g.constant(self.rng.float()).ok()
        } else {
            self.random_f32()
        };
        let Some(b) = b else { return };
        let op = self.rng.pick(BINARY);
        let inputs = if self.rng.chance(50) { [a, b] } else { [b, a] };
        self.node(op, &inputs, Attrs::new());
    }

    fn reduce(&mut self) {
        let Some(x) = self.random_f32() else { return };
        let rank = self.g.ty(x).rank();
        let mut attrs = Attrs::new();
        if self.rng.chance(60) && rank > 0 {
            let a = self.axis(rank);
            attrs.set("axes", Attr::ints(&[a]));
        }
        if self.rng.chance(40) {
            attrs.set("keepdim", Attr::Bool(self.rng.chance(50)));
        }
        if self.rng.chance(20) {
            let a = self.axis(rank);
            self.node(Op::Argmax, &[x], Attrs::new().with("axis", Attr::Int(a)));
            return;
        }
        if self.rng.chance(15) && rank > 0 {
            let a = self.axis(rank);
            let attrs = Attrs::new()
                .with("axis", Attr::Int(a))
                .with("exclusive", Attr::Bool(self.rng.chance(50)))
                .with("reverse", Attr::Bool(self.rng.chance(50)));
            self.node(Op::Cumsum, &[x], attrs);
            return;
        }
        let op = self.rng.pick(REDUCE);
        self.node(op, &[x], attrs);
    }

    fn layout(&mut self) {
        let Some(x) = self.rng.pick_id(&self.values(|_, _| true)) else {
            return;
        };
        let t = self.g.ty(x).clone();
        let rank = t.rank();
        let (op, attrs) = match self.rng.below(6) {
            0 => {
                let numel = t.numel() as i64;
                let shape: &[i64] = match self.rng.below(4) {
                    0 => &[numel],
                    1 => &[-1],
                    2 => &[1, -1],
                    _ => &[numel, 1],
                };
                (Op::Reshape, Attrs::new().with("shape", Attr::ints(shape)))
            }
            1 => {
                let mut perm: Vec<i64> = (0..rank as i64).collect();
                for i in (1..perm.len()).rev() {
                    let j = self.rng.below(i + 1);
                    perm.swap(i, j);
                }
                (Op::Permute, Attrs::new().with("perm", Attr::ints(&perm)))
            }
            2 => (
                Op::Transpose,
                Attrs::new()
                    .with("dim0", Attr::Int(self.axis(rank)))
                    .with("dim1", Attr::Int(self.axis(rank))),
            ),
            3 => {
                let mut shape: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
                shape.insert(0, 2);
                (
                    Op::BroadcastTo,
                    Attrs::new().with("shape", Attr::ints(&shape)),
                )
            }
            4 => (
                Op::Unsqueeze,
                Attrs::new().with("axis", Attr::Int(self.axis(rank + 1))),
            ),
            _ => (
                Op::Squeeze,
                Attrs::new().with("axis", Attr::Int(self.axis(rank))),
            ),
        };
        self.node(op, &[x], attrs);
    }

    fn slice_or_concat(&mut self) {
        let Some(x) = self.rng.pick_id(&self.values(|g, v| g.ty(v).rank() > 0)) else {
            return;
        };
        let t = self.g.ty(x).clone();
        let axis = self.axis(t.rank());
        if self.rng.chance(50) {
            let extent = t.shape[axis.rem_euclid(t.rank() as i64) as usize] as i64;
            let start = self.rng.below(extent as usize) as i64;
            let mut attrs = Attrs::new()
                .with("axis", Attr::Int(axis))
                .with(
                    "start",
                    Attr::Int(start - if self.rng.chance(30) { extent } else { 0 }),
                )
                .with("end", Attr::Int(extent));
            if self.rng.chance(40) {
                attrs.set("step", Attr::Int(self.rng.pick(&[1, 2, 3])));
            }
            self.node(Op::Slice, &[x], attrs);
        } else {
            let n = 1 + self.rng.below(3);
            let inputs = vec![x; n];
            self.node(
                Op::Concat,
                &inputs,
                Attrs::new().with("axis", Attr::Int(axis)),
            );
        }
    }

    fn matmul(&mut self) {
        let Some(a) = self
            .rng
            .pick_id(&self.values(|g, v| g.ty(v).dtype == DType::F32 && g.ty(v).rank() > 0))
        else {
            return;
        };
        let k = *self.g.ty(a).shape.last().unwrap_or(&1);
        let shape = if self.rng.chance(30) {
            vec![k]
        } else {
            vec![k, self.rng.pick(&[1, 2, 5])]
        };
        let b = match self
            .rng
            .pick_id(&self.values(|g, v| g.ty(v) == &TensorType::f32(shape.clone())))
        {
            Some(b) if self.rng.chance(50) => b,
            _ => match self.declare_typed(TensorType::f32(shape)) {
                Some(b) => b,
                None => return,
            },
        };
        self.node(Op::Matmul, &[a, b], Attrs::new());
    }

    fn normalize(&mut self) {
        let Some(x) = self.random_f32() else { return };
        let t = self.g.ty(x).clone();
        match self.rng.below(3) {
            0 => {
                let op = self.rng.pick(&[Op::Softmax, Op::LogSoftmax]);
                let mut attrs = Attrs::new();
                if self.rng.chance(60) {
                    attrs.set("axis", Attr::Int(self.axis(t.rank())));
                }
                self.node(op, &[x], attrs);
            }
            1 => {
                let Some(&last) = t.shape.last() else { return };
                let Some(gamma) = self.declare_typed(TensorType::f32(vec![last])) else {
                    return;
                };
                let mut attrs = Attrs::new();
                if self.rng.chance(50) {
                    attrs.set(
                        "eps",
                        Attr::Float(self.rng.pick(&[1e-5, 1e-6, 0.1, 1.0 / 3.0])),
                    );
                }
                if self.rng.chance(50) {
                    self.node(Op::RmsNorm, &[x, gamma], attrs);
                } else {
                    self.node(Op::LayerNorm, &[x, gamma, gamma], attrs);
                }
            }
            _ => {
                if t.rank() < 2 {
                    return;
                }
                let c = t.shape[1];
                let Some(gamma) = self.declare_typed(TensorType::f32(vec![c])) else {
                    return;
                };
                let groups = self.rng.pick(&[1, c as i64]);
                self.node(
                    Op::GroupNorm,
                    &[x, gamma, gamma],
                    Attrs::new().with("groups", Attr::Int(groups)),
                );
            }
        }
    }

    fn nn(&mut self) {
        let Some(x) = self.declare_typed(TensorType::f32(vec![1, 2, 5, 5])) else {
            return;
        };
        match self.rng.below(3) {
            0 => {
                let Some(w) = self.declare_typed(TensorType::f32(vec![3, 2, 2, 2])) else {
                    return;
                };
                let mut inputs = vec![x, w];
                if self.rng.chance(50)
                    && let Some(b) = self.declare_typed(TensorType::f32(vec![3]))
                {
                    inputs.push(b);
                }
                let mut attrs = Attrs::new();
                if self.rng.chance(50) {
                    attrs.set("stride", Attr::Int(2));
                }
                if self.rng.chance(50) {
                    attrs.set("padding", Attr::ints(&[1, 0]));
                }
                if self.rng.chance(30) {
                    attrs.set("dilation", Attr::ints(&[1, 1]));
                }
                self.node(Op::Conv2d, &inputs, attrs);
            }
            1 => {
                let op = self.rng.pick(&[Op::MaxPool2d, Op::AvgPool2d]);
                let mut attrs = Attrs::new().with("kernel", Attr::Int(2));
                if self.rng.chance(50) {
                    attrs.set("stride", Attr::ints(&[1, 2]));
                }
                if self.rng.chance(30) {
                    attrs.set("padding", Attr::ints(&[1, 1]));
                }
                self.node(op, &[x], attrs);
            }
            _ => {
                let Some(table) = self.declare_typed(TensorType::f32(vec![7, 3])) else {
                    return;
                };
                let Some(ids) = self.declare_typed(TensorType::i32(vec![2, 4])) else {
                    return;
                };
                self.node(Op::Embedding, &[table, ids], Attrs::new());
            }
        }
    }

    fn loss(&mut self) {
        let Some(logits) = self
            .rng
            .pick_id(&self.values(|g, v| g.ty(v).dtype == DType::F32 && g.ty(v).rank() == 2))
        else {
            return;
        };
        let mut attrs = Attrs::new();
        if self.rng.chance(50) {
            attrs.set(
                "reduction",
                Attr::Str(self.rng.pick(&["mean", "sum", "none"]).into()),
            );
        }
        if self.rng.chance(50) {
            let n = self.g.ty(logits).shape[0];
            let Some(labels) = self.declare_typed(TensorType::i32(vec![n])) else {
                return;
            };
            self.node(Op::CrossEntropy, &[logits, labels], attrs);
        } else {
            self.node(Op::MseLoss, &[logits, logits], attrs);
        }
    }

    fn scalar_loss(&mut self) -> Option<ValueId> {
        let x = self.random_f32()?;
        if self.g.ty(x).is_scalar() {
            return Some(x);
        }
        self.node(Op::Sum, &[x], Attrs::new()).map(|v| v[0])
    }

    fn grad(&mut self) {
        let Some(loss) = self.scalar_loss() else {
            return;
        };
        let leaves = self.values(|g, v| g.value(v).is_leaf() && g.ty(v).dtype == DType::F32);
        if leaves.is_empty() {
            return;
        }
        let n = 1 + self.rng.below(3);
        let mut inputs = vec![loss];
        for _ in 0..n {
            inputs.push(self.rng.pick(&leaves));
        }
        self.multi_node(Op::Grad, &inputs, Attrs::new(), n);
    }

    fn optimizer(&mut self) {
        let params = self.values(|g, v| g.value(v).is_persistent() && g.ty(v).dtype == DType::F32);
        let Some(p) = self.rng.pick_id(&params) else {
            return;
        };
        let ty = self.g.ty(p).clone();
        let Some(grad) = self.declare_typed(ty.clone()) else {
            return;
        };
        if self.rng.chance(40) {
            let mut attrs = Attrs::new().with("lr", Attr::Float(self.rng.non_negative()));
            let mut inputs = vec![p, grad];
            if self.rng.chance(50)
                && let Some(buf) = self.declare_typed(ty)
            {
                inputs.push(buf);
                attrs.set("momentum", Attr::Float(0.9));
                if self.rng.chance(50) {
                    attrs.set("nesterov", Attr::Bool(true));
                }
            }
            let results = inputs.len() - 1;
            self.multi_node(Op::Sgd, &inputs, attrs, results);
            return;
        }
        let (Some(m), Some(v), Some(t)) = (
            self.declare_typed(ty.clone()),
            self.declare_typed(ty),
            self.declare_typed(TensorType::f32(vec![])),
        ) else {
            return;
        };
        let op = self.rng.pick(&[Op::Adam, Op::AdamW]);
        let mut attrs = Attrs::new();
        if self.rng.chance(50) {
            attrs.set("lr", Attr::Float(self.rng.non_negative()));
        }
        if self.rng.chance(30) {
            attrs.set("beta2", Attr::Float(0.95));
        }
        if self.rng.chance(30) {
            attrs.set("weight_decay", Attr::Int(0));
        }
        self.multi_node(op, &[p, grad, m, v, t], attrs, 3);
    }

    fn assign(&mut self) {
        let targets = self
            .values(|g, v| g.value(v).is_persistent() && !g.assigns.iter().any(|a| a.target == v));
        let Some(t) = self.rng.pick_id(&targets) else {
            return;
        };
        let ty = self.g.ty(t).clone();
        let sources = self.values(|g, v| g.ty(v) == &ty);
        if let Some(s) = self.rng.pick_id(&sources) {
            let _ = self.g.add_assign(t, s);
        }
    }

    fn output(&mut self) {
        if let Some(v) = self.rng.pick_id(&self.values(|_, _| true)) {
            self.g.add_output(v);
        }
    }

    fn rename(&mut self) {
        let Some(v) = self.rng.pick_id(&self.values(|g, v| !g.value(v).is_leaf())) else {
            return;
        };
        let name = match self.rng.below(3) {
            0 => format!("_{}", self.g.values.len() + self.rng.below(3)),
            _ => format!("renamed{}", self.counter),
        };
        self.counter += 1;
        let _ = self.g.rename(v, name);
    }

    fn constants(&mut self) {
        let value = if self.rng.chance(20) {
            self.rng.pick(&[f64::INFINITY, f64::NEG_INFINITY])
        } else {
            self.rng.float()
        };
        let names = self.name().map(|n| vec![n]);
        let _ = self.g.add_node(
            Op::Constant,
            &[],
            Attrs::new().with("value", Attr::Float(value)),
            names.as_deref(),
        );
        if self.rng.chance(30) {
            let shape = self.shape();
            if !shape.is_empty() {
                let shape: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
                let axis = self.axis(shape.len());
                self.node(
                    Op::Iota,
                    &[],
                    Attrs::new()
                        .with("shape", Attr::ints(&shape))
                        .with("axis", Attr::Int(axis)),
                );
            }
        }
    }

    fn attention(&mut self) {
        let ty = TensorType::f32(vec![1, 2, 3, 4]);
        let (Some(q), Some(k), Some(v)) = (
            self.declare_typed(ty.clone()),
            self.declare_typed(ty.clone()),
            self.declare_typed(ty),
        ) else {
            return;
        };
        let mut inputs = vec![q, k, v];
        let mut attrs = Attrs::new();
        if self.rng.chance(40)
            && let Some(mask) = self.declare_typed(TensorType::f32(vec![3, 3]))
        {
            inputs.push(mask);
            attrs.set(
                "mask_kind",
                Attr::Str(self.rng.pick(&["boolean", "additive"]).into()),
            );
        }
        if self.rng.chance(50) {
            attrs.set("causal", Attr::Bool(true));
        }
        if self.rng.chance(30) {
            attrs.set("scale", Attr::Float(0.125));
        }
        if self.rng.chance(30) {
            attrs.set("window", Attr::Int(2));
        }
        self.node(Op::Attention, &inputs, attrs);
    }

    fn where_or_cast(&mut self) {
        let Some(x) = self.random_f32() else { return };
        if self.rng.chance(50) {
            let Some(cond) = self.random_f32() else {
                return;
            };
            let Some(b) = self.random_f32() else { return };
            self.node(Op::Where, &[cond, x, b], Attrs::new());
        } else {
            let dtype = self.rng.pick(&["i32", "f32"]);
            self.node(
                Op::Cast,
                &[x],
                Attrs::new().with("dtype", Attr::Str(dtype.into())),
            );
        }
    }

    /// Several unnamed single-use values in a row: `add(relu(exp(x)), 0.5)` and the like.
    fn nested_chain(&mut self) {
        let Some(mut x) = self.random_f32() else {
            return;
        };
        for _ in 0..1 + self.rng.below(4) {
            let next = if self.rng.chance(50) {
                let op = self.rng.pick(UNARY);
                self.g.add(op, &[x], Attrs::new())
            } else {
                match self.g.constant(self.rng.float()) {
                    Ok(c) => {
                        let op = self.rng.pick(&[Op::Add, Op::Mul, Op::Sub, Op::Maximum]);
                        let inputs = if self.rng.chance(50) { [x, c] } else { [c, x] };
                        self.g.add(op, &inputs, Attrs::new())
                    }
                    Err(_) => return,
                }
            };
            match next {
                Ok(v) => x = v,
                Err(_) => return,
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_graphs_round_trip(seed in any::<u64>(), steps in 0usize..60) {
        let g = RandomGraph::build(seed, steps);
        assert_round_trip(&g)?;
    }
}

/// Parses, asserts the round trip, and returns the printed text.
fn round_trip_text(src: &str) -> String {
    let g = match parse(src) {
        Ok(g) => g,
        Err(d) => panic!("{}", d.render("case.sir", src)),
    };
    let text = print(&g);
    assert_eq!(parse(&text).as_ref(), Ok(&g), "{text}");
    text
}

#[test]
fn design_example_prints_nested() {
    let src = "\
graph mlp {
  input  x: f32[64, 784]
  input  labels: i32[64]
  param  w1: f32[784, 128] = normal(std=0.05, seed=1)
  param  b1: f32[128] = zeros
  param  w2: f32[128, 10] = normal(std=0.05, seed=2)
  param  b2: f32[10] = zeros
  state  step: f32[] = zeros
  h = add(matmul(x, w1), b1)          # nesting allowed; numpy broadcasting
  a = relu(h)
  logits = add(matmul(a, w2), b2)
  loss = cross_entropy(logits, labels)
  dw1, db1 = grad(loss, w1, b1)
  w1_new = sub(w1, mul(dw1, 0.05))
  assign w1 = w1_new
  assign step = add(step, 1)
  output loss, dw1, db1
}
";
    let expected = "\
graph mlp {
  input  x: f32[64, 784]
  input  labels: i32[64]
  param  w1: f32[784, 128] = normal(std=0.05, seed=1)
  param  b1: f32[128] = zeros
  param  w2: f32[128, 10] = normal(std=0.05, seed=2)
  param  b2: f32[10] = zeros
  state  step: f32[] = zeros
  h = add(matmul(x, w1), b1)
  a = relu(h)
  logits = add(matmul(a, w2), b2)
  loss = cross_entropy(logits, labels)
  dw1, db1 = grad(loss, w1, b1)
  w1_new = sub(w1, mul(dw1, 0.05))
  _19 = add(step, 1.0)
  assign w1 = w1_new
  assign step = _19
  output loss, dw1, db1
}
";
    assert_eq!(round_trip_text(src), expected);
}

#[test]
fn every_initializer() {
    let text = round_trip_text(
        "graph g {
  param a: f32[2] = zeros
  param b: f32[2] = ones
  param c: f32[2] = full(-0.5)
  param d: f32[2] = full(value=inf)
  state e: f32[2] = normal
  state f: f32[2] = normal(mean=-1, std=2, seed=18446744073709551615)
  state h: f32[2] = uniform
  state i: f32[2] = uniform(lo=-0.25, hi=0.25, seed=3)
  state j: f32[2] = full(-inf)
}",
    );
    for line in [
        "param  c: f32[2] = full(-0.5)",
        "param  d: f32[2] = full(inf)",
        "state  e: f32[2] = normal",
        "state  f: f32[2] = normal(std=2.0, mean=-1.0, seed=18446744073709551615)",
        "state  h: f32[2] = uniform",
        "state  i: f32[2] = uniform(lo=-0.25, hi=0.25, seed=3)",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
}

#[test]
fn attributes_defaults_and_derived() {
    let text = round_trip_text(
        "graph g {
  input x: f32[2, 3, 4]
  s = sum(x)
  m = mean(x, axes=[-1], keepdim=false)
  p = softmax(x, axis=-1)
  q = conv2d(reshape(x, shape=[1, 2, 3, 4]), reshape(x, shape=[2, 2, 3, 2]), stride=1, padding=[1, 0])
  r = max_pool2d(reshape(x, shape=[1, 2, 3, 4]), kernel=2)
  t = gelu(x, approximate=\"tanh\")
  u = cast(x, dtype=\"i32\")
}",
    );
    for line in [
        "s = sum(x, axes=[0, 1, 2])",
        "m = mean(x, axes=[2])",
        "p = softmax(x, axis=2)",
        "padding=[1, 0])",
        "kernel=[2, 2], stride=[2, 2])",
        "t = gelu(x, approximate=\"tanh\")",
        "u = cast(x, dtype=\"i32\")",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
}

#[test]
fn literals_and_nesting() {
    let text = round_trip_text(
        "graph g {
  input x: f32[3]
  y = maximum(add(mul(x, 2), -1.5e-3), -inf)
  c = 0.5
  z = mul(y, c)
  w = add(exp(z), exp(z))
  output w, c
}",
    );
    assert!(
        text.contains("y = maximum(add(mul(x, 2.0), -0.0015), -inf)"),
        "{text}"
    );
    assert!(text.contains("c = constant(value=0.5)"), "{text}");
    assert!(text.contains("w = add(exp(z), exp(z))"), "{text}");
}

#[test]
fn reused_and_out_of_order_values_become_statements() {
    let mut g = Graph::new("g");
    let x = g.add_input("x", TensorType::f32(vec![3])).unwrap();
    let a = g.add(Op::Relu, &[x], Attrs::new()).unwrap(); // used twice
    let b = g.add(Op::Exp, &[x], Attrs::new()).unwrap(); // used once, but not just before its user
    let c = g.add(Op::Add, &[a, a], Attrs::new()).unwrap();
    let d = g.add(Op::Mul, &[c, b], Attrs::new()).unwrap();
    g.add_input("late", TensorType::f32(vec![3])).unwrap();
    let e = g.add(Op::Neg, &[d], Attrs::new()).unwrap(); // a declaration sits in between
    g.add_output(e);
    let text = print(&g);
    assert_eq!(
        text,
        "graph g {
  input  x: f32[3]
  _1 = relu(x)
  _2 = exp(x)
  _4 = mul(add(_1, _1), _2)
  input  late: f32[3]
  _6 = neg(_4)
  output _6
}
"
    );
    assert_eq!(parse(&text), Ok(g));
}

#[test]
fn generated_looking_user_names() {
    let mut g = Graph::new("g");
    let x = g.add_input("_2", TensorType::f32(vec![3])).unwrap();
    let a = g.add(Op::Relu, &[x], Attrs::new()).unwrap();
    let b = g.add(Op::Exp, &[a], Attrs::new()).unwrap(); // `_2` is taken: `_2_1`
    let c = g.add(Op::Neg, &[b], Attrs::new()).unwrap();
    g.rename(a, "_9".into()).unwrap();
    g.add_output(c);
    assert_eq!(g.name_of(b), "_2_1");
    let text = print(&g);
    assert_round_trip(&g).unwrap();
    assert!(text.contains("_9 = relu(_2)"), "{text}");
}

#[test]
fn multi_result_ops() {
    round_trip_text(
        "graph g {
  param w: f32[3] = normal(std=0.1)
  state m: f32[3] = zeros
  state v: f32[3] = zeros
  state t: f32[] = ones
  state buf: f32[3] = zeros
  loss = sum(square(w))
  dw = grad(loss, w)
  w1, m1, v1 = adam(w, dw, m, v, t, lr=0.01)
  w2, b2 = sgd(w1, dw, buf, lr=0.1, momentum=0.9, nesterov=true)
  w3, m3, v3 = adamw(w2, dw, m1, v1, t)
  assign w = w3; assign m = m3; assign v = v3; assign buf = b2
  assign t = add(t, 1)
  output loss
}",
    );
}
