//! ONNX names (`/encoder/layer.0/Add_output_0`, `onnx::MatMul_12`, `input.1`) to `.sir` names
//! (`[A-Za-z_][A-Za-z0-9_.]*`, not a keyword).

/// Words that cannot name a value in `.sir` (IR.md §2).
const RESERVED: &[&str] = &[
    "graph", "input", "param", "state", "assign", "output", "true", "false", "inf", "nan",
];

/// A `.sir` name for an ONNX name: characters outside `[A-Za-z0-9_.]` become `_`, a leading
/// `.`, `/` or digit gets a `v` or `_` in front, keywords and generated-looking names (`_7`) get a
/// suffix. The caller makes the result unique.
pub fn sanitize(onnx: &str) -> String {
    let mut name: String = onnx
        .trim_start_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    match name.chars().next() {
        None => name = "v".to_string(),
        Some(c) if c.is_ascii_digit() || c == '.' => name.insert(0, 'v'),
        Some('_') if name[1..].starts_with(|c: char| c.is_ascii_digit()) => name.insert(0, 'v'),
        _ => {}
    }
    if RESERVED.contains(&name.as_str()) {
        name.push('_');
    }
    name
}

#[cfg(test)]
mod tests {
    use super::sanitize;

    #[test]
    fn names() {
        for (onnx, sir) in [
            ("x", "x"),
            (
                "/encoder/layer.0/Add_output_0",
                "encoder_layer.0_Add_output_0",
            ),
            ("onnx::MatMul_12", "onnx__MatMul_12"),
            ("input.1", "input.1"),
            ("input", "input_"),
            ("12", "v12"),
            ("_3", "v_3"),
            ("", "v"),
            (".a", "v.a"),
        ] {
            assert_eq!(sanitize(onnx), sir, "{onnx}");
        }
    }
}
