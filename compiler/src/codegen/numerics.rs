//! WGSL helper functions that give every op IR.md's numerics (§11) for NaN, ±inf and ±0.
//!
//! WGSL leaves many special values to the implementation: `max`/`min`/`clamp` may drop a NaN,
//! `log`, `sqrt` and `inverseSqrt` are undefined for arguments ≤ 0 under Vulkan's
//! GLSL.std.450, `pow` is `exp2(b * log2(a))`, a float-to-int conversion of NaN is undefined,
//! and drivers may assume no NaN in comparisons. These functions spell each case out, testing
//! for NaN and infinity on the bit pattern (which no float optimization can fold away).
//!
//! Kernel bodies just call them by name: [`with_helpers`] prepends the ones a body uses (and
//! those they call), so any codegen path gets them without bookkeeping.

/// A helper: its name and its WGSL definition.
struct Helper {
    name: &'static str,
    /// Helpers this one calls.
    uses: &'static [&'static str],
    wgsl: &'static str,
}

const HELPERS: &[Helper] = &[
    // A float from its bit pattern (NaN and ±inf, which WGSL has no literals for). A function
    // call, so that it is no constant expression: WebGPU's WGSL compilers (Tint in Chrome) reject
    // a constant expression whose value is NaN or ±inf, which naga accepts.
    Helper {
        name: "f32_bits",
        uses: &[],
        wgsl: "fn f32_bits(bits: u32) -> f32 { return bitcast<f32>(bits); }\n",
    },
    Helper {
        name: "is_nan_f32",
        uses: &[],
        wgsl: "fn is_nan_f32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }\n",
    },
    Helper {
        name: "is_inf_f32",
        uses: &[],
        wgsl: "fn is_inf_f32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u; }\n",
    },
    // x rounded to the nearest f16 number, ties to even, as an f32 (IR.md, "Element types"):
    // WGSL leaves the rounding of a conversion to f16 (and `pack2x16float`'s handling of values
    // past f16's range) to the implementation, so the rounding is spelled out on the bits.
    // Normal results keep 10 of the 23 fraction bits (adding just under half an ulp, plus one
    // where the kept part is odd, then truncating); from 65520 up the result is infinite;
    // below f16's smallest normal (2^-14) it is a multiple of 2^-24, which `round` (ties to
    // even) gives exactly; NaN and infinity pass through.
    Helper {
        name: "round_f16",
        uses: &[],
        wgsl: "fn round_f16(x: f32) -> f32 {\n    let bits = bitcast<u32>(x);\n    let a = bits & 0x7fffffffu;\n    let sign = bits & 0x80000000u;\n    if (a >= 0x7f800000u) { return x; }\n    if (a >= 0x477ff000u) { return bitcast<f32>(sign | 0x7f800000u); }\n    if (a < 0x38800000u) {\n        let q = round(bitcast<f32>(a) * 16777216.0) * 5.9604644775390625e-8;\n        return bitcast<f32>(sign | bitcast<u32>(q));\n    }\n    let r = a + 0xfffu + ((a >> 13u) & 1u);\n    return bitcast<f32>(sign | (r & 0xffffe000u));\n}\n",
    },
    // The larger of a and b; NaN when either is NaN (torch.maximum, amax, max pooling).
    Helper {
        name: "max_nan",
        uses: &["is_nan_f32"],
        wgsl: "fn max_nan(a: f32, b: f32) -> f32 { return select(max(a, b), a + b, is_nan_f32(a) || is_nan_f32(b)); }\n",
    },
    Helper {
        name: "min_nan",
        uses: &["is_nan_f32"],
        wgsl: "fn min_nan(a: f32, b: f32) -> f32 { return select(min(a, b), a + b, is_nan_f32(a) || is_nan_f32(b)); }\n",
    },
    // relu as `x < 0 ? 0 : x`: NaN and -0.0 pass through. The test is on the bits (a negative
    // number other than -0.0 and NaN): NVIDIA's driver turns `select(x, 0.0, x < 0.0)` into a
    // `max`, which drops both.
    Helper {
        name: "relu_nan",
        uses: &[],
        wgsl: "fn relu_nan(x: f32) -> f32 { let b = bitcast<u32>(x); return select(x, 0.0, b > 0x80000000u && b <= 0xff800000u); }\n",
    },
    // Whether (b, bi) takes the place of (a, ai) in argmax order: a NaN beats any number, a
    // larger value beats a smaller one, and among equals (or NaNs) the smaller index wins. An
    // index of 0xffffffff marks "no element".
    Helper {
        name: "argmax_takes",
        uses: &["is_nan_f32"],
        wgsl: "fn argmax_takes(a: f32, ai: u32, b: f32, bi: u32) -> bool {
    if (bi == 0xffffffffu) { return false; }
    if (ai == 0xffffffffu) { return true; }
    let na = is_nan_f32(a);
    let nb = is_nan_f32(b);
    if (na || nb) { return nb && (!na || bi < ai); }
    return b > a || (b == a && bi < ai);
}
",
    },
    Helper {
        name: "argmax_last_takes",
        uses: &["is_nan_f32"],
        wgsl: "fn argmax_last_takes(a: f32, ai: u32, b: f32, bi: u32) -> bool {
    if (bi == 0xffffffffu) { return false; }
    if (ai == 0xffffffffu) { return true; }
    let na = is_nan_f32(a);
    let nb = is_nan_f32(b);
    if (na || nb) { return nb && (!na || bi > ai); }
    return b > a || (b == a && bi > ai);
}
",
    },
    Helper {
        name: "log_f32",
        uses: &["f32_bits"],
        wgsl: "fn log_f32(x: f32) -> f32 {
    if (x > 0.0) { return log(x); }
    if (x == 0.0) { return f32_bits(0xff800000u); }
    return f32_bits(0x7fc00000u);
}
",
    },
    Helper {
        name: "sqrt_f32",
        uses: &["f32_bits"],
        wgsl: "fn sqrt_f32(x: f32) -> f32 { return select(f32_bits(0x7fc00000u), sqrt(x), x >= 0.0); }\n",
    },
    // 1/sqrt(x): ±inf at ±0 (as 1 / sqrt(±0)), NaN below 0.
    Helper {
        name: "rsqrt_f32",
        uses: &["f32_bits"],
        wgsl: "fn rsqrt_f32(x: f32) -> f32 {
    if (x > 0.0) { return inverseSqrt(x); }
    if (x == 0.0) { return 1.0 / x; }
    return f32_bits(0x7fc00000u);
}
",
    },
    Helper {
        name: "sin_f32",
        uses: &["is_inf_f32", "f32_bits"],
        wgsl: "fn sin_f32(x: f32) -> f32 { return select(sin(x), f32_bits(0x7fc00000u), is_inf_f32(x)); }\n",
    },
    Helper {
        name: "cos_f32",
        uses: &["is_inf_f32", "f32_bits"],
        wgsl: "fn cos_f32(x: f32) -> f32 { return select(cos(x), f32_bits(0x7fc00000u), is_inf_f32(x)); }\n",
    },
    // tanh through a clamp (some GPUs evaluate tanh with exp and overflow past |x| = 44), with
    // NaN kept: clamp may turn it into a bound.
    Helper {
        name: "tanh_f32",
        uses: &["is_nan_f32"],
        wgsl: "fn tanh_f32(x: f32) -> f32 { return select(tanh(clamp(x, -15.0, 15.0)), x, is_nan_f32(x)); }\n",
    },
    // erf by Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7); ±1 at ±inf, NaN at NaN.
    Helper {
        name: "erf_f32",
        uses: &["is_nan_f32"],
        wgsl: "fn erf_f32(x: f32) -> f32 {
    let a = abs(x);
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let poly = ((((1.0614054 * t - 1.4531521) * t + 1.4214138) * t - 0.28449672) * t + 0.2548296) * t;
    return select(select(-1.0, 1.0, x > 0.0) * (1.0 - poly * exp(-a * a)), x, is_nan_f32(x) || x == 0.0);
}
",
    },
    // C's pow (IEEE 754 / C99 Annex F), as the interpreter's f64::powf: pow(x, ±0) = 1 and
    // pow(1, y) = 1 even for NaN; a negative base needs an integral exponent (its sign follows
    // an odd one); zeros and infinities by the Annex F table.
    Helper {
        name: "pow_f32",
        uses: &["is_nan_f32", "is_inf_f32", "f32_bits"],
        wgsl: "fn pow_f32(a: f32, b: f32) -> f32 {
    if (b == 0.0 || a == 1.0) { return 1.0; }
    if (is_nan_f32(a) || is_nan_f32(b)) { return f32_bits(0x7fc00000u); }
    let inf = f32_bits(0x7f800000u);
    let ab = abs(a);
    if (is_inf_f32(b)) {
        if (ab == 1.0) { return 1.0; }
        return select(0.0, inf, (ab > 1.0) == (b > 0.0));
    }
    let integral = floor(b) == b;
    let odd = integral && fract(b * 0.5) != 0.0;
    let negative = (bitcast<u32>(a) & 0x80000000u) != 0u;
    let flip = negative && odd;
    if (a == 0.0 || is_inf_f32(a)) {
        // |a|^b is 0 or inf; the sign is a's for odd integral b.
        let m = select(0.0, inf, (a == 0.0) == (b < 0.0));
        return select(m, -m, flip);
    }
    if (negative && !integral) { return f32_bits(0x7fc00000u); }
    let m = exp2(b * log2(ab));
    return select(m, -m, flip);
}
",
    },
    // f32 to i32 as `cast` does it: toward zero, saturating at the i32 range, NaN to 0.
    Helper {
        name: "f32_to_i32",
        uses: &["is_nan_f32"],
        wgsl: "fn f32_to_i32(x: f32) -> i32 {
    if (is_nan_f32(x)) { return 0i; }
    if (x >= 2147483648.0) { return 2147483647i; }
    if (x <= -2147483648.0) { return -2147483647i - 1i; }
    return i32(x);
}
",
    },
];

/// `body` with the definitions of the helpers it calls (directly or through another helper)
/// in front of it.
pub fn with_helpers(body: &str) -> String {
    let mut needed = vec![false; HELPERS.len()];
    let mut stack: Vec<usize> = (0..HELPERS.len())
        .filter(|&i| calls(body, HELPERS[i].name))
        .collect();
    while let Some(i) = stack.pop() {
        if !std::mem::replace(&mut needed[i], true) {
            for used in HELPERS[i].uses {
                stack.extend(HELPERS.iter().position(|h| h.name == *used));
            }
        }
    }
    let mut s = String::new();
    for (h, _) in HELPERS.iter().zip(&needed).filter(|(_, n)| **n) {
        s.push_str(h.wgsl);
    }
    s.push_str(body);
    s
}

/// Whether `text` calls `name` (the name followed by `(`, not part of a longer name).
fn calls(text: &str, name: &str) -> bool {
    let mut rest = text;
    while let Some(at) = rest.find(name) {
        let before = rest[..at].chars().next_back();
        let after = &rest[at + name.len()..];
        let starts_word = before.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        if starts_word && after.starts_with('(') {
            return true;
        }
        rest = after;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_come_with_what_they_call_and_validate() {
        let body = "fn f(x: f32) -> f32 { return pow_f32(x, 2.0) + max_nan(x, 1.0); }\n";
        let text = with_helpers(body);
        assert!(text.contains("fn is_nan_f32") && text.contains("fn is_inf_f32"));
        assert!(!text.contains("fn log_f32"));
        let all: String = HELPERS.iter().map(|h| format!("{}(", h.name)).collect();
        let everything = with_helpers(&format!("// {all}\n"));
        // A constant expression that is NaN or ±inf fails in WebGPU (see `f32_bits`).
        assert!(!everything.contains("bitcast<f32>(0x"));
        let module = naga::front::wgsl::parse_str(&everything).expect("helpers parse");
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::default(),
        )
        .validate(&module)
        .expect("helpers validate");
    }

    #[test]
    fn calls_matches_whole_names() {
        assert!(calls("y = max_nan(a, b)", "max_nan"));
        assert!(!calls("y = xmax_nan(a, b)", "max_nan"));
        assert!(!calls("let max_nan = 1;", "max_nan"));
    }
}
