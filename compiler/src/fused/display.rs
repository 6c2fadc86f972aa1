//! The text form of a fused-kernel program, for dumps (`sinter compile --dump-after`) and test
//! snapshots:
//!
//! ```text
//! row_map over [32] reducing [10]
//!   in0: f32 [s0, r0]
//!   v0 = load in0
//!   v1 = max over r of v0
//!   v2 = sub(v0, v1)
//!   ...
//!   out0: f32 [s0, r0] = v5
//! ```
//!
//! Space axes are `s0..` (the domain) and `r0..` (the reduce axes); `1` is an extent-1 tensor
//! axis, `1(rK)` one that a reduction with `keepdim` collapsed. A phase reads as `vK = combine
//! over r of vJ`, where `vK` is what later instructions see as that phase's result.

use std::fmt;

use super::{Access, Axis, Combine, Inst, Program, Scalar};

impl Program {
    /// The name of space axis `k`: `sK` in the domain, `rK` past it.
    fn axis_name(&self, k: usize) -> String {
        let d = self.domain.len();
        if k < d {
            format!("s{k}")
        } else {
            format!("r{}", k - d)
        }
    }

    fn write_access(&self, f: &mut fmt::Formatter<'_>, a: &Access) -> fmt::Result {
        write!(f, "{} [", a.dtype)?;
        for (i, axis) in a.axes.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match *axis {
                Axis::Space(k) => f.write_str(&self.axis_name(k as usize))?,
                Axis::One => f.write_str("1")?,
                Axis::Collapsed(k) => write!(f, "1(r{k})")?,
                Axis::Shifted { k, by, len } => {
                    write!(f, "{}[{by}..{}]", self.axis_name(k as usize), by + len)?
                }
            }
        }
        f.write_str("]")
    }
}

impl fmt::Display for Combine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Combine::Sum => "sum",
            Combine::Max => "max",
            Combine::Min => "min",
            Combine::ArgMax { last: false } => "argmax",
            Combine::ArgMax { last: true } => "argmax_last",
        })
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Op(op) => f.write_str(op.name()),
            Scalar::GeluTanh => f.write_str("gelu_tanh"),
            Scalar::Cast(to) => write!(f, "cast<{to}>"),
        }
    }
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} over {:?}", self.pattern(), self.domain)?;
        if !self.reduce.is_empty() {
            write!(f, " reducing {:?}", self.reduce)?;
        }
        writeln!(f)?;
        for (i, a) in self.operands.iter().enumerate() {
            write!(f, "  in{i}: ")?;
            self.write_access(f, a)?;
            writeln!(f)?;
        }
        // `Reduced(k)` prints as the phase it reads
        for (i, inst) in self.insts.iter().enumerate() {
            write!(f, "  v{i} = ")?;
            match inst {
                Inst::Load(o) => write!(f, "load in{o}")?,
                Inst::Const(bits) => write!(f, "{:?}", f32::from_bits(*bits))?,
                Inst::Coord(k) => write!(f, "coord {}", self.axis_name(*k as usize))?,
                Inst::Map(s, args) => {
                    let args: Vec<String> = args.iter().map(|a| format!("v{a}")).collect();
                    write!(f, "{s}({})", args.join(", "))?
                }
                Inst::Reduced(k) => {
                    let phase = self.phases[*k as usize];
                    write!(f, "{} over r of v{}", phase.combine, phase.value)?
                }
            }
            writeln!(f)?;
        }
        for (i, o) in self.outputs.iter().enumerate() {
            write!(f, "  out{i}: ")?;
            self.write_access(f, &o.access)?;
            writeln!(f, " = v{}", o.value)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Output, Phase};
    use super::*;
    use sinter_ir::{DType, Op};

    #[test]
    fn a_softmax_row_reads_as_its_phases() {
        let row = Access {
            dtype: DType::F32,
            axes: vec![Axis::Space(0), Axis::Space(1)],
        };
        let p = Program {
            domain: vec![4],
            reduce: vec![10],
            operands: vec![row.clone()],
            insts: vec![
                Inst::Load(0),
                Inst::Reduced(0),
                Inst::Map(Scalar::Op(Op::Sub), vec![0, 1]),
                Inst::Map(Scalar::Op(Op::Exp), vec![2]),
            ],
            phases: vec![Phase {
                combine: Combine::Max,
                value: 0,
            }],
            outputs: vec![Output {
                value: 3,
                access: row,
            }],
        };
        assert_eq!(
            p.to_string(),
            "row_map over [4] reducing [10]\n  in0: f32 [s0, r0]\n  v0 = load in0\n  \
             v1 = max over r of v0\n  v2 = sub(v0, v1)\n  v3 = exp(v2)\n  out0: f32 [s0, r0] = v3\n"
        );
    }
}
