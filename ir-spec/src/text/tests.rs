//! Unit tests of the text format: lexer and parser corners, name resolution, recovery, and a
//! no-panic fuzz over arbitrary and mutated inputs.

use crate::attr::key;
use proptest::prelude::*;

use super::lexer::{TokenKind, lex};
use super::{parse, print};
use crate::attr::Attr;
use crate::graph::{Init, ValueDef};
use crate::op::Op;
use crate::types::TensorType;

/// The token kinds of `src`, without the final `Eof`, and the number of lexer errors.
fn kinds(src: &str) -> (Vec<TokenKind>, usize) {
    let mut diags = Vec::new();
    let mut tokens: Vec<TokenKind> = lex(src, &mut diags).into_iter().map(|t| t.kind).collect();
    assert_eq!(tokens.pop(), Some(TokenKind::Eof));
    (tokens, diags.len())
}

/// The error messages of a source that must fail.
fn errors(src: &str) -> Vec<String> {
    match parse(src) {
        Ok(g) => panic!("expected errors, parsed:\n{}", print(&g)),
        Err(d) => d.0.into_iter().map(|d| d.message).collect(),
    }
}

/// Wraps statements in a graph.
fn graph(body: &str) -> String {
    format!("graph g {{\n{body}\n}}\n")
}

fn parses(src: &str) -> crate::graph::Graph {
    match parse(src) {
        Ok(g) => g,
        Err(d) => panic!("{}", d.render("t.sir", src)),
    }
}

#[test]
fn lexes_numbers() {
    use TokenKind::*;
    assert_eq!(
        kinds("12 1.5 2e-3 1.5E+10 0.0"),
        (
            vec![Int, Float(1.5), Float(2e-3), Float(1.5e10), Float(0.0)],
            0
        )
    );
    assert_eq!(kinds("-3").0, vec![Minus, Int]);
    assert_eq!(kinds("12ab").1, 1);
    assert_eq!(kinds("1.").1, 1);
    assert_eq!(kinds("1e").1, 1);
    assert!(kinds("1e+-5").1 >= 1);
    assert_eq!(kinds("1e999").1, 1);
}

#[test]
fn lexes_strings_and_names() {
    use TokenKind::*;
    assert_eq!(
        kinds(r#""a\"b\\c" layer1.weight _7"#).0,
        vec![Str("a\"b\\c".into()), Ident, Ident]
    );
    assert_eq!(kinds("\"open\nx").0, vec![Error, Newline, Ident]);
    assert_eq!(kinds(r#""bad\n""#).0, vec![Error]);
    // A run of unexpected characters is one error.
    assert_eq!(kinds("a ééé b").0, vec![Ident, Error, Ident]);
    assert_eq!(kinds("x # comment ( [\ny").0, vec![Ident, Newline, Ident]);
    assert_eq!(kinds("\u{c}").1, 1);
}

#[test]
fn parses_the_design_example() {
    let src = "\
graph mlp {
  input  x: f32[64, 784]
  input  labels: i32[64]
  param  w1: f32[784, 128] = normal(std=0.05, seed=1)
  param  b1: f32[128] = zeros
  param  w2: f32[128, 10] = uniform(lo=-0.1, hi=0.1, seed=2)
  state  step: f32[] = full(-inf)
  h = add(matmul(x, w1), b1)          # nesting allowed; numpy broadcasting
  a = relu(h)
  logits = matmul(a, w2)
  loss = cross_entropy(logits, labels)
  dw1, db1 = grad(loss, w1, b1)
  w1_new = sub(w1, mul(dw1, 0.1))
  assign w1 = w1_new
  output loss, dw1, db1
}
";
    let g = parses(src);
    assert_eq!(g.name, "mlp");
    let h = g.lookup("h").unwrap();
    assert_eq!(g.ty(h), &TensorType::f32(vec![64, 128]));
    let matmul = g.node(g.producer(h).unwrap()).inputs[0];
    assert_eq!(g.name_of(matmul), "_6");
    let step = g.lookup("step").unwrap();
    assert_eq!(
        g.value(step).def,
        ValueDef::State(Init::Full(f64::NEG_INFINITY))
    );
    let w2 = g.lookup("w2").unwrap();
    assert_eq!(
        g.value(w2).def,
        ValueDef::Param(Init::Uniform {
            lo: -0.1,
            hi: 0.1,
            seed: 2
        })
    );
    assert_eq!(g.outputs.len(), 3);
    assert_eq!(g.assigns.len(), 1);
    assert_eq!(parse(&print(&g)), Ok(g));
}

#[test]
fn separators_comments_and_multiline_calls() {
    let g = parses(
        "# leading comment\n\ngraph g { input x: f32[2, 3]; y = relu(x); \
         z = add(\n  y,   # first\n  x,\n)\n\n output z }",
    );
    assert_eq!(g.outputs.len(), 1);
    let g = parses("graph g {\n}");
    assert!(g.values.is_empty());
}

#[test]
fn literals_become_constants() {
    let g = parses(&graph(
        "input x: f32[3]\ny = maximum(x, -inf)\nz = mul(y, -2.5e-3)\nc = 3\nw = add(z, 7)",
    ));
    let consts: Vec<f64> = g
        .nodes
        .iter()
        .filter(|n| n.op == Op::Constant)
        .map(|n| n.attr(key::VALUE))
        .collect();
    assert_eq!(consts, vec![f64::NEG_INFINITY, -2.5e-3, 3.0, 7.0]);
    assert_eq!(g.ty(g.lookup("c").unwrap()), &TensorType::f32(vec![]));
}

#[test]
fn attribute_values() {
    let g = parses(&graph(
        "input x: f32[2, 3, 4]\n\
         s = sum(x, axes=[0, -1,], keepdim=true)\n\
         t = slice(x, axis=-1, start=-3, end=4)\n\
         c = cast(x, dtype=\"i32\")",
    ));
    let s = g.node(g.producer(g.lookup("s").unwrap()).unwrap());
    assert_eq!(s.attrs.get("axes"), Some(&Attr::ints(&[0, 2])));
    let t = g.node(g.producer(g.lookup("t").unwrap()).unwrap());
    assert_eq!(t.attrs.of(key::START), 1);
    assert_eq!(parse(&print(&g)), Ok(g));
}

#[test]
fn extreme_ints() {
    let ok = graph(&format!(
        "param w: f32[2] = normal(seed={})\ny = slice(w, axis=0, start={}, end=2)",
        u64::MAX,
        i64::MIN
    ));
    assert!(errors(&ok).iter().all(|m| m.contains("out of range")));
    let big = graph("input x: f32[2]\ny = slice(x, axis=0, start=0, end=99999999999999999999)");
    assert_eq!(
        errors(&big),
        ["integer `99999999999999999999` does not fit in 64 bits"]
    );
    let over = graph(&format!(
        "input x: f32[2]\ny = slice(x, axis={}, start=0, end=2)",
        u64::MAX
    ));
    assert_eq!(errors(&over), ["`axis` holds an int outside the i64 range"]);
    let huge = graph("input x: f32[4294967296, 4294967296, 2]");
    assert_eq!(
        errors(&huge),
        ["`f32[4294967296, 4294967296, 2]` is too large"]
    );
    // 2^62 elements fit in 64 bits, their 2^64 bytes do not.
    let wraps = graph("input x: f32[2147483648, 2147483648]");
    assert_eq!(
        errors(&wraps),
        ["`f32[2147483648, 2147483648]` is too large"]
    );
}

#[test]
fn seeds_use_the_full_u64_range() {
    let g = parses(&graph(&format!(
        "param w: f32[2] = normal(seed={})",
        u64::MAX
    )));
    assert_eq!(parse(&print(&g)), Ok(g));
}

#[test]
fn errors_do_not_cascade() {
    let src = graph(
        "input x: f32[2]\n\
         a = relu(undefined)\n\
         b = add(a, a)\n\
         c = relu(b)\n\
         d = exp(x,\n\
         e = relu(d)\n\
         output a, e",
    );
    assert_eq!(
        errors(&src),
        [
            "unknown name `undefined`",
            "expected `)` before the end of the line"
        ]
    );
}

#[test]
fn unclosed_paren_resumes_at_next_statement() {
    let src = graph("input x: f32[2]\na = relu(x\nb = exp(y)");
    assert_eq!(
        errors(&src),
        [
            "expected `,` or `)` before the end of the line",
            "unknown name `y`"
        ]
    );
}

#[test]
fn semicolon_ends_a_broken_statement() {
    let src = graph("input x: f32[2]\na = relu(x; b = exp(x)\noutput b");
    assert_eq!(errors(&src), ["expected `,` or `)`, found `;`"]);
}

#[test]
fn names_and_keywords() {
    assert_eq!(
        errors(&graph("input output: f32[2]")),
        ["`output` is a keyword and cannot name a value"]
    );
    assert_eq!(
        errors(&graph("input inf: f32[2]")),
        ["`inf` is a number, not a name"]
    );
    assert_eq!(
        errors(&graph("input x: f32[2]\ny = add(x, true)")),
        ["a boolean is not an operand"]
    );
    let g = parses(&graph(
        "input layer1.weight: f32[2]\n_9 = relu(layer1.weight)",
    ));
    assert!(g.lookup("_9").is_some());
}

#[test]
fn use_before_definition_and_aliases() {
    assert_eq!(
        errors(&graph("y = relu(x)\ninput x: f32[2]")),
        ["`x` is used before it is defined"]
    );
    assert_eq!(
        errors(&graph("input x: f32[2]\ny = x\nz = relu(y)")),
        ["`y = x` only renames a value"]
    );
}

#[test]
fn header_and_trailer_errors() {
    assert_eq!(errors(""), ["expected `graph`, found the end of the file"]);
    assert_eq!(
        errors("graph g {\n input x: f32[2]\n"),
        ["the graph is not closed"]
    );
    assert_eq!(
        errors("graph g {}\ngraph h {}"),
        ["a .sir file holds exactly one graph"]
    );
    assert_eq!(
        errors("input x: f32[2]\n"),
        ["expected `graph`, found `input`"]
    );
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let depth = 10_000;
    let src = graph(&format!(
        "input x: f32[2]\ny = {}x{}",
        "relu(".repeat(depth),
        ")".repeat(depth)
    ));
    assert_eq!(errors(&src), ["expression nested more than 64 levels deep"]);
    let list = graph(&format!(
        "input x: f32[2]\ny = sum(x, axes={}{})",
        "[".repeat(depth),
        "]".repeat(depth)
    ));
    assert_eq!(
        errors(&list),
        ["expression nested more than 64 levels deep"]
    );
}

#[test]
fn long_chains_print_as_statements() {
    let mut body = String::from("input x: f32[2]\n");
    let mut expr = "x".to_string();
    for _ in 0..40 {
        expr = format!("relu({expr})");
    }
    body += &format!("y = {expr}\noutput y");
    let g = parses(&graph(&body));
    let text = print(&g);
    assert!(text.lines().count() > 3, "{text}");
    assert_eq!(parse(&text), Ok(g));
}

/// A graph with params `w`, `b`, an input `x` and a scalar `loss`, then `body`.
fn trainable(body: &str) -> String {
    graph(&format!(
        "input x: f32[3]\nparam w: f32[3] = zeros\nparam b: f32[3] = zeros\n\
         h = mul(w, x)\nloss = sum(add(h, b))\n{body}"
    ))
}

#[test]
fn train_statement_forms() {
    for body in [
        "train loss with adamw()",
        "train loss with adamw(lr=1e-3, beta2=0.95,)",
        "train loss with adam(\n  lr=0.01,   # a comment\n  params=[w,\n b],\n  clip_norm=1,\n)",
        "train loss with sgd(lr=0.1); output loss",
        "train loss with sgd(lr=1, momentum=0.9, dampening=0.5, weight_decay=0.01)",
        "train loss with sgd(lr=1, params=[b], momentum=0.5, nesterov=true)",
    ] {
        let g = parses(&trainable(body));
        assert_eq!(
            g.nodes.iter().filter(|n| n.op == Op::Grad).count(),
            1,
            "{body}"
        );
        assert_eq!(parse(&print(&g)), Ok(g), "{body}");
    }
    // `train` is a keyword only where a statement starts with `train NAME`.
    let g = parses(&graph(
        "input x: f32[2]\ntrain = relu(x)\ntrain.loss = sum(train)\noutput train",
    ));
    assert!(g.lookup("train").is_some());
    let g = parses(&trainable(
        "with = relu(x)\ntrain loss with sgd(lr=1, params=[w])",
    ));
    assert!(g.lookup("w.next").is_some());
}

#[test]
fn train_errors() {
    for (body, expected) in [
        ("train loss with adm(lr=1)", "unknown optimizer `adm`"),
        (
            "train loss with adamw(lrr=1)",
            "unknown attribute `lrr` for `train ... with adamw`",
        ),
        ("train loss with sgd()", "`sgd` needs the attribute `lr`"),
        (
            "train loss with adamw(beta1=1)",
            "beta1=1 must be in [0, 1)",
        ),
        (
            "train loss with adamw(clip_norm=0)",
            "clip_norm=0 must be positive and finite",
        ),
        (
            "train loss with adamw(clip_norm=[1])",
            "`clip_norm` must be a number",
        ),
        ("train los with adamw()", "unknown name `los`"),
        (
            "train h with adamw()",
            "`train` needs a scalar f32 loss, got f32[3]",
        ),
        (
            "train loss with adamw(params=[x])",
            "`x` is not a param, so `train` cannot update it",
        ),
        (
            "train loss with adamw(params=[w, w])",
            "`w` is listed twice in `params`",
        ),
        (
            "train loss with adamw(params=[])",
            "there are no params to train",
        ),
        (
            "train loss with adamw(params=[w], params=[b])",
            "`params` is given twice",
        ),
        (
            "train loss with adamw(params=w)",
            "expected `[` and a list of params, found `w`",
        ),
        (
            "train loss with adamw(0.1)",
            "expected an attribute such as `lr=1e-3`, found the number `0.1`",
        ),
        (
            "train loss adamw()",
            "expected `with` and an optimizer, found `adamw`",
        ),
        (
            "train loss with adamw",
            "expected `(` after the optimizer, found the end of the line",
        ),
        (
            "train mean(loss) with sgd(lr=1)",
            "`train` takes the name of the loss, not a call",
        ),
        (
            "train",
            "expected the name of the loss after `train`, found the end of the line",
        ),
        (
            "train with adamw()",
            "`train` needs the name of the loss before `with`",
        ),
        (
            "train loss with adamw()\ntrain loss with sgd(lr=1)",
            "a graph has at most one `train` statement",
        ),
        (
            "state b.v: f32[3] = zeros\ntrain loss with adam()",
            "`train` needs the name `b.v` for the second moment of `b`, but it is already defined",
        ),
        (
            "train loss with adamw()\nw.grad = relu(x)",
            "`w.grad` is already defined",
        ),
        (
            "assign b = b\ntrain loss with adamw()",
            "`b` is already assigned, and `train` assigns every param it trains",
        ),
        (
            "train loss with adamw()\nassign w = w",
            "`w` is assigned twice",
        ),
    ] {
        assert_eq!(errors(&trainable(body)), [expected], "{body}");
    }
    let int_param = graph(
        "param n: i32[2] = zeros\nloss = sum(cast(n, dtype=\"f32\"))\ntrain loss with adamw()",
    );
    assert_eq!(
        errors(&int_param),
        ["`train` updates f32 params, but `n` is i32[2]"]
    );
    assert_eq!(
        errors(&graph(
            "input x: f32[2]\nloss = sum(x)\ntrain loss with adamw()"
        )),
        ["there are no params to train"]
    );
}

#[test]
fn failed_train_does_not_cascade() {
    // Neither the names a failed `train` would define nor its poisoned loss are reported again.
    let src = trainable(
        "train loss with adamw(lr=0.1\nn = sqrt(train.grad_norm)\noutput w.grad, n, w.m.next",
    );
    assert_eq!(
        errors(&src),
        ["expected `,` or `)` before the end of the line"]
    );
    let src = trainable("train loss with adm()\noutput w.grad, train.step\noutput wgrad");
    assert_eq!(
        errors(&src),
        ["unknown optimizer `adm`", "unknown name `wgrad`"]
    );
    let src = trainable("bad = relu(nothing)\ntrain bad with sgd(lr=1)");
    assert_eq!(errors(&src), ["unknown name `nothing`"]);
}

const TRAIN_SAMPLE: &str = "\
graph t {
  input  x: f32[4, 3]
  param  w: f32[3, 2] = normal(std=0.1, seed=7)
  param  b: f32[2] = zeros
  loss = mean(square(add(matmul(x, w), b)))
  train loss with adamw(lr=1e-3, weight_decay=0.1, clip_norm=1.0, params=[w, b])
  output loss, train.grad_norm
}
";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Mutated `train` statements never make the parser panic; successes round-trip.
    #[test]
    fn train_never_panics(lo in 0..TRAIN_SAMPLE.len(), len in 0usize..10, insert in "[ -~\n]{0,6}") {
        let mut src = TRAIN_SAMPLE.to_string();
        let hi = (lo + len).min(src.len());
        src.replace_range(lo..hi, &insert);
        match parse(&src) {
            Ok(g) => prop_assert_eq!(parse(&print(&g)), Ok(g)),
            Err(d) => prop_assert!(d.render("train.sir", &src).starts_with("error: ")),
        }
    }
}

const SAMPLE: &str = "\
graph g {
  input  x: f32[4, 3]
  input  labels: i32[4]
  param  w: f32[3, 5] = normal(std=0.1, seed=7)
  param  b: f32[5] = zeros
  state  m: f32[3, 5] = zeros
  logits = add(matmul(x, w), b)
  loss = cross_entropy(logits, labels, reduction=\"mean\")
  dw, db = grad(loss, w, b)
  m2 = add(mul(m, 0.9), dw)
  assign m = m2
  output loss, dw; output db
}
";

#[test]
fn sample_round_trips() {
    let g = parses(SAMPLE);
    assert_eq!(parse(&print(&g)), Ok(g));
}

fn arbitrary_source() -> impl Strategy<Value = String> {
    let mutated =
        (0..SAMPLE.len(), 0..SAMPLE.len(), "[ -~\né\n()\\[\\]]{0,4}").prop_map(|(a, b, insert)| {
            let (lo, hi) = (a.min(b), a.max(b).min(a.min(b) + 8));
            let mut s = SAMPLE.to_string();
            if s.is_char_boundary(lo) && s.is_char_boundary(hi) {
                s.replace_range(lo..hi, &insert);
            }
            s
        });
    prop_oneof![
        "[ -~\n\t]{0,80}",
        "graph g \\{\n[a-z0-9_(),=\\[\\]:\n .\"#-]{0,60}\n\\}",
        "\\PC{0,40}",
        mutated,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// No input makes the parser or the renderer panic, and successes round-trip.
    #[test]
    fn never_panics(src in arbitrary_source()) {
        match parse(&src) {
            Ok(g) => prop_assert_eq!(parse(&print(&g)), Ok(g)),
            Err(d) => {
                prop_assert!(!d.is_empty());
                let text = d.render("fuzz.sir", &src);
                prop_assert!(text.starts_with("error: "));
            }
        }
    }
}

/// A call to a random op on random declared inputs with random (often extreme) attributes.
fn arbitrary_call() -> impl Strategy<Value = String> {
    let ops: Vec<&'static crate::op::OpSpec> = crate::op::OPS.iter().collect();
    let value = prop_oneof![
        Just("0".to_string()),
        Just("1".to_string()),
        Just("-1".to_string()),
        Just("3".to_string()),
        Just(i64::MAX.to_string()),
        Just(i64::MIN.to_string()),
        Just("1e308".to_string()),
        Just("-inf".to_string()),
        Just("0.5".to_string()),
        Just("true".to_string()),
        Just("\"f32\"".to_string()),
        Just("\"tanh\"".to_string()),
        Just("[]".to_string()),
        Just("[2, -1]".to_string()),
        Just(format!("[{}, {}]", i64::MAX, i64::MAX)),
        Just("[1, 0, 2, 3]".to_string()),
    ];
    let inputs = ["a", "b", "c", "d", "ids", "s", "-2.5"];
    (
        proptest::sample::select(ops),
        proptest::collection::vec(proptest::sample::select(inputs.to_vec()), 0..5),
        proptest::collection::vec((0usize..8, value), 0..4),
    )
        .prop_map(|(spec, operands, attrs)| {
            let mut args: Vec<String> = operands.iter().map(|s| s.to_string()).collect();
            for (i, v) in attrs {
                let name = spec.attrs.get(i).map_or("bogus", |a| a.name);
                args.push(format!("{name}={v}"));
            }
            format!(
                "graph g {{\n  input a: f32[2, 3, 4, 5]\n  input b: f32[1, 3, 1, 5]\n  \
                 input c: f32[3]\n  input d: f32[18446744073709551615]\n  input ids: i32[2]\n  \
                 input s: f32[]\n  y = {}({})\n  output y\n}}\n",
                spec.name,
                args.join(", ")
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// The shape rules never panic on what the parser hands them.
    #[test]
    fn calls_never_panic(src in arbitrary_call()) {
        match parse(&src) {
            Ok(g) => prop_assert_eq!(parse(&print(&g)), Ok(g)),
            Err(d) => prop_assert!(d.render("call.sir", &src).starts_with("error: ")),
        }
    }
}
