//! Elementwise kernels: one thread per output element; every operand is addressed through
//! its own strides over the output coordinates (broadcast axes have stride 0).

use std::fmt::Write;

use sinter_ir::DType;

use super::{
    ENTRY_ARGS, Emitter, WORKGROUP, address, decompose, f32_literal, grid, load, store,
    thread_index,
};
use crate::kernel::{BinaryFn, Elementwise, Inst, UnaryFn};

pub fn emit(e: &mut Emitter, k: &Elementwise) -> (String, [u32; 3], u32) {
    let numel: usize = k.shape.iter().product();
    let mut s = String::new();
    let helpers = helpers(k);
    s.push_str(&helpers);
    writeln!(s, "@compute @workgroup_size({WORKGROUP})").unwrap();
    writeln!(s, "fn main({ENTRY_ARGS}) {{").unwrap();
    thread_index(&mut s);
    let n = e.param(numel);
    writeln!(s, "    if (gi >= {n}) {{ return; }}").unwrap();
    let dims = e.params(&k.shape);
    decompose(&mut s, "    ", "gi", "c", &dims);

    let mut types = Vec::with_capacity(k.insts.len());
    for (i, inst) in k.insts.iter().enumerate() {
        let (expr, ty) = match *inst {
            Inst::Load(input) => {
                let op = &k.inputs[input];
                let arena = e.arena(op.view.buffer);
                let base = e.base(op.view.buffer, op.view.offset);
                let strides = e.params(&op.view.strides);
                (
                    load(&arena, &address(&base, "c", &strides), op.dtype),
                    op.dtype,
                )
            }
            Inst::Const(c) => (f32_literal(c), DType::F32),
            Inst::Coord(axis) => (format!("f32(c{axis})"), DType::F32),
            Inst::Unary(f, x) => (unary(f, &format!("v{x}")), DType::F32),
            Inst::Binary(f, a, b) => (binary(f, &format!("v{a}"), &format!("v{b}")), DType::F32),
            Inst::Select(c, a, b) => {
                let zero = if types[c] == DType::I32 { "0i" } else { "0.0" };
                (format!("select(v{b}, v{a}, v{c} != {zero})"), types[a])
            }
            Inst::Cast(to, x) => match (types[x], to) {
                (from, to) if from == to => (format!("v{x}"), to),
                (_, DType::I32) => (format!("i32(v{x})"), DType::I32),
                (_, DType::F32) => (format!("f32(v{x})"), DType::F32),
            },
        };
        writeln!(s, "    let v{i} = {expr};").unwrap();
        types.push(ty);
    }
    for (out, inst) in &k.outputs {
        let arena = e.arena(out.view.buffer);
        let base = e.base(out.view.buffer, out.view.offset);
        let strides = e.params(&out.view.strides);
        writeln!(
            s,
            "    {}",
            store(
                &arena,
                &address(&base, "c", &strides),
                &format!("v{inst}"),
                out.dtype
            )
        )
        .unwrap();
    }
    s.push_str("}\n");
    (s, grid(numel.div_ceil(WORKGROUP as usize)), 0)
}

fn unary(f: UnaryFn, x: &str) -> String {
    match f {
        UnaryFn::Neg => format!("-{x}"),
        UnaryFn::Abs => format!("abs({x})"),
        UnaryFn::Exp => format!("exp({x})"),
        UnaryFn::Log => format!("log({x})"),
        UnaryFn::Sqrt => format!("sqrt({x})"),
        UnaryFn::Rsqrt => format!("inverseSqrt({x})"),
        UnaryFn::Reciprocal => format!("1.0 / {x}"),
        UnaryFn::Square => format!("{x} * {x}"),
        UnaryFn::Relu => format!("max({x}, 0.0)"),
        UnaryFn::Sigmoid => format!("1.0 / (1.0 + exp(-{x}))"),
        UnaryFn::Tanh => format!("tanh(clamp({x}, -15.0, 15.0))"),
        UnaryFn::Silu => format!("{x} / (1.0 + exp(-{x}))"),
        UnaryFn::Sin => format!("sin({x})"),
        UnaryFn::Cos => format!("cos({x})"),
        UnaryFn::GeluErf => format!("0.5 * {x} * (1.0 + erf_f32({x} * 0.70710677))"),
        UnaryFn::GeluTanh => {
            format!(
                "0.5 * {x} * (1.0 + tanh(clamp(0.7978846 * ({x} + 0.044715 * {x} * {x} * {x}), -15.0, 15.0)))"
            )
        }
    }
}

fn binary(f: BinaryFn, a: &str, b: &str) -> String {
    // Comparisons work on f32 and i32 operands alike and yield f32 0/1.
    let cmp = |op: &str| format!("select(0.0, 1.0, {a} {op} {b})");
    match f {
        BinaryFn::Add => format!("{a} + {b}"),
        BinaryFn::Sub => format!("{a} - {b}"),
        BinaryFn::Mul => format!("{a} * {b}"),
        BinaryFn::Div => format!("{a} / {b}"),
        BinaryFn::Pow => format!("pow_f32({a}, {b})"),
        BinaryFn::Maximum => format!("max({a}, {b})"),
        BinaryFn::Minimum => format!("min({a}, {b})"),
        BinaryFn::Eq => cmp("=="),
        BinaryFn::Lt => cmp("<"),
        BinaryFn::Le => cmp("<="),
        BinaryFn::Gt => cmp(">"),
        BinaryFn::Ge => cmp(">="),
    }
}

/// Helper functions the body needs (WGSL has no `erf`, and its `pow` is undefined for
/// negative bases).
fn helpers(k: &Elementwise) -> String {
    let mut s = String::new();
    if k.insts
        .iter()
        .any(|i| matches!(i, Inst::Unary(UnaryFn::GeluErf, _)))
    {
        s.push_str(ERF);
    }
    if k.insts
        .iter()
        .any(|i| matches!(i, Inst::Binary(BinaryFn::Pow, _, _)))
    {
        s.push_str(POW);
    }
    s
}

/// erf by Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7).
const ERF: &str = "fn erf_f32(x: f32) -> f32 {
    let a = abs(x);
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let poly = ((((1.0614054 * t - 1.4531521) * t + 1.4214138) * t - 0.28449672) * t + 0.2548296) * t;
    return sign(x) * (1.0 - poly * exp(-a * a));
}
";

/// torch.pow: negative bases allowed for integral exponents; `pow(x, 0) = 1`.
const POW: &str = "fn pow_f32(a: f32, b: f32) -> f32 {
    if (b == 0.0) { return 1.0; }
    if (a >= 0.0) { return pow(a, b); }
    if (floor(b) != b) { return bitcast<f32>(0x7fc00000u); }
    let m = pow(-a, b);
    return select(m, -m, fract(b * 0.5) != 0.0);
}
";
