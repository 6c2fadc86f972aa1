//! `IR.md` cannot rot: every op of the table is specified in it, every `sir` block parses, and
//! the blocks marked `<!-- check: NAME -->` (the worked example's values, the random-number test
//! vectors, the `train` expansion, a rendered diagnostic) are exactly what the code produces.

use std::collections::HashMap;

use sinter_ir::graph::{Init, ValueDef};
use sinter_ir::init::{SplitMix64, initial_value};
use sinter_ir::interp::{Tensor, evaluate};
use sinter_ir::op::OPS;
use sinter_ir::text::{parse, print};
use sinter_ir::types::TensorType;

const SPEC: &str = include_str!("../IR.md");

/// Every fenced code block: its info string and its text.
fn blocks() -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let mut lines = SPEC.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let mut body = String::new();
        for line in lines.by_ref() {
            if line.trim_start().starts_with("```") {
                break;
            }
            body.push_str(line);
            body.push('\n');
        }
        out.push((info.trim(), body));
    }
    out
}

/// The code block right after the marker `<!-- check: NAME -->`.
fn checked_block(name: &str) -> String {
    let marker = format!("<!-- check: {name} -->");
    let at = SPEC
        .find(&marker)
        .unwrap_or_else(|| panic!("IR.md has no `{marker}`"));
    let rest = &SPEC[at + marker.len()..];
    let open = rest.find("```").expect("a code block after the marker");
    let body_start = open + rest[open..].find('\n').expect("an info line") + 1;
    let close = rest[body_start..].find("```").expect("a closed code block");
    rest[body_start..body_start + close].to_string()
}

/// Whether `line` specifies `op`: a heading naming it (`#### \`relu\``), or a signature that
/// starts the line or a table row (`` `relu(x)` ``).
fn specifies(line: &str, op: &str) -> bool {
    let line = line.trim();
    if line.starts_with('#') {
        return line.contains(&format!("`{op}`"));
    }
    let line = line.trim_start_matches('|').trim_start();
    line.starts_with(&format!("`{op}("))
        || line
            .split(" = ")
            .nth(1)
            .is_some_and(|r| r.starts_with(&format!("{op}(")))
}

#[test]
fn every_op_is_specified() {
    let missing: Vec<&str> = OPS
        .iter()
        .map(|spec| spec.name)
        .filter(|name| !SPEC.lines().any(|line| specifies(line, name)))
        .collect();
    assert!(
        missing.is_empty(),
        "IR.md has no heading or signature line for: {missing:?}"
    );
}

#[test]
fn every_attribute_default_is_stated() {
    // Each op's signature (heading section or table row) mentions every attribute it has.
    for spec in OPS {
        for attr in spec.attrs {
            let stated = SPEC.lines().any(|line| {
                (specifies(line, spec.name) || line.contains(&format!("{}(", spec.name)))
                    && line.contains(attr.name)
            });
            assert!(
                stated,
                "IR.md never states the attribute `{}` of `{}` in a signature",
                attr.name, spec.name
            );
        }
    }
}

#[test]
fn every_sir_block_parses() {
    let sir: Vec<String> = blocks()
        .into_iter()
        .filter(|(info, _)| *info == "sir")
        .map(|(_, body)| body)
        .collect();
    assert!(sir.len() >= 4, "IR.md has only {} sir blocks", sir.len());
    for src in sir {
        if let Err(d) = parse(&src) {
            panic!(
                "a sir block of IR.md does not parse:\n{}",
                d.render("IR.md", &src)
            );
        }
    }
}

/// `[[a, b], [c, d]]` with 6 decimals, or a bare number for a scalar.
fn format_tensor(data: &[f64], shape: &[usize]) -> String {
    match shape.split_first() {
        None => format!("{:.6}", data[0]),
        Some((&n, rest)) => {
            let chunk = data.len() / n;
            let items: Vec<String> = (0..n)
                .map(|i| format_tensor(&data[i * chunk..(i + 1) * chunk], rest))
                .collect();
            format!("[{}]", items.join(", "))
        }
    }
}

#[test]
fn worked_example_values() {
    let g = parse(&checked_block("worked-example")).expect("parses");
    assert!(SPEC.contains("x = [[1, 2, 3], [-1, 0, 0.5]]\nlabels = [0, 1]\n"));
    let inputs = HashMap::from([
        (
            "x".to_string(),
            Tensor::f32(vec![2, 3], vec![1.0, 2.0, 3.0, -1.0, 0.0, 0.5]),
        ),
        ("labels".to_string(), Tensor::i32(vec![2], vec![0, 1])),
    ]);
    let run = evaluate(&g, &inputs, &HashMap::new()).expect("evaluates");
    let text: String = run
        .outputs
        .iter()
        .map(|(name, t)| format!("{name} = {}\n", format_tensor(&t.data, t.shape())))
        .collect();
    assert_eq!(checked_block("worked-example-values"), text);
}

#[test]
fn rng_test_vectors() {
    let mut rng = SplitMix64::new(0);
    let draws: Vec<String> = (0..3)
        .map(|_| format!("{:#018x}", rng.next_u64()))
        .collect();
    let normal = initial_value(
        &TensorType::f32(vec![3]),
        &Init::Normal {
            mean: 0.0,
            std: 1.0,
            seed: 7,
        },
    );
    let uniform = initial_value(
        &TensorType::f32(vec![3, 2]),
        &Init::Uniform {
            lo: -1.0,
            hi: 1.0,
            seed: 42,
        },
    );
    let expected = format!(
        "splitmix64(seed=0) draws: {}\nnormal(seed=7) on f32[3]: {}\n\
         uniform(lo=-1, hi=1, seed=42) on f32[3, 2]: {}\n",
        draws.join(" "),
        format_tensor(&normal.data, &[3]),
        format_tensor(&uniform.data, &[3, 2]),
    );
    assert_eq!(checked_block("rng-vectors"), expected);
    // The worked example's `w` is this uniform tensor.
    let g = parse(&checked_block("worked-example")).unwrap();
    let w = g.value(g.lookup("w").unwrap());
    let ValueDef::Param(init) = &w.def else {
        panic!("w is a param")
    };
    assert_eq!(initial_value(&w.ty, init), uniform);
}

#[test]
fn train_expansion_is_the_printed_form() {
    let g = parse(&checked_block("train-source")).expect("parses");
    assert_eq!(print(&g), checked_block("train-expanded"));
}

#[test]
fn diagnostic_example_is_rendered_exactly() {
    let src = checked_block("diagnostic-source");
    let rendered = match parse(&src) {
        Ok(_) => panic!("the diagnostic example of IR.md parses"),
        Err(d) => d.render("model.sir", &src),
    };
    // The rendering ends each diagnostic with a blank line; the block separates them with one.
    assert_eq!(
        rendered.trim_end(),
        checked_block("diagnostic-output").trim_end()
    );
}
