//! Gradient checks: every differentiable op, and every differentiable operand of it, against
//! central finite differences on the reference interpreter (f64).
//!
//! Each case is a `.sir` graph, usually `loss = sum(mul(op(...), r))` with a random `r`, and one
//! or more `grad` statements. [`Case::check`] expands composites, differentiates, feeds random
//! values (non-zero, in ±[0.1, 2), unless the case says otherwise), and compares every element
//! of every gradient with `(loss(w + h) - loss(w - h)) / 2h`.

use sinter_ir::key;
use std::collections::HashMap;

use sinter_compiler::autodiff::{Differentiated, differentiate};
use sinter_ir::interp::{Tensor, evaluate};
use sinter_ir::{Graph, Op, ValueDef};

const H: f64 = 1e-6;
const TOLERANCE: f64 = 1e-6;

/// xorshift64*: deterministic test data.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1)
    }

    fn bits(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.bits() >> 11) as f64 / (1u64 << 53) as f64)
    }
}

/// How one leaf gets its test values.
#[derive(Clone)]
enum Fill {
    /// ±[0.1, 2): away from the kinks of relu, abs and friends.
    NonZero,
    /// [0.1, 3).
    Positive,
    /// Integers in `0..bound` (i32 ids and labels).
    Below(usize),
    Given(Vec<f64>),
}

struct Case {
    src: String,
    fills: HashMap<String, Fill>,
    seed: u64,
}

fn case(src: impl Into<String>) -> Case {
    Case {
        src: src.into(),
        fills: HashMap::new(),
        seed: 1,
    }
}

impl Case {
    fn positive(mut self, name: &str) -> Case {
        self.fills.insert(name.into(), Fill::Positive);
        self
    }

    fn below(mut self, name: &str, bound: usize) -> Case {
        self.fills.insert(name.into(), Fill::Below(bound));
        self
    }

    fn given(mut self, name: &str, data: Vec<f64>) -> Case {
        self.fills.insert(name.into(), Fill::Given(data));
        self
    }

    fn seed(mut self, seed: u64) -> Case {
        self.seed = seed;
        self
    }

    /// Differentiates the case's graph and checks every gradient against finite differences.
    fn check(self) -> Differentiated {
        let g = sinter_ir::text::parse(&self.src)
            .unwrap_or_else(|d| panic!("{}\n{}", d.render("case.sir", &self.src), self.src));
        let expanded = sinter_ir::expand::expand_composites(&g);
        let d = differentiate(&expanded).unwrap_or_else(|e| panic!("{e}\n{}", self.src));
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
        assert_lean(&d.graph);

        let mut rng = Rng::new(self.seed);
        let mut feed: HashMap<String, Tensor> = HashMap::new();
        for id in g.value_ids() {
            let v = g.value(id);
            if !v.is_leaf() {
                continue;
            }
            let n = v.ty.numel();
            let fill = self.fills.get(&v.name).cloned().unwrap_or(Fill::NonZero);
            let data = match fill {
                Fill::NonZero => (0..n)
                    .map(|_| {
                        let m = rng.uniform(0.1, 2.0);
                        if rng.bits() & 1 == 0 { m } else { -m }
                    })
                    .collect(),
                Fill::Positive => (0..n).map(|_| rng.uniform(0.1, 3.0)).collect(),
                Fill::Below(bound) => (0..n).map(|_| (rng.bits() % bound as u64) as f64).collect(),
                Fill::Given(data) => data,
            };
            feed.insert(v.name.clone(), Tensor::new(v.ty.clone(), data));
        }
        let run = |feed: &HashMap<String, Tensor>| {
            let (mut inputs, mut persistent) = (HashMap::new(), HashMap::new());
            for (name, t) in feed {
                let v = d.graph.lookup(name).expect("leaves keep their names");
                match d.graph.value(v).def {
                    ValueDef::Input => inputs.insert(name.clone(), t.clone()),
                    _ => persistent.insert(name.clone(), t.clone()),
                };
            }
            evaluate(&d.graph, &inputs, &persistent).unwrap_or_else(|e| panic!("{e}"))
        };
        let value = |ev: &sinter_ir::interp::Evaluation, name: &str| -> Tensor {
            let id = d
                .graph
                .lookup(name)
                .unwrap_or_else(|| panic!("`{name}` is kept"));
            ev.values[id.index()].clone().expect("computed")
        };
        let base = run(&feed);
        let mut checked = 0;
        for node in g.nodes.iter().filter(|n| n.op == Op::Grad) {
            let loss = g.name_of(node.inputs[0]);
            for (&w, &result) in node.inputs[1..].iter().zip(&node.outputs) {
                let (w, result) = (g.name_of(w), g.name_of(result));
                let analytic = value(&base, result);
                assert_eq!(&analytic.ty, g.ty(g.lookup(w).unwrap()), "type of {result}");
                for k in 0..analytic.numel() {
                    let at = |delta: f64| {
                        let mut f = feed.clone();
                        f.get_mut(w).unwrap().data[k] += delta;
                        value(&run(&f), loss).data[0]
                    };
                    let numeric = (at(H) - at(-H)) / (2.0 * H);
                    let a = analytic.data[k];
                    let scale = a.abs().max(numeric.abs()).max(1.0);
                    assert!(
                        (a - numeric).abs() <= TOLERANCE * scale,
                        "d{loss}/d{w}[{k}]: autodiff {a}, finite differences {numeric}\n{}\n--- differentiated:\n{}",
                        self.src,
                        sinter_ir::text::print(&d.graph)
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 0, "the case checks no gradient");
        d
    }
}

/// No `grad` is left, and no `mul` by a literal 1 was emitted.
fn assert_lean(g: &Graph) {
    let is_one = |v| {
        g.producer(v)
            .map(|n| g.node(n))
            .is_some_and(|n| n.op == Op::Constant && n.attr(key::VALUE) == 1.0)
    };
    for node in &g.nodes {
        assert_ne!(node.op, Op::Grad, "a grad node is left");
        if node.op == Op::Mul {
            assert!(!node.inputs.iter().any(|&v| is_one(v)), "mul by 1 emitted");
        }
    }
}

/// `loss = sum(mul(EXPR, r))` with `r` of the result's shape; `decls` declares the operands and
/// `wrt` lists what to differentiate with respect to.
fn scalar_loss(decls: &str, expr: &str, out: &str, wrt: &str) -> String {
    let names: Vec<String> = wrt.split(',').map(|w| format!("d{}", w.trim())).collect();
    format!(
        "graph t {{\n{decls}\n  input r: f32[{out}]\n  loss = sum(mul({expr}, r))\n  \
         {} = grad(loss, {wrt})\n  output loss, {}\n}}",
        names.join(", "),
        names.join(", ")
    )
}

// ---------------------------------------------------------------- elementwise

#[test]
fn unary_ops() {
    let ops = [
        "neg",
        "abs",
        "exp",
        "square",
        "relu",
        "sigmoid",
        "tanh",
        "silu",
        "sin",
        "cos",
        "gelu",
        "reciprocal",
    ];
    for op in ops {
        case(scalar_loss(
            "  input x: f32[3, 4]",
            &format!("{op}(x)"),
            "3, 4",
            "x",
        ))
        .check();
    }
    for op in ["log", "sqrt", "rsqrt"] {
        case(scalar_loss(
            "  input x: f32[3, 4]",
            &format!("{op}(x)"),
            "3, 4",
            "x",
        ))
        .positive("x")
        .check();
    }
    let tanh = r#"gelu(x, approximate="tanh")"#;
    case(scalar_loss("  input x: f32[3, 4]", tanh, "3, 4", "x")).check();
}

#[test]
fn gelu_at_zero() {
    // The erf form divides y by x; at x = 0 it takes Φ(0) = ½.
    let src = scalar_loss("  input x: f32[3]", "gelu(x)", "3", "x");
    case(src).given("x", vec![0.0, 1e-9, -0.3]).check();
}

#[test]
fn binary_ops_with_broadcasting() {
    let shapes = [
        ("3, 4", "3, 4", "3, 4"),
        ("3, 1", "4", "3, 4"),
        ("2, 1, 4", "3, 1", "2, 3, 4"),
        ("", "2, 3", "2, 3"),
        ("2, 3", "1", "2, 3"),
    ];
    for op in ["add", "sub", "mul", "div", "maximum", "minimum"] {
        for (a, b, out) in shapes {
            let decls = format!("  input a: f32[{a}]\n  input b: f32[{b}]");
            case(scalar_loss(&decls, &format!("{op}(a, b)"), out, "a, b")).check();
        }
    }
}

#[test]
fn pow_both_operands() {
    let decls = "  input a: f32[3, 1]\n  input b: f32[4]";
    case(scalar_loss(decls, "pow(a, b)", "3, 4", "a, b"))
        .positive("a")
        .check();
    // literal exponents fold b - 1; negative bases are fine for them
    for e in ["2", "3.0", "1", "-1.5", "0"] {
        let src = scalar_loss("  input a: f32[5]", &format!("pow(a, {e})"), "5", "a");
        let c = case(src);
        let c = if e == "-1.5" { c.positive("a") } else { c };
        c.check();
    }
}

#[test]
fn where_with_broadcasting() {
    let decls = "  input c: f32[3, 1]\n  input a: f32[3, 4]\n  input b: f32[4]";
    case(scalar_loss(decls, "where(gt(c, 0), a, b)", "3, 4", "a, b")).check();
}

#[test]
fn cast_f32_to_f32_is_identity() {
    let src = scalar_loss(
        "  input x: f32[3]",
        r#"cast(exp(x), dtype="f32")"#,
        "3",
        "x",
    );
    case(src).check();
}

#[test]
fn non_differentiable_paths_are_ignored() {
    // argmax, comparisons, iota and an i32 round trip carry no gradient, but may sit next to
    // the differentiable path.
    let src = r#"graph t {
  input x: f32[3, 4]
  input r: f32[3, 4]
  idx = cast(argmax(x, axis=1, keepdim=true), dtype="f32")
  gate = gt(x, iota(shape=[3, 4], axis=1))
  trunc = cast(cast(x, dtype="i32"), dtype="f32")
  y = add(mul(exp(x), add(gate, idx)), trunc)
  loss = sum(mul(y, r))
  dx = grad(loss, x)
  output dx
}"#;
    case(src).check();
}

// ---------------------------------------------------------------- reductions

#[test]
fn reductions_over_axes() {
    let axes = [
        "",
        ", axes=[1]",
        ", axes=[-1]",
        ", axes=[0, 2]",
        ", axes=[0], keepdim=true",
        ", axes=[-2, -1], keepdim=true",
    ];
    for op in ["sum", "mean", "max", "min", "logsumexp"] {
        for a in axes {
            let src = format!(
                "graph t {{\n  input x: f32[2, 3, 4]\n  loss = sum(mul(exp({op}(x{a})), 0.5))\n  dx = grad(loss, x)\n  output dx\n}}"
            );
            case(src).check();
        }
    }
}

#[test]
fn softmax_and_log_softmax() {
    for op in ["softmax", "log_softmax"] {
        for axis in ["0", "1", "-1"] {
            let expr = format!("{op}(x, axis={axis})");
            case(scalar_loss(
                "  input x: f32[3, 4, 2]",
                &expr,
                "3, 4, 2",
                "x",
            ))
            .check();
        }
    }
}

/// Every form of the prefix sum along each axis, and one of its gradient (a `cumsum` itself),
/// differentiated twice through `tanh` so the second derivative is checked too.
#[test]
fn cumsum_every_form() {
    for axis in ["0", "1", "-1"] {
        for exclusive in ["false", "true"] {
            for reverse in ["false", "true"] {
                let expr =
                    format!("cumsum(x, axis={axis}, exclusive={exclusive}, reverse={reverse})");
                case(scalar_loss(
                    "  input x: f32[3, 4, 2]",
                    &expr,
                    "3, 4, 2",
                    "x",
                ))
                .check();
            }
        }
    }
    let expr = "cumsum(tanh(cumsum(x, axis=1, reverse=true)), axis=1, exclusive=true)";
    case(scalar_loss("  input x: f32[2, 5]", expr, "2, 5", "x")).check();
}

// ---------------------------------------------------------------- shape and layout

#[test]
fn layout_ops() {
    #[rustfmt::skip]
    let cases = [
        ("reshape(x, shape=[4, -1])",                        "4, 6"),
        ("permute(x, perm=[2, 0, 1])",                       "4, 2, 3"),
        ("permute(x, perm=[-1, 1, 0])",                      "4, 3, 2"),
        ("transpose(x, dim0=0, dim1=-1)",                    "4, 3, 2"),
        ("unsqueeze(x, axis=-1)",                            "2, 3, 4, 1"),
        ("squeeze(unsqueeze(x, axis=1), axis=1)",            "2, 3, 4"),
        ("slice(x, axis=2, start=1, end=4)",                 "2, 3, 3"),
        ("slice(x, axis=-2, start=0, end=3, step=2)",        "2, 2, 4"),
        ("slice(x, axis=2, start=-3, end=-1)",               "2, 3, 2"),
        ("broadcast_to(slice(x, axis=0, start=1, end=2), shape=[5, 2, 3, 4])", "5, 2, 3, 4"),
    ];
    for (expr, out) in cases {
        case(scalar_loss("  input x: f32[2, 3, 4]", expr, out, "x")).check();
    }
    let src = scalar_loss(
        "  input x: f32[3, 1]",
        "broadcast_to(x, shape=[2, 3, 4])",
        "2, 3, 4",
        "x",
    );
    case(src).check();
}

#[test]
fn concat_operands() {
    let decls = "  input a: f32[2, 3]\n  input b: f32[2, 1]\n  input c: f32[2, 2]";
    case(scalar_loss(
        decls,
        "concat(a, b, c, axis=-1)",
        "2, 6",
        "a, b, c",
    ))
    .check();
    // the same value twice, and a single operand
    let decls = "  input a: f32[2, 3]";
    case(scalar_loss(
        decls,
        "concat(a, exp(a), a, axis=0)",
        "6, 3",
        "a",
    ))
    .check();
    case(scalar_loss(decls, "concat(a, axis=0)", "2, 3", "a")).check();
}

// ---------------------------------------------------------------- matmul

#[test]
fn matmul_shapes() {
    #[rustfmt::skip]
    let cases = [
        ("3, 4",       "4, 5",    "3, 5"),
        ("4",          "4",       ""),
        ("3, 4",       "4",       "3"),
        ("4",          "4, 5",    "5"),
        ("4",          "2, 4, 5", "2, 5"),
        ("2, 3, 4",    "4",       "2, 3"),
        ("2, 3, 4",    "4, 5",    "2, 3, 5"),
        ("3, 4",       "2, 4, 5", "2, 3, 5"),
        ("2, 1, 3, 4", "3, 4, 2", "2, 3, 3, 2"),
        ("1, 3, 4",    "2, 4, 2", "2, 3, 2"),
    ];
    for (a, b, out) in cases {
        let decls = format!("  input a: f32[{a}]\n  input b: f32[{b}]");
        let src = if out.is_empty() {
            format!(
                "graph t {{\n{decls}\n  loss = mul(matmul(a, b), 0.7)\n  da, db = grad(loss, a, b)\n  output da, db\n}}"
            )
        } else {
            scalar_loss(&decls, "matmul(a, b)", out, "a, b")
        };
        case(src).check();
    }
}

// ---------------------------------------------------------------- neural-network ops

#[test]
fn norms() {
    let decls = "  input x: f32[2, 3, 5]\n  param g: f32[5] = ones\n  param b: f32[5] = zeros";
    case(scalar_loss(
        decls,
        "layer_norm(x, g, b)",
        "2, 3, 5",
        "x, g, b",
    ))
    .check();
    case(scalar_loss(
        decls,
        "layer_norm(x, g, b, eps=0.5)",
        "2, 3, 5",
        "x, g, b",
    ))
    .check();
    case(scalar_loss(decls, "rms_norm(x, g)", "2, 3, 5", "x, g")).check();
    let decls = "  input x: f32[5]\n  input g: f32[5]";
    case(scalar_loss(decls, "rms_norm(x, g, eps=0.1)", "5", "x, g")).check();
}

#[test]
fn group_norm_shapes() {
    let cases = [
        ("2, 4, 3, 2", 2),
        ("2, 6", 3),
        ("1, 4, 5", 4),
        ("2, 4, 2, 2", 1),
    ];
    for (shape, groups) in cases {
        let decls = format!(
            "  input x: f32[{shape}]\n  param g: f32[{c}] = ones\n  param b: f32[{c}] = zeros",
            c = shape.split(", ").nth(1).unwrap()
        );
        let expr = format!("group_norm(x, g, b, groups={groups})");
        case(scalar_loss(&decls, &expr, shape, "x, g, b")).check();
    }
}

#[test]
fn conv2d_configurations() {
    // (x, w, attrs, out)
    #[rustfmt::skip]
    let cases = [
        ("2, 2, 5, 4", "3, 2, 3, 2", "", "2, 3, 3, 3"),
        ("1, 2, 6, 5", "2, 2, 3, 3", ", stride=2, padding=1", "1, 2, 3, 3"),
        ("1, 4, 6, 6", "4, 2, 2, 3", ", stride=[2, 1], padding=[1, 2], dilation=[2, 1], groups=2", "1, 4, 3, 8"),
        ("1, 3, 5, 5", "3, 1, 3, 3", ", padding=1, dilation=2, groups=3", "1, 3, 3, 3"),
        ("1, 1, 7, 7", "2, 1, 2, 2", ", stride=3", "1, 2, 2, 2"),
    ];
    for (x, w, attrs, out) in cases {
        let o = w.split(", ").next().unwrap();
        let decls = format!(
            "  input x: f32[{x}]\n  param w: f32[{w}] = zeros\n  param b: f32[{o}] = zeros"
        );
        case(scalar_loss(
            &decls,
            &format!("conv2d(x, w, b{attrs})"),
            out,
            "x, w, b",
        ))
        .check();
        case(scalar_loss(
            &decls,
            &format!("conv2d(x, w{attrs})"),
            out,
            "x, w",
        ))
        .check();
    }
}

#[test]
fn pooling_with_padding() {
    #[rustfmt::skip]
    let cases = [
        ("kernel=2",                                     "2, 2, 2, 3"),
        ("kernel=3, stride=1",                           "2, 2, 2, 4"),
        ("kernel=[3, 2], stride=[2, 1], padding=[1, 1]", "2, 2, 2, 7"),
        ("kernel=2, stride=3, padding=1",                "2, 2, 2, 3"),
    ];
    for (attrs, out) in cases {
        for op in ["max_pool2d", "avg_pool2d"] {
            let expr = format!("{op}(x, {attrs})");
            case(scalar_loss("  input x: f32[2, 2, 4, 6]", &expr, out, "x")).check();
        }
    }
}

#[test]
fn embedding_with_repeated_ids() {
    let decls = "  param table: f32[5, 3] = zeros\n  input ids: i32[2, 4]";
    case(scalar_loss(
        decls,
        "embedding(table, ids)",
        "2, 4, 3",
        "table",
    ))
    .given("ids", vec![1.0, 4.0, 1.0, 0.0, 4.0, 4.0, 2.0, 1.0])
    .check();
}

#[test]
fn cross_entropy_reductions() {
    for reduction in ["mean", "sum"] {
        let src = format!(
            "graph t {{\n  input logits: f32[4, 5]\n  input labels: i32[4]\n  \
             loss = cross_entropy(logits, labels, reduction=\"{reduction}\")\n  \
             d = grad(loss, logits)\n  output d\n}}"
        );
        case(src).below("labels", 5).check();
    }
    let decls = "  input logits: f32[4, 5]\n  input labels: i32[4]";
    let expr = r#"cross_entropy(logits, labels, reduction="none")"#;
    case(scalar_loss(decls, expr, "4", "logits"))
        .below("labels", 5)
        .check();
    // an ignored label: those rows get no gradient and leave the mean
    for reduction in ["mean", "sum", "none"] {
        let expr =
            format!("cross_entropy(logits, labels, reduction=\"{reduction}\", ignore_index=1)");
        let out = if reduction == "none" { "6" } else { "" };
        let decls = "  input logits: f32[6, 3]\n  input labels: i32[6]";
        case(scalar_loss(decls, &expr, out, "logits"))
            .given("labels", vec![1.0, 0.0, 1.0, 2.0, 1.0, 0.0])
            .check();
    }
    // scaled: dy is not 1
    let src = "graph t {\n  input logits: f32[3, 4]\n  input labels: i32[3]\n  \
               loss = mul(cross_entropy(logits, labels), 3.0)\n  d = grad(loss, logits)\n  output d\n}";
    case(src).below("labels", 4).check();
}

#[test]
fn mse_loss_reductions() {
    for reduction in ["mean", "sum"] {
        let src = format!(
            "graph t {{\n  input a: f32[3, 2]\n  input b: f32[3, 2]\n  \
             loss = mse_loss(a, b, reduction=\"{reduction}\")\n  da, db = grad(loss, a, b)\n  output da\n}}"
        );
        case(src).check();
    }
    let decls = "  input a: f32[3, 2]\n  input b: f32[3, 2]";
    let expr = r#"mse_loss(a, b, reduction="none")"#;
    case(scalar_loss(decls, expr, "3, 2", "a, b")).check();
}

#[test]
fn attention_with_every_mask_kind() {
    let qkv = "  input q: f32[1, 2, 3, 2]\n  input k: f32[1, 2, 4, 2]\n  input v: f32[1, 2, 4, 3]";
    let square =
        "  input q: f32[1, 2, 4, 2]\n  input k: f32[1, 2, 4, 2]\n  input v: f32[1, 2, 4, 3]";
    #[rustfmt::skip]
    let cases = [
        (qkv,    "", "attention(q, k, v)", "1, 2, 3, 3"),
        (qkv,    "", "attention(q, k, v, scale=0.3)", "1, 2, 3, 3"),
        (square, "", "attention(q, k, v, causal=true)", "1, 2, 4, 3"),
        (square, "", "attention(q, k, v, window=2)", "1, 2, 4, 3"),
        (square, "", "attention(q, k, v, causal=true, window=2)", "1, 2, 4, 3"),
        (square, "  input m: f32[4, 4]", "attention(q, k, v, m)", "1, 2, 4, 3"),
        (square, "  input m: f32[4, 4]", "attention(q, k, v, m, causal=true, window=3)", "1, 2, 4, 3"),
        (qkv,    "  input m: f32[1, 2, 3, 4]", r#"attention(q, k, v, m, mask_kind="additive")"#, "1, 2, 3, 3"),
    ];
    // boolean masks keep the diagonal and the first key, so no row is empty
    let keep: Vec<f64> = (0..16)
        .map(|i| f64::from(i % 4 == i / 4 || i % 4 == 0 || i % 3 == 1))
        .collect();
    for (qkv, mask, expr, out) in cases {
        let decls = format!("{qkv}\n{mask}");
        let wrt = if expr.contains("additive") {
            "q, k, v, m"
        } else {
            "q, k, v"
        };
        let c = case(scalar_loss(&decls, expr, out, wrt));
        let c = if expr.contains(", m") && !expr.contains("additive") {
            c.given("m", keep.clone())
        } else {
            c
        };
        c.check();
    }
}

#[test]
fn attention_with_grouped_and_shared_key_value_heads() {
    // four query heads over two key/value heads (grouped) and over one (multi-query): each
    // key/value head's gradient sums those of the query heads of its group
    #[rustfmt::skip]
    let cases = [
        ("  input q: f32[1, 4, 3, 2]\n  input k: f32[1, 2, 4, 2]\n  input v: f32[1, 2, 4, 3]", "attention(q, k, v, causal=true)"),
        ("  input q: f32[2, 4, 3, 2]\n  input k: f32[2, 1, 4, 2]\n  input v: f32[2, 1, 4, 3]", "attention(q, k, v)"),
        ("  input q: f32[1, 4, 3, 2]\n  input k: f32[1, 2, 4, 2]\n  input v: f32[1, 2, 4, 3]\n  input m: f32[1, 4, 3, 4]", r#"attention(q, k, v, m, mask_kind="additive")"#),
    ];
    for (decls, expr) in cases {
        let batch = if decls.contains("q: f32[2") { 2 } else { 1 };
        let out = format!("{batch}, 4, 3, 3");
        case(scalar_loss(decls, expr, &out, "q, k, v")).check();
    }
}

// ---------------------------------------------------------------- graph structure

#[test]
fn fan_out_sums_gradients() {
    let src = r#"graph t {
  input x: f32[3]
  param w: f32[3] = zeros
  input r: f32[3]
  y = mul(x, x)
  z = add(y, mul(sin(x), w))
  loss = sum(mul(add(z, mul(y, w)), r))
  dx, dw = grad(loss, x, w)
  output dx, dw
}"#;
    case(src).check();
}

#[test]
fn two_grad_statements() {
    let src = r#"graph t {
  input x: f32[2, 3]
  param w: f32[3, 2] = zeros
  param b: f32[2] = zeros
  h = add(matmul(x, w), b)
  loss1 = sum(square(h))
  loss2 = mean(tanh(h))
  dw1, db1 = grad(loss1, w, b)
  dw2, dx2 = grad(loss2, w, x)
  output loss1, loss2, dw1, db1, dw2, dx2
}"#;
    case(src).check();
}

#[test]
fn grad_with_respect_to_states_and_the_same_leaf_twice() {
    let src = r#"graph t {
  input x: f32[3]
  state s: f32[3] = ones
  loss = sum(mul(exp(x), s))
  ds, dx, ds2 = grad(loss, s, x, s)
  output ds, dx, ds2
}"#;
    case(src).check();
}

#[test]
fn loss_is_a_leaf_or_a_scalar_product() {
    // grad of a scalar input with respect to itself is 1
    case("graph t {\n  input x: f32[]\n  dx = grad(x, x)\n  output dx\n}").check();
    // d(a·w)/dw = a: the gradient is an existing value, copied to keep the name
    let src = "graph t {\n  input a: f32[]\n  param w: f32[] = zeros\n  loss = mul(a, w)\n  dw = grad(loss, w)\n  output dw\n}";
    case(src).check();
}

#[test]
fn mlp_training_step() {
    let src = r#"graph mlp {
  input x: f32[4, 6]
  input labels: i32[4]
  param w1: f32[6, 5] = zeros
  param b1: f32[5] = zeros
  param w2: f32[5, 3] = zeros
  param b2: f32[3] = zeros
  h = relu(add(matmul(x, w1), b1))
  logits = add(matmul(h, w2), b2)
  loss = cross_entropy(logits, labels)
  dw1, db1, dw2, db2 = grad(loss, w1, b1, w2, b2)
  output loss, dw1, db1, dw2, db2
}"#;
    case(src).below("labels", 3).check();
}

#[test]
fn transformer_block() {
    let src = r#"graph block {
  input ids: i32[2, 4]
  param emb: f32[6, 4] = zeros
  param g: f32[4] = ones
  param b: f32[4] = zeros
  param wqkv: f32[4, 12] = zeros
  input targets: i32[8]
  x = embedding(emb, ids)
  n = layer_norm(x, g, b)
  qkv = matmul(n, wqkv)
  q = permute(reshape(slice(qkv, axis=2, start=0, end=4), shape=[2, 4, 2, 2]), perm=[0, 2, 1, 3])
  k = permute(reshape(slice(qkv, axis=2, start=4, end=8), shape=[2, 4, 2, 2]), perm=[0, 2, 1, 3])
  v = permute(reshape(slice(qkv, axis=2, start=8, end=12), shape=[2, 4, 2, 2]), perm=[0, 2, 1, 3])
  a = attention(q, k, v, causal=true)
  y = add(x, reshape(permute(a, perm=[0, 2, 1, 3]), shape=[2, 4, 4]))
  logits = matmul(reshape(y, shape=[8, 4]), transpose(emb, dim0=0, dim1=1))
  loss = cross_entropy(logits, targets)
  demb, dg, db, dw = grad(loss, emb, g, b, wqkv)
  output loss, demb, dg, db, dw
}"#;
    case(src).below("ids", 6).below("targets", 6).check();
}

// ---------------------------------------------------------------- backward primitives (second order)

#[test]
fn backward_primitives_are_differentiable() {
    let decls = "  input dy: f32[1, 4, 3, 8]\n  input w: f32[4, 2, 2, 3]";
    let expr = "conv2d_grad_input(dy, w, input_shape=[1, 4, 6, 6], stride=[2, 1], padding=[1, 2], dilation=[2, 1], groups=2)";
    case(scalar_loss(decls, expr, "1, 4, 6, 6", "dy, w")).check();
    let decls = "  input x: f32[1, 4, 6, 6]\n  input dy: f32[1, 4, 3, 8]";
    let expr = "conv2d_grad_weight(x, dy, weight_shape=[4, 2, 2, 3], stride=[2, 1], padding=[1, 2], dilation=[2, 1], groups=2)";
    case(scalar_loss(decls, expr, "4, 2, 2, 3", "x, dy")).check();
    let expr = "avg_pool2d_grad(dy, input_shape=[1, 2, 4, 5], kernel=[3, 2], stride=[2, 1], padding=[1, 1])";
    case(scalar_loss(
        "  input dy: f32[1, 2, 2, 6]",
        expr,
        "1, 2, 4, 5",
        "dy",
    ))
    .check();
    let decls = "  input dy: f32[2, 3, 2]\n  input ids: i32[2, 3]";
    case(scalar_loss(
        decls,
        "embedding_grad(dy, ids, num_embeddings=4)",
        "4, 2",
        "dy",
    ))
    .given("ids", vec![0.0, 3.0, 3.0, 1.0, 0.0, 3.0])
    .check();
    let expr = "slice_grad(dy, shape=[3, 7], axis=1, start=1, end=7, step=3)";
    case(scalar_loss("  input dy: f32[3, 2]", expr, "3, 7", "dy")).check();
}

#[test]
fn random_values_do_not_matter() {
    // The same small network under several seeds.
    let src = scalar_loss(
        "  input x: f32[2, 3]\n  input w: f32[3, 3]",
        "softmax(mul(matmul(x, w), gelu(x)), axis=-1)",
        "2, 3",
        "x, w",
    );
    for seed in 1..4 {
        case(src.clone()).seed(seed).check();
    }
}
