//! Random well-typed programs with inputs full of special values, for differential tests: the
//! GPU against the interpreter (`tests/tests/random_programs.rs`), and later optimized against
//! `--no-opt`.
//!
//! [`random_program`] takes a seed and returns `.sir` text and a value for every input. A program
//! declares a few f32 inputs (and params where an op needs weights), then chains 3 to 10
//! statements drawn from every op family — elementwise math, comparisons and `where`,
//! reductions and `argmax`, `softmax`, norms, `matmul`, views, `concat`, casts — each on earlier
//! values of fitting shapes (or a literal), and outputs the last few values. Input elements are
//! ordinary numbers, with NaN, ±inf and ±0 mixed in. A quarter of the programs are elementwise
//! only and also get extreme finite values (±1e30, ±3e38), which overflow f32 on the way; the
//! ops where f32 and f64 arithmetic part ways inside one op (norms, sums, matmul) never see
//! those, so the two sides can be compared at all.

use std::collections::HashMap;
use std::fmt::Write as _;

use sinter_ir::interp::Tensor;
use sinter_ir::types::broadcast_shapes;

use crate::Rng;

/// A generated program and its inputs.
#[derive(Clone, Debug)]
pub struct RandomProgram {
    pub source: String,
    pub inputs: HashMap<String, Tensor>,
    /// Whether the inputs hold extreme finite values (then the program is elementwise only).
    pub extreme: bool,
}

#[derive(Clone, Debug)]
struct Value {
    name: String,
    shape: Vec<usize>,
    /// Finite elements stay within ±10 (so that sin and cos are accurate on the GPU).
    small: bool,
    /// An input: its values near zero are exact, not the remains of a cancellation, so ops
    /// that blow them up (division, reciprocal, log, pow) compare fairly between f32 and f64.
    leaf: bool,
}

struct Gen {
    rng: Rng,
    decls: String,
    body: String,
    values: Vec<Value>,
    params: usize,
    extreme: bool,
}

/// The program of `seed` (the same text and inputs for the same seed, on every machine).
pub fn random_program(seed: u64) -> RandomProgram {
    let mut g = Gen {
        rng: Rng::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x5151),
        decls: String::new(),
        body: String::new(),
        values: Vec::new(),
        params: 0,
        extreme: false,
    };
    g.extreme = g.rng.index(4) == 0;
    let mut inputs = HashMap::new();
    let n_inputs = 1 + g.rng.index(3);
    for i in 0..n_inputs {
        let shape = g.shape();
        let name = format!("x{i}");
        writeln!(g.decls, "  input {name}: f32{}", dims(&shape)).unwrap();
        let t = g.input_tensor(&shape);
        inputs.insert(name.clone(), t);
        let small = !g.extreme;
        g.values.push(Value {
            name,
            shape,
            small,
            leaf: true,
        });
    }
    let statements = 3 + g.rng.index(8);
    let mut made = 0;
    let mut tries = 0;
    while made < statements && tries < 200 {
        tries += 1;
        if let Some((expr, shape, small)) = g.statement() {
            let name = format!("v{made}");
            writeln!(g.body, "  {name} = {expr}").unwrap();
            g.values.push(Value {
                name,
                shape,
                small,
                leaf: false,
            });
            made += 1;
        }
    }
    let outputs: Vec<String> = g
        .values
        .iter()
        .rev()
        .take(1 + g.rng.index(3))
        .map(|v| v.name.clone())
        .collect();
    let source = format!(
        "graph random{seed} {{\n{}{}  output {}\n}}\n",
        g.decls,
        g.body,
        outputs.join(", ")
    );
    RandomProgram {
        source,
        inputs,
        extreme: g.extreme,
    }
}

fn dims(shape: &[usize]) -> String {
    let d: Vec<String> = shape.iter().map(usize::to_string).collect();
    format!("[{}]", d.join(", "))
}

fn ints(v: &[usize]) -> String {
    dims(v)
}

impl Gen {
    fn shape(&mut self) -> Vec<usize> {
        let rank = self.rng.index(4);
        (0..rank).map(|_| 1 + self.rng.index(4)).collect()
    }

    /// An f32 input: ordinary values with NaN, ±inf and ±0 mixed in (and extreme finite values
    /// for elementwise-only programs).
    fn input_tensor(&mut self, shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        let extreme = self.extreme;
        let data = (0..n)
            .map(|_| {
                let special = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0];
                let huge = [1e30, -1e30, 3e38, -3e38];
                let v = match self.rng.index(20) {
                    0 => special[self.rng.index(special.len())],
                    1 if extreme => huge[self.rng.index(huge.len())],
                    _ => self.rng.uniform() * 6.0 - 3.0,
                };
                f64::from(v as f32)
            })
            .collect();
        Tensor::f32(shape.to_vec(), data)
    }

    fn pick(&mut self) -> Value {
        let i = self.rng.index(self.values.len());
        self.values[i].clone()
    }

    /// A literal operand.
    fn literal(&mut self) -> String {
        ["0.5", "2.0", "-1.5", "3.0", "0.0", "-0.25"][self.rng.index(6)].to_string()
    }

    fn param(&mut self, shape: &[usize], init: &str) -> String {
        let name = format!("p{}", self.params);
        self.params += 1;
        writeln!(self.decls, "  param {name}: f32{} = {init}", dims(shape)).unwrap();
        name
    }

    /// One statement: an expression, its shape, and whether it stays small.
    fn statement(&mut self) -> Option<(String, Vec<usize>, bool)> {
        let kinds = if self.extreme { 4 } else { 14 };
        let a = self.pick();
        match self.rng.index(kinds) {
            0 => self.unary(&a),
            1 => self.binary(&a),
            2 => {
                let op = ["eq", "lt", "le", "gt", "ge"][self.rng.index(5)];
                let (b, shape) = self.broadcast_partner(&a)?;
                Some((format!("{op}({}, {b})", a.name), shape, true))
            }
            3 => {
                let (b, shape) = self.broadcast_partner(&a)?;
                let c = self.pick();
                let shape = broadcast_shapes(&shape, &c.shape)?;
                let small = a.small && c.small;
                Some((format!("where({b}, {}, {})", a.name, c.name), shape, small))
            }
            4 => {
                if a.shape.is_empty() {
                    return None;
                }
                let op = ["sum", "mean", "max", "min", "logsumexp"][self.rng.index(5)];
                let axes = self.axes(a.shape.len());
                let keepdim = self.rng.index(2) == 0;
                let shape: Vec<usize> = (0..a.shape.len())
                    .filter_map(|i| match (axes.contains(&i), keepdim) {
                        (false, _) => Some(a.shape[i]),
                        (true, true) => Some(1),
                        (true, false) => None,
                    })
                    .collect();
                let small = a.small && matches!(op, "mean" | "max" | "min");
                Some((
                    format!("{op}({}, axes={}, keepdim={keepdim})", a.name, ints(&axes)),
                    shape,
                    small,
                ))
            }
            5 => {
                if a.shape.is_empty() {
                    return None;
                }
                let axis = self.rng.index(a.shape.len());
                let mut shape = a.shape.clone();
                shape.remove(axis);
                Some((
                    format!("cast(argmax({}, axis={axis}), dtype=\"f32\")", a.name),
                    shape,
                    true,
                ))
            }
            6 => {
                if a.shape.is_empty() {
                    return None;
                }
                let op = ["softmax", "log_softmax"][self.rng.index(2)];
                let axis = self.rng.index(a.shape.len());
                Some((
                    format!("{op}({}, axis={axis})", a.name),
                    a.shape.clone(),
                    op == "softmax",
                ))
            }
            7 => {
                let &d = a.shape.last()?;
                let gamma = self.param(&[d], "normal(std=1.0, seed=5)");
                if self.rng.index(2) == 0 {
                    let beta = self.param(&[d], "uniform(lo=-1.0, hi=1.0, seed=6)");
                    Some((
                        format!("layer_norm({}, {gamma}, {beta})", a.name),
                        a.shape.clone(),
                        false,
                    ))
                } else {
                    Some((
                        format!("rms_norm({}, {gamma})", a.name),
                        a.shape.clone(),
                        false,
                    ))
                }
            }
            8 => {
                let &k = a.shape.last()?;
                let n = 1 + self.rng.index(4);
                let w = self.param(&[k, n], "normal(std=0.5, seed=7)");
                let mut shape = a.shape.clone();
                if shape.len() == 1 {
                    shape.clear();
                    shape.push(n);
                } else {
                    *shape.last_mut().expect("rank >= 1") = n;
                }
                Some((format!("matmul({}, {w})", a.name), shape, false))
            }
            9 => self.view(&a),
            10 => {
                if a.shape.is_empty() {
                    return None;
                }
                let axis = self.rng.index(a.shape.len());
                let fits: Vec<Value> = (self.values.iter())
                    .filter(|v| {
                        v.shape.len() == a.shape.len()
                            && (0..a.shape.len()).all(|i| i == axis || v.shape[i] == a.shape[i])
                    })
                    .cloned()
                    .collect();
                let b = &fits[self.rng.index(fits.len())];
                let mut shape = a.shape.clone();
                shape[axis] += b.shape[axis];
                Some((
                    format!("concat({}, {}, axis={axis})", a.name, b.name),
                    shape,
                    a.small && b.small,
                ))
            }
            // ±inf casts to ±2^31: not small.
            11 => Some((
                format!("cast(cast({}, dtype=\"i32\"), dtype=\"f32\")", a.name),
                a.shape.clone(),
                false,
            )),
            12 => {
                let (b, shape) = self.broadcast_partner(&a)?;
                let op = ["maximum", "minimum"][self.rng.index(2)];
                Some((format!("{op}({}, {b})", a.name), shape, a.small))
            }
            _ => self.unary(&a),
        }
    }

    fn unary(&mut self, a: &Value) -> Option<(String, Vec<usize>, bool)> {
        let mut ops = vec![
            ("neg", a.small),
            ("abs", a.small),
            ("exp", false),
            ("sqrt", a.small),
            ("square", false),
            ("relu", a.small),
            ("sigmoid", true),
            ("tanh", true),
            ("silu", false),
            ("gelu", false),
        ];
        if a.small {
            ops.extend([("sin", true), ("cos", true)]);
        }
        if a.leaf {
            ops.extend([("log", false), ("rsqrt", false), ("reciprocal", false)]);
        }
        let (op, small) = ops[self.rng.index(ops.len())];
        let call = if op == "gelu" && self.rng.index(2) == 0 {
            format!("gelu({}, approximate=\"tanh\")", a.name)
        } else {
            format!("{op}({})", a.name)
        };
        Some((call, a.shape.clone(), small))
    }

    fn binary(&mut self, a: &Value) -> Option<(String, Vec<usize>, bool)> {
        let op = ["add", "sub", "mul", "div", "pow"][self.rng.index(5)];
        let (b, shape) = self.broadcast_partner(a)?;
        // Dividing by (or raising) a computed value near zero amplifies f32 rounding without a
        // bound: divisors and bases are inputs or literals.
        let leaf = |name: &str| {
            !name.starts_with(|c: char| c.is_alphabetic())
                || self.values.iter().any(|v| v.name == name && v.leaf)
        };
        if (op == "div" && !leaf(&b)) || (op == "pow" && !a.leaf) {
            return None;
        }
        let small =
            matches!(op, "add" | "sub") && a.small && b.starts_with(|c: char| !c.is_alphabetic());
        Some((format!("{op}({}, {b})", a.name), shape, small))
    }

    /// A value (or a literal) that broadcasts with `a`, and the result's shape.
    fn broadcast_partner(&mut self, a: &Value) -> Option<(String, Vec<usize>)> {
        if self.rng.index(3) == 0 {
            return Some((self.literal(), a.shape.clone()));
        }
        let fits: Vec<Value> = (self.values.iter())
            .filter(|v| broadcast_shapes(&a.shape, &v.shape).is_some())
            .cloned()
            .collect();
        let b = &fits[self.rng.index(fits.len())];
        Some((b.name.clone(), broadcast_shapes(&a.shape, &b.shape)?))
    }

    fn axes(&mut self, rank: usize) -> Vec<usize> {
        let axes: Vec<usize> = (0..rank).filter(|_| self.rng.index(2) == 0).collect();
        if axes.is_empty() {
            vec![self.rng.index(rank)]
        } else {
            axes
        }
    }

    fn view(&mut self, a: &Value) -> Option<(String, Vec<usize>, bool)> {
        let rank = a.shape.len();
        let (expr, shape) = match self.rng.index(6) {
            0 if rank >= 2 => {
                let (d0, d1) = (self.rng.index(rank), self.rng.index(rank));
                let mut shape = a.shape.clone();
                shape.swap(d0, d1);
                (
                    format!("transpose({}, dim0={d0}, dim1={d1})", a.name),
                    shape,
                )
            }
            1 if rank >= 1 => {
                let mut perm: Vec<usize> = (0..rank).collect();
                for i in (1..rank).rev() {
                    perm.swap(i, self.rng.index(i + 1));
                }
                let shape = perm.iter().map(|&p| a.shape[p]).collect();
                (format!("permute({}, perm={})", a.name, ints(&perm)), shape)
            }
            2 => {
                let n: usize = a.shape.iter().product();
                (format!("reshape({}, shape=[{n}])", a.name), vec![n])
            }
            3 if rank < 3 => {
                let axis = self.rng.index(rank + 1);
                let mut shape = a.shape.clone();
                shape.insert(axis, 1);
                (format!("unsqueeze({}, axis={axis})", a.name), shape)
            }
            4 if rank >= 1 => {
                let axis = self.rng.index(rank);
                let extent = a.shape[axis];
                let start = self.rng.index(extent);
                let end = start + 1 + self.rng.index(extent - start);
                let step = 1 + self.rng.index(2);
                let mut shape = a.shape.clone();
                shape[axis] = (end - start).div_ceil(step);
                (
                    format!(
                        "slice({}, axis={axis}, start={start}, end={end}, step={step})",
                        a.name
                    ),
                    shape,
                )
            }
            5 if rank < 3 => {
                let mut shape = vec![1 + self.rng.index(3)];
                shape.extend(&a.shape);
                (
                    format!("broadcast_to({}, shape={})", a.name, ints(&shape)),
                    shape,
                )
            }
            _ => return None,
        };
        Some((expr, shape, a.small))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_parse_and_are_deterministic() {
        for seed in 0..200 {
            let p = random_program(seed);
            sinter_ir::text::parse(&p.source)
                .unwrap_or_else(|d| panic!("{}\n{}", p.source, d.render("random.sir", &p.source)));
            assert_eq!(random_program(seed).source, p.source);
        }
    }
}
