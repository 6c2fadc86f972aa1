//! Initializers of params and states: `zeros`, `ones`, `full(V)`, `normal(...)`,
//! `uniform(...)`, the training tables, `external`, written like calls and read into [`Init`].

use super::ast::{AttrArg, AttrValue, Expr, Ident, Number};
use super::suggest::did_you_mean;
use crate::diag::Diagnostic;
use crate::graph::Init;
use crate::init::{Schedule, ScheduleKind};

/// An initializer error was reported.
pub(crate) struct Reported;

type IResult<T> = Result<T, Reported>;

fn report(diags: &mut Vec<Diagnostic>, diag: Diagnostic) -> Reported {
    diags.push(diag);
    Reported
}

/// Reads an initializer expression, reporting unknown names and arguments and values with no
/// sensible meaning (`std < 0`, `hi <= lo`, negative seeds).
pub(crate) fn read_init(expr: &Expr, diags: &mut Vec<Diagnostic>) -> IResult<Init> {
    let (name, operands, attrs): (&Ident, &[Expr], &[AttrArg]) = match expr {
        Expr::Name(ident) => (ident, &[], &[]),
        Expr::Call(call) => (&call.op, &call.operands, &call.attrs),
        Expr::Number(n) => {
            let diag = Diagnostic::error("expected an initializer, found a number", n.span.range())
                .with_label("a bare number")
                .with_help(format!(
                    "write `full({})` to fill with a value",
                    format_literal(n)
                ));
            return Err(report(diags, diag));
        }
    };
    let allowed: &[&str] = match name.name.as_str() {
        "zeros" | "ones" | "external" => &[],
        "full" => &["value"],
        "normal" => &["mean", "std", "seed"],
        "uniform" => &["lo", "hi", "seed"],
        "warmup_constant" => &["lr", "warmup"],
        "warmup_linear" | "warmup_cosine" => &["lr", "warmup", "total_steps", "min_lr"],
        "bias_corrections" => &["beta1", "beta2"],
        other => {
            let diag =
                Diagnostic::error(format!("unknown initializer `{other}`"), name.span.range())
                    .with_label("not an initializer")
                    .with_optional_help(did_you_mean(other, INIT_NAMES))
                    .with_help(INIT_FORMS);
            return Err(report(diags, diag));
        }
    };
    let args = init_args(diags, name, operands, attrs, allowed)?;
    let steps = |diags: &mut Vec<Diagnostic>, key: &str| -> IResult<u64> {
        let v = args.float(key, 0.0);
        if v >= 0.0 && v.fract() == 0.0 && v <= u32::MAX as f64 {
            return Ok(v as u64);
        }
        let span = attrs
            .iter()
            .find(|a| a.name.name == key)
            .map_or(name.span, |a| a.span);
        let diag = Diagnostic::error(format!("{key}={v} is not a count of steps"), span.range())
            .with_label("not a whole number from 0");
        Err(report(diags, diag))
    };
    let kind = ScheduleKind::ALL
        .into_iter()
        .find(|k| k.init_name() == name.name);
    if let Some(kind) = kind {
        let schedule = Schedule {
            kind,
            lr: args.float("lr", f64::NAN),
            warmup: steps(diags, "warmup")?,
            total_steps: steps(diags, "total_steps")?,
            min_lr: args.float("min_lr", 0.0),
        };
        let init = Init::Schedule(schedule);
        check_init(diags, &init, name, attrs)?;
        return Ok(init);
    }
    let init = match name.name.as_str() {
        "zeros" => Init::Zeros,
        "ones" => Init::Ones,
        "external" => Init::External,
        "full" => Init::Full(args.float("value", f64::NAN)),
        "bias_corrections" => Init::BiasCorrections {
            beta1: args.float("beta1", 0.9),
            beta2: args.float("beta2", 0.999),
        },
        "normal" => Init::Normal {
            mean: args.float("mean", 0.0),
            std: args.float("std", 1.0),
            seed: args.seed,
        },
        _ => Init::Uniform {
            lo: args.float("lo", 0.0),
            hi: args.float("hi", 1.0),
            seed: args.seed,
        },
    };
    check_init(diags, &init, name, attrs)?;
    Ok(init)
}

/// Collects `name=value` arguments (and the one positional value of `full`).
fn init_args(
    diags: &mut Vec<Diagnostic>,
    name: &Ident,
    operands: &[Expr],
    attrs: &[AttrArg],
    allowed: &[&str],
) -> IResult<InitArgs> {
    let init = &name.name;
    let mut args = InitArgs::default();
    for (i, operand) in operands.iter().enumerate() {
        match operand {
            Expr::Number(n) if init == "full" && i == 0 && attrs.is_empty() => {
                args.floats.push(("value".to_string(), n.value));
            }
            other => {
                let diag = Diagnostic::error(
                    format!("`{init}` takes no positional argument here"),
                    other.span().range(),
                )
                .with_label("unexpected")
                .with_help(init_usage(init));
                return Err(report(diags, diag));
            }
        }
    }
    for arg in attrs {
        let key = arg.name.name.as_str();
        if !allowed.contains(&key) {
            let takes = if allowed.is_empty() {
                format!("`{init}` takes no arguments")
            } else {
                format!("`{init}` takes: {}", allowed.join(", "))
            };
            let diag = Diagnostic::error(
                format!("unknown argument `{key}` for `{init}`"),
                arg.name.span.range(),
            )
            .with_label("unknown")
            .with_optional_help(did_you_mean(key, allowed.iter().copied()))
            .with_help(takes);
            return Err(report(diags, diag));
        }
        if args.floats.iter().any(|(k, _)| k == key) || (key == "seed" && args.seed_given) {
            let diag = Diagnostic::error(format!("`{key}` is given twice"), arg.span.range())
                .with_label("given again");
            return Err(report(diags, diag));
        }
        match (key, &arg.value) {
            ("seed", AttrValue::Int(v)) => match u64::try_from(*v) {
                Ok(seed) => {
                    args.seed = seed;
                    args.seed_given = true;
                }
                Err(_) => {
                    let diag = Diagnostic::error(format!("seed={v} is negative"), arg.span.range())
                        .with_label("negative seed")
                        .with_help("seeds are integers from 0 to 18446744073709551615");
                    return Err(report(diags, diag));
                }
            },
            ("seed", _) => {
                let diag = Diagnostic::error("`seed` must be an integer", arg.span.range())
                    .with_label("not an integer");
                return Err(report(diags, diag));
            }
            (_, AttrValue::Int(v)) => args.floats.push((key.to_string(), *v as f64)),
            (_, AttrValue::Float(v)) => args.floats.push((key.to_string(), *v)),
            _ => {
                let diag = Diagnostic::error(format!("`{key}` must be a number"), arg.span.range())
                    .with_label("not a number");
                return Err(report(diags, diag));
            }
        }
    }
    if init == "full" && args.floats.is_empty() {
        let diag = Diagnostic::error("`full` needs a value", name.span.range())
            .with_label("no value")
            .with_help("write `full(0.5)` or `full(value=0.5)`");
        return Err(report(diags, diag));
    }
    Ok(args)
}

/// Rejects initializers with no sensible meaning.
fn check_init(
    diags: &mut Vec<Diagnostic>,
    init: &Init,
    name: &Ident,
    attrs: &[AttrArg],
) -> IResult<()> {
    let span_of = |key: &str| {
        attrs
            .iter()
            .find(|a| a.name.name == key)
            .map_or(name.span, |a| a.span)
    };
    let problem = crate::init::check(init).err();
    match problem {
        Some((key, message)) => {
            let diag = Diagnostic::error(message, span_of(key).range()).with_label("invalid");
            Err(report(diags, diag))
        }
        None => Ok(()),
    }
}

const INIT_NAMES: [&str; 10] = [
    "zeros",
    "external",
    "ones",
    "full",
    "normal",
    "uniform",
    "warmup_constant",
    "warmup_linear",
    "warmup_cosine",
    "bias_corrections",
];

pub(crate) const INIT_FORMS: &str = "initializers are zeros, ones, full(V), \
    normal(std=S, mean=M, seed=N), uniform(lo=A, hi=B, seed=N), the learning-rate tables \
    warmup_constant(lr=R, warmup=W), warmup_linear / warmup_cosine(lr=R, warmup=W, \
    total_steps=T, min_lr=M), bias_corrections(beta1=B1, beta2=B2) and external (the value \
    comes from a weights file)";

fn init_usage(init: &str) -> String {
    match init {
        "full" => "write `full(V)` or `full(value=V)`".into(),
        "normal" => "write `normal(std=S, mean=M, seed=N)`".into(),
        "uniform" => "write `uniform(lo=A, hi=B, seed=N)`".into(),
        other => format!("write `{other}`"),
    }
}

fn format_literal(n: &Number) -> String {
    crate::attr::format_float(n.value)
}

/// The arguments of an initializer, defaults not yet applied.
#[derive(Default)]
struct InitArgs {
    floats: Vec<(String, f64)>,
    seed: u64,
    seed_given: bool,
}

impl InitArgs {
    fn float(&self, key: &str, default: f64) -> f64 {
        self.floats
            .iter()
            .find(|(k, _)| k == key)
            .map_or(default, |(_, v)| *v)
    }
}
