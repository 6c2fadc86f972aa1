//! Lowering: the syntax tree to a [`Graph`], through the builder, which checks every node
//! against the op table and the shape rules. Builder errors are mapped back to the span of the
//! operand, attribute or name they blame.
//!
//! Errors do not cascade: a statement that fails *poisons* the names it defines, and a later use
//! of a poisoned name fails silently.

use crate::attr::key;
use std::collections::{HashMap, HashSet};

use super::Span;
use super::ast::{AttrArg, Call, DeclKind, Expr, File, Ident, Number, Stmt, Train, TypeExpr};
use super::initializer::{INIT_FORMS, read_init};
use super::suggest::did_you_mean;
use crate::attr::{Attr, Attrs};
use crate::diag::Diagnostic;
use crate::graph::{Graph, GraphError, ValueDef, ValueId};
use crate::infer::{Blame, TypeError};
use crate::init::ScheduleKind;
use crate::op::Op;
use crate::train::{self, Optimizer, TrainError, TrainSpec};

/// How `train` names what it defines, for errors about those names.
const TRAIN_NAMES_HELP: &str = "`train` names its values `<param>.grad`, `<param>.next`, \
    `<param>.m`, `<param>.v`, `<param>.momentum_buf` (and `.next` of each), \
    `<param>.grad.clipped` and `train.*`: rename the other value";

/// Builds the graph of a parsed file, reporting every independent error.
pub(crate) fn lower(file: &File, diags: &mut Vec<Diagnostic>) -> Graph {
    let mut lowerer = Lowerer {
        graph: Graph::new(file.name.clone()),
        diags,
        def_spans: Vec::new(),
        poisoned: HashSet::new(),
        defined_in_file: definitions(file),
        assign_spans: HashMap::new(),
        first_train: None,
        train_failed: false,
        train_values: None,
    };
    for stmt in &file.stmts {
        lowerer.stmt(stmt);
    }
    lowerer.graph
}

/// The first definition of every name the file defines, broken statements included.
fn definitions(file: &File) -> HashMap<String, Span> {
    let mut defs = HashMap::new();
    for stmt in &file.stmts {
        for ident in defined_names(stmt) {
            defs.entry(ident.name.clone()).or_insert(ident.span);
        }
    }
    defs
}

fn defined_names(stmt: &Stmt) -> &[Ident] {
    match stmt {
        Stmt::Decl { name, .. } => std::slice::from_ref(name),
        Stmt::Let { names, .. } => names,
        Stmt::Broken { defines, .. } => defines,
        Stmt::Assign { .. } | Stmt::Output { .. } | Stmt::Train(_) => &[],
    }
}

/// An error was reported, or a poisoned name was used; the statement is abandoned.
struct Failed;

type LResult<T> = Result<T, Failed>;

/// Where the parts of a node are written, for pointing at the part an error blames.
struct Site<'a> {
    /// The whole call or literal.
    whole: Span,
    op: Span,
    operands: &'a [Expr],
    attrs: &'a [AttrArg],
    names: Option<&'a [Ident]>,
}

struct Lowerer<'d> {
    graph: Graph,
    diags: &'d mut Vec<Diagnostic>,
    /// Where each value is defined: its name, or the nested call or literal that computes it.
    def_spans: Vec<Span>,
    poisoned: HashSet<String>,
    defined_in_file: HashMap<String, Span>,
    /// The target span of each successful `assign`, by target.
    assign_spans: HashMap<ValueId, Span>,
    /// The `train` keyword of the first `train` statement, broken or not.
    first_train: Option<Span>,
    /// A `train` statement failed: uses of names it would have defined are not reported.
    train_failed: bool,
    /// The span of the `train` statement and the values it defined (by index).
    train_values: Option<(Span, std::ops::Range<usize>)>,
}

// Statements.
impl Lowerer<'_> {
    fn stmt(&mut self, stmt: &Stmt) {
        let result = match stmt {
            Stmt::Decl {
                kind,
                name,
                ty,
                init,
            } => self.decl(*kind, name, ty, init.as_ref()),
            Stmt::Let { names, expr } => self.let_stmt(names, expr),
            Stmt::Assign { target, source } => self.assign(target, source),
            Stmt::Output { names } => {
                self.output(names);
                Ok(())
            }
            Stmt::Train(train) => {
                let result = self.train(train);
                self.train_failed |= result.is_err();
                result
            }
            Stmt::Broken {
                train: Some(keyword),
                ..
            } => {
                let _ = self.one_train(*keyword);
                self.train_failed = true;
                Err(Failed)
            }
            Stmt::Broken { train: None, .. } => Err(Failed),
        };
        if result.is_err() {
            for ident in defined_names(stmt) {
                self.poisoned.insert(ident.name.clone());
            }
        }
    }

    fn report(&mut self, diag: Diagnostic) -> Failed {
        self.diags.push(diag);
        Failed
    }

    fn decl(
        &mut self,
        kind: DeclKind,
        name: &Ident,
        ty: &TypeExpr,
        init: Option<&Expr>,
    ) -> LResult<()> {
        let def = self.decl_def(kind, name, ty, init)?;
        let (name_text, ty_value) = (name.name.clone(), ty.ty.clone());
        let result = match def {
            ValueDef::Param(init) => self.graph.add_param(name_text, ty_value, init),
            ValueDef::State(init) => self.graph.add_state(name_text, ty_value, init),
            ValueDef::Input | ValueDef::Node { .. } => self.graph.add_input(name_text, ty_value),
        };
        match result {
            Ok(_) => {
                self.def_spans.push(name.span);
                Ok(())
            }
            Err(GraphError::Redefined { previous, .. }) => Err(self.redefined(name, previous)),
            Err(other) => Err(self.report(Diagnostic::error(other.to_string(), name.span.range()))),
        }
    }

    fn redefined(&mut self, name: &Ident, previous: ValueId) -> Failed {
        let diag = Diagnostic::error(
            format!("`{}` is already defined", name.name),
            name.span.range(),
        )
        .with_label("defined again here");
        let diag = match &self.train_values {
            Some((span, values)) if values.contains(&previous.index()) => diag
                .with_secondary(
                    span.range(),
                    format!("`train` defines `{}` here", name.name),
                )
                .with_help(TRAIN_NAMES_HELP),
            _ => diag
                .with_secondary(self.def_span(previous).range(), "first defined here")
                .with_help("values are immutable: give the new value another name"),
        };
        self.report(diag)
    }

    fn def_span(&self, id: ValueId) -> Span {
        self.def_spans.get(id.index()).copied().unwrap_or_default()
    }

    /// `NAME = expr` and `N1, N2 = expr`.
    fn let_stmt(&mut self, names: &[Ident], expr: &Expr) -> LResult<()> {
        self.distinct_names(names)?;
        match expr {
            Expr::Call(call) => self.call(call, Some(names)).map(drop),
            Expr::Number(n) => self.literal(n, Some(names)).map(drop),
            Expr::Name(source) => {
                let target = names.iter().map(|n| n.name.as_str()).collect::<Vec<_>>();
                let diag = Diagnostic::error(
                    format!(
                        "`{} = {}` only renames a value",
                        target.join(", "),
                        source.name
                    ),
                    source.span.range(),
                )
                .with_label("a name, not a call")
                .with_help(format!(
                    "values are immutable: use `{}` wherever `{}` is needed",
                    source.name, target[0]
                ));
                Err(self.report(diag))
            }
        }
    }

    /// One statement names each result differently.
    fn distinct_names(&mut self, names: &[Ident]) -> LResult<()> {
        for (i, name) in names.iter().enumerate() {
            if let Some(first) = names[..i].iter().find(|n| n.name == name.name) {
                let diag = Diagnostic::error(
                    format!("`{}` names two results", name.name),
                    name.span.range(),
                )
                .with_label("named again here")
                .with_secondary(first.span.range(), "first named here")
                .with_help("give each result its own name");
                return Err(self.report(diag));
            }
        }
        Ok(())
    }

    /// `assign TARGET = SOURCE`.
    fn assign(&mut self, target: &Ident, source: &Expr) -> LResult<()> {
        let target_id = self.use_name(target);
        let source_id = self.operand(source);
        let (t, s) = (target_id?, source_id?);
        match self.graph.add_assign(t, s) {
            Ok(()) => {
                self.assign_spans.insert(t, target.span);
                Ok(())
            }
            Err(err) => {
                let diag = self.assign_error(err, t, target, source);
                Err(self.report(diag))
            }
        }
    }

    fn assign_error(
        &self,
        err: GraphError,
        t: ValueId,
        target: &Ident,
        source: &Expr,
    ) -> Diagnostic {
        let declared = self.def_span(t).range();
        match err {
            GraphError::AssignToNonPersistent { name } => {
                let what = if self.graph.value(t).is_leaf() {
                    "an input"
                } else {
                    "computed by a node"
                };
                let message = format!("`{name}` is not a param or state, so it cannot be assigned");
                Diagnostic::error(message, target.span.range())
                    .with_label(format!("`{name}` is {what}"))
                    .with_secondary(declared, "defined here")
                    .with_help(
                        "only params and states persist across runs; \
                         declare it with `param` or `state` to update it",
                    )
            }
            GraphError::AssignType {
                target: name,
                expected,
                actual,
            } => {
                let message =
                    format!("`assign {name}` needs a value of type {expected}, got {actual}");
                Diagnostic::error(message, source.span().range())
                    .with_label(format!("this is {actual}"))
                    .with_secondary(declared, format!("`{name}` is declared as {expected}"))
            }
            GraphError::AssignedTwice { name } => {
                let first = self.assign_spans.get(&t).copied().unwrap_or_default();
                Diagnostic::error(format!("`{name}` is assigned twice"), target.span.range())
                    .with_label("assigned again here")
                    .with_secondary(first.range(), "first assigned here")
                    .with_help(
                        "a param or state takes one new value per run; \
                         compute the final value first",
                    )
            }
            other => Diagnostic::error(other.to_string(), target.span.range()),
        }
    }

    /// `output N1, N2, ...`: appends every name that resolves.
    fn output(&mut self, names: &[Ident]) {
        for name in names {
            if let Ok(id) = self.use_name(name) {
                self.graph.add_output(id);
            }
        }
    }
}

// Names and expressions.
impl Lowerer<'_> {
    /// Resolves a use of a name; reports unknown names and uses before the definition.
    fn use_name(&mut self, ident: &Ident) -> LResult<ValueId> {
        if let Some(id) = self.graph.lookup(&ident.name) {
            return Ok(id);
        }
        if self.poisoned.contains(&ident.name)
            || (self.train_failed && train::is_train_name(&ident.name))
        {
            return Err(Failed);
        }
        let diag = match self.defined_in_file.get(&ident.name) {
            Some(def) => Diagnostic::error(
                format!("`{}` is used before it is defined", ident.name),
                ident.span.range(),
            )
            .with_label("used here")
            .with_secondary(def.range(), "defined here")
            .with_help("statements run in order: move the definition above its first use"),
            None => {
                let known = self
                    .graph
                    .values
                    .iter()
                    .map(|v| v.name.as_str())
                    .filter(|n| !Graph::is_generated_name(n));
                Diagnostic::error(format!("unknown name `{}`", ident.name), ident.span.range())
                    .with_label("not defined")
                    .with_optional_help(did_you_mean(&ident.name, known))
            }
        };
        Err(self.report(diag))
    }

    /// An operand: a name, a literal (a new `constant`), or a nested call with one result.
    fn operand(&mut self, expr: &Expr) -> LResult<ValueId> {
        match expr {
            Expr::Name(ident) => self.use_name(ident),
            Expr::Number(n) => Ok(self.literal(n, None)?[0]),
            Expr::Call(call) => {
                let results = self.call(call, None)?;
                match results[..] {
                    [one] => Ok(one),
                    _ => {
                        let op = &call.op.name;
                        let diag = Diagnostic::error(
                            format!(
                                "`{op}` has {} results, so it cannot be an operand",
                                results.len()
                            ),
                            call.span.range(),
                        )
                        .with_label("a multi-result call")
                        .with_help(format!("name its results first: `a, b = {op}(...)`"));
                        Err(self.report(diag))
                    }
                }
            }
        }
    }

    /// A numeric literal: a scalar f32 `constant`.
    fn literal(&mut self, n: &Number, names: Option<&[Ident]>) -> LResult<Vec<ValueId>> {
        let attrs = Attrs::new().and(key::VALUE, n.value);
        let site = Site {
            whole: n.span,
            op: n.span,
            operands: &[],
            attrs: &[],
            names,
        };
        self.add_node(Op::Constant, &[], attrs, &site)
    }

    /// A call: resolves the op, its operands (innermost calls first) and attributes, then adds
    /// the node. Every independent error among them is reported.
    fn call(&mut self, call: &Call, names: Option<&[Ident]>) -> LResult<Vec<ValueId>> {
        let op = self.op(&call.op);
        let mut operands = Vec::with_capacity(call.operands.len());
        let mut failed = op.is_err();
        for expr in &call.operands {
            match self.operand(expr) {
                Ok(id) => operands.push(id),
                Err(Failed) => failed = true,
            }
        }
        let attrs = self.attrs(&call.attrs);
        let (Ok(op), Ok(attrs), false) = (op, attrs, failed) else {
            return Err(Failed);
        };
        let site = Site {
            whole: call.span,
            op: call.op.span,
            operands: &call.operands,
            attrs: &call.attrs,
            names,
        };
        self.add_node(op, &operands, attrs, &site)
    }

    fn op(&mut self, ident: &Ident) -> LResult<Op> {
        if let Some(op) = Op::from_name(&ident.name) {
            return Ok(op);
        }
        let diag = Diagnostic::error(format!("unknown op `{}`", ident.name), ident.span.range())
            .with_label("not an op")
            .with_optional_help(did_you_mean(&ident.name, Op::all().map(Op::name)));
        Err(self.report(diag))
    }

    fn attrs(&mut self, args: &[AttrArg]) -> LResult<Attrs> {
        let mut attrs = Attrs::new();
        let mut seen: HashMap<&str, Span> = HashMap::new();
        let mut failed = false;
        for arg in args {
            if let Some(first) = seen.insert(&arg.name.name, arg.span) {
                let diag = Diagnostic::error(
                    format!("attribute `{}` is given twice", arg.name.name),
                    arg.span.range(),
                )
                .with_label("given again")
                .with_secondary(first.range(), "first given here");
                failed = true;
                self.diags.push(diag);
                continue;
            }
            match arg.value.to_attr() {
                Some(value) => attrs.set(&arg.name.name, value),
                None => {
                    failed = true;
                    let diag = Diagnostic::error(
                        format!("`{}` holds an int outside the i64 range", arg.name.name),
                        arg.span.range(),
                    )
                    .with_label("too large")
                    .with_help(format!(
                        "ints range from {} to {}",
                        i64::MIN,
                        i64::MAX
                    ));
                    self.diags.push(diag);
                }
            }
        }
        if failed { Err(Failed) } else { Ok(attrs) }
    }

    /// Adds a node through the builder and records where its results are defined.
    fn add_node(
        &mut self,
        op: Op,
        operands: &[ValueId],
        attrs: Attrs,
        site: &Site,
    ) -> LResult<Vec<ValueId>> {
        let names: Option<Vec<String>> = site
            .names
            .map(|ns| ns.iter().map(|n| n.name.clone()).collect());
        match self.graph.add_node(op, operands, attrs, names.as_deref()) {
            Ok(results) => {
                for i in 0..results.len() {
                    let span = match site.names {
                        Some(ns) => ns.get(i).map_or(site.op, |n| n.span),
                        None => site.whole,
                    };
                    self.def_spans.push(span);
                }
                Ok(results)
            }
            Err(err) => Err(self.node_error(err, operands, site)),
        }
    }
}

// Mapping builder errors to spans.
impl Lowerer<'_> {
    fn node_error(&mut self, err: GraphError, operands: &[ValueId], site: &Site) -> Failed {
        let diag = match err {
            GraphError::Type(err) => self.type_error(err, operands, site),
            GraphError::Redefined { name, previous } => {
                let ident = site
                    .names
                    .and_then(|ns| ns.iter().find(|n| n.name == name))
                    .cloned()
                    .unwrap_or(Ident {
                        name,
                        span: site.op,
                    });
                return self.redefined(&ident, previous);
            }
            GraphError::GradOfComputed { operand, name } => {
                let span = site.operands.get(operand).map_or(site.op, Expr::span);
                let message = format!(
                    "`grad` differentiates with respect to inputs, params and states, \
                     but `{name}` is computed by a node"
                );
                let mut diag = Diagnostic::error(message, span.range())
                    .with_label("a computed value")
                    .with_help(
                        "differentiate with respect to the param or input it is computed from",
                    );
                if let Some(id) = self.graph.lookup(&name) {
                    diag = diag.with_secondary(self.def_span(id).range(), "computed here");
                }
                diag
            }
            GraphError::SecondOrder { value, name, op } => {
                let loss = site.operands.first().map_or(site.op, Expr::span);
                Diagnostic::error(
                    format!(
                        "`grad` would differentiate through `{name}`, a result of `{op}`: \
                         second-order gradients are not supported"
                    ),
                    self.def_span(value).range(),
                )
                .with_label(format!("`{name}` is computed by this `{op}`"))
                .with_secondary(loss.range(), format!("this loss depends on `{name}`"))
                .with_help(
                    "a loss may use gradients or optimizer results only through values that do \
                     not depend on what it is differentiated with respect to",
                )
            }
            GraphError::ResultCount {
                names,
                op,
                given,
                results,
            } => {
                let span = match site.names {
                    Some([first, .., last]) => first.span.to(last.span),
                    Some([only]) => only.span,
                    _ => site.op,
                };
                let results_word = if results == 1 { "result" } else { "results" };
                let given_words = if given == 1 { "name is" } else { "names are" };
                Diagnostic::error(
                    format!("`{op}` has {results} {results_word} but {given} {given_words} given"),
                    span.range(),
                )
                .with_label(format!("{given} name{}", if given == 1 { "" } else { "s" }))
                .with_secondary(
                    site.op.range(),
                    format!("`{op}` returns {results} {results_word}"),
                )
                .with_help(format!(
                    "write {results} name{} before `=` (got `{names}`)",
                    if results == 1 { "" } else { "s" }
                ))
            }
            other => Diagnostic::error(other.to_string(), site.op.range()),
        };
        self.report(diag)
    }

    fn type_error(&self, err: TypeError, operands: &[ValueId], site: &Site) -> Diagnostic {
        let (span, label) = match &err.blame {
            Blame::Op => (site.op, String::new()),
            Blame::Operand(i) => match (site.operands.get(*i), operands.get(*i)) {
                (Some(expr), Some(&id)) => (expr.span(), self.describe(expr, id)),
                _ => (site.op, String::new()),
            },
            Blame::Attr(name) => match site.attrs.iter().find(|a| a.name.name == *name) {
                Some(arg) => (arg.span, String::new()),
                None => (site.op, format!("with the default `{name}`")),
            },
        };
        Diagnostic::error(err.message, span.range())
            .with_label(label)
            .with_optional_help(err.hint)
    }

    /// "`x` is f32[2, 3]" or "this is f32[2, 3]", for the label under a blamed operand.
    fn describe(&self, expr: &Expr, id: ValueId) -> String {
        let ty = self.graph.ty(id);
        match expr {
            Expr::Name(ident) => format!("`{}` is {ty}", ident.name),
            _ => format!("this is {ty}"),
        }
    }
}

// Declarations.
impl Lowerer<'_> {
    /// What a declaration defines: an input, or a param or state with its initializer.
    fn decl_def(
        &mut self,
        kind: DeclKind,
        name: &Ident,
        ty: &TypeExpr,
        init: Option<&Expr>,
    ) -> LResult<ValueDef> {
        match (kind, init) {
            (DeclKind::Input, None) => Ok(ValueDef::Input),
            (DeclKind::Input, Some(init)) => {
                let diag = Diagnostic::error("an input takes no initializer", init.span().range())
                    .with_label("inputs are fed on every run")
                    .with_help(
                        "declare it with `param` or `state` to give it a first value that persists",
                    );
                Err(self.report(diag))
            }
            (_, None) => {
                let keyword = kind.keyword();
                let diag = Diagnostic::error(
                    format!("{keyword} `{}` needs an initializer", name.name),
                    name.span.to(ty.span).range(),
                )
                .with_label("no initializer")
                .with_help(format!(
                    "for example `{keyword} {}: {} = zeros`; {INIT_FORMS}",
                    name.name, ty.ty
                ));
                Err(self.report(diag))
            }
            (DeclKind::Param, Some(init)) => read_init(init, self.diags)
                .map(ValueDef::Param)
                .map_err(|_| Failed),
            (DeclKind::State, Some(init)) => read_init(init, self.diags)
                .map(ValueDef::State)
                .map_err(|_| Failed),
        }
    }
}

// The `train` statement.
impl Lowerer<'_> {
    /// Records a `train` statement; the second one in a file is an error.
    fn one_train(&mut self, keyword: Span) -> LResult<()> {
        match self.first_train {
            None => {
                self.first_train = Some(keyword);
                Ok(())
            }
            Some(first) => {
                let diag =
                    Diagnostic::error("a graph has at most one `train` statement", keyword.range())
                        .with_label("a second `train`")
                        .with_secondary(first.range(), "the first `train` is here")
                        .with_help(
                            "one `train` updates every param it lists: use `params=[...]` to pick \
                         them, or write the second optimizer's grad, update and assign statements \
                         by hand",
                        );
                Err(self.report(diag))
            }
        }
    }

    /// `train LOSS with OPT(...)`: resolves the parts (reporting every independent error), then
    /// expands through [`train::add_training`].
    fn train(&mut self, t: &Train) -> LResult<()> {
        self.one_train(t.keyword)?;
        let optimizer = self.optimizer(&t.optimizer);
        let loss = self.use_name(&t.loss);
        let mut params = Some(Vec::new());
        for ident in t.params.iter().flat_map(|p| &p.names) {
            match (self.use_name(ident), params.as_mut()) {
                (Ok(id), Some(list)) => list.push(id),
                _ => params = None,
            }
        }
        let attrs = self.attrs(&t.attrs);
        let no_decay = self.no_decay(t);
        let lr_scaled = self.lr_scaled(t);
        let clip_norm = self.clip_norm(t);
        let schedule = self.schedule(t);
        let micro_batches = self.accumulate(t);
        let known = match optimizer {
            Ok(optimizer) => self.known_train_attrs(optimizer, t),
            Err(Failed) => Err(Failed),
        };
        let (
            Ok(optimizer),
            Ok(loss),
            Some(params),
            Ok(attrs),
            Ok(clip_norm),
            Ok(schedule),
            Ok(no_decay),
            Ok(lr_scaled),
            Ok(micro_batches),
            Ok(()),
        ) = (
            optimizer,
            loss,
            params,
            attrs,
            clip_norm,
            schedule,
            no_decay,
            lr_scaled,
            micro_batches,
            known,
        )
        else {
            return Err(Failed);
        };
        let spec = TrainSpec {
            optimizer,
            attrs: attrs
                .iter()
                .filter(|(k, _)| !train::TRAIN_ATTRS.contains(k))
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            clip_norm,
            params: t.params.as_ref().map(|_| params),
            schedule,
            no_decay,
            lr_scaled,
            accumulate: micro_batches,
        };
        let first_value = self.graph.values.len();
        let first_assign = self.graph.assigns.len();
        match train::add_training(&mut self.graph, loss, &spec) {
            Ok(_) => {
                let created = self.graph.values.len() - first_value;
                self.def_spans.extend(std::iter::repeat_n(t.span, created));
                for a in &self.graph.assigns[first_assign..] {
                    self.assign_spans.insert(a.target, t.span);
                }
                self.train_values = Some((t.span, first_value..self.graph.values.len()));
                Ok(())
            }
            Err(err) => {
                let diag = self.train_error(err, t);
                Err(self.report(diag))
            }
        }
    }

    fn optimizer(&mut self, ident: &Ident) -> LResult<Optimizer> {
        if let Some(o) = Optimizer::from_name(&ident.name) {
            return Ok(o);
        }
        let names = Optimizer::ALL.map(Optimizer::name);
        let diag = Diagnostic::error(
            format!("unknown optimizer `{}`", ident.name),
            ident.span.range(),
        )
        .with_label("not an optimizer")
        .with_optional_help(did_you_mean(&ident.name, names))
        .with_help("the optimizers are sgd, adam and adamw");
        Err(self.report(diag))
    }

    /// `clip_norm=X`, when given: a number (checked for range by `add_training`).
    fn clip_norm(&mut self, t: &Train) -> LResult<Option<f64>> {
        let Some(arg) = t.attrs.iter().find(|a| a.name.name == "clip_norm") else {
            return Ok(None);
        };
        match arg.value.to_attr().as_ref().and_then(Attr::as_float) {
            Some(v) => Ok(Some(v)),
            None => {
                let diag = Diagnostic::error("`clip_norm` must be a number", arg.span.range())
                    .with_label("not a number")
                    .with_help("for example `clip_norm=1.0`");
                Err(self.report(diag))
            }
        }
    }

    /// `schedule=`, `warmup=`, `total_steps=` and `min_lr=` (ranges are checked by
    /// `add_training`).
    fn schedule(&mut self, t: &Train) -> LResult<train::LrSchedule> {
        let mut s = train::LrSchedule::CONSTANT;
        let mut failed = false;
        for arg in &t.attrs {
            let value = arg.value.to_attr();
            let problem = match arg.name.name.as_str() {
                "schedule" => match value.as_ref().and_then(Attr::as_str) {
                    Some(name) => match ScheduleKind::from_name(name) {
                        Some(kind) => {
                            s.kind = kind;
                            None
                        }
                        None => Some("`schedule` is \"constant\", \"linear\" or \"cosine\""),
                    },
                    None => Some("`schedule` is \"constant\", \"linear\" or \"cosine\""),
                },
                "warmup" | "total_steps" => match value.as_ref().and_then(Attr::as_int) {
                    Some(v) if (0..=i64::from(u32::MAX)).contains(&v) => {
                        if arg.name.name == "warmup" {
                            s.warmup = v as u64;
                        } else {
                            s.total_steps = Some(v as u64);
                        }
                        None
                    }
                    _ => Some("a count of steps: a whole number from 0"),
                },
                "min_lr" => match value.as_ref().and_then(Attr::as_float) {
                    Some(v) => {
                        s.min_lr = v;
                        None
                    }
                    None => Some("`min_lr` must be a number"),
                },
                _ => None,
            };
            if let Some(message) = problem {
                let diag = Diagnostic::error(message, arg.span.range()).with_label("invalid");
                self.diags.push(diag);
                failed = true;
            }
        }
        if failed { Err(Failed) } else { Ok(s) }
    }

    /// `accumulate=K`, K ≥ 1 (default 1).
    fn accumulate(&mut self, t: &Train) -> LResult<u64> {
        let Some(arg) = t.attrs.iter().find(|a| a.name.name == "accumulate") else {
            return Ok(1);
        };
        match arg.value.to_attr().as_ref().and_then(Attr::as_int) {
            Some(k) if (1..=i64::from(u32::MAX)).contains(&k) => Ok(k as u64),
            _ => {
                let diag = Diagnostic::error(
                    "`accumulate` is the number of micro-batches per update, a whole number from 1",
                    arg.span.range(),
                )
                .with_label("invalid");
                Err(self.report(diag))
            }
        }
    }

    /// `no_decay=[P1, ...]` or `no_decay="1d"`.
    fn no_decay(&mut self, t: &Train) -> LResult<train::NoDecay> {
        if let Some(list) = &t.no_decay {
            let mut ids = Vec::new();
            for ident in &list.names {
                ids.push(self.use_name(ident)?);
            }
            return Ok(train::NoDecay::Listed(ids));
        }
        let Some(arg) = t.attrs.iter().find(|a| a.name.name == "no_decay") else {
            return Ok(train::NoDecay::Nothing);
        };
        match arg.value.to_attr().as_ref().and_then(Attr::as_str) {
            Some("1d") => Ok(train::NoDecay::OneD),
            _ => {
                let diag = Diagnostic::error(
                    "`no_decay` is \"1d\" (the params of rank 0 or 1) or a list of params",
                    arg.span.range(),
                )
                .with_label("invalid")
                .with_help("for example `no_decay=\"1d\"` or `no_decay=[b1, ln.g]`");
                Err(self.report(diag))
            }
        }
    }

    /// `lr_scaled=[P1, ...]` with `lr_scale=S`: both or neither.
    fn lr_scaled(&mut self, t: &Train) -> LResult<Option<train::LrScaled>> {
        let scale = t.attrs.iter().find(|a| a.name.name == "lr_scale");
        match (&t.lr_scaled, scale) {
            (None, None) => Ok(None),
            (Some(list), Some(arg)) => {
                let Some(scale) = arg.value.to_attr().as_ref().and_then(Attr::as_float) else {
                    let diag = Diagnostic::error("`lr_scale` is a number", arg.span.range())
                        .with_label("not a number");
                    return Err(self.report(diag));
                };
                let mut params = Vec::new();
                for ident in &list.names {
                    params.push(self.use_name(ident)?);
                }
                Ok(Some(train::LrScaled { params, scale }))
            }
            (Some(list), None) => {
                let diag = Diagnostic::error(
                    "`lr_scaled` names a group without its factor",
                    list.span.range(),
                )
                .with_label("no `lr_scale`")
                .with_help("give the group's factor: `lr_scaled=[emb], lr_scale=0.1`");
                Err(self.report(diag))
            }
            (None, Some(arg)) => {
                let diag =
                    Diagnostic::error("`lr_scale` without the params it scales", arg.span.range())
                        .with_label("no `lr_scaled=[...]`")
                        .with_help("name the group: `lr_scaled=[emb], lr_scale=0.1`");
                Err(self.report(diag))
            }
        }
    }

    /// Rejects attributes that neither the optimizer nor `train` takes.
    fn known_train_attrs(&mut self, optimizer: Optimizer, t: &Train) -> LResult<()> {
        let spec = optimizer.op().spec();
        let known: Vec<&str> = spec.attrs.iter().map(|a| a.name).collect();
        let mut failed = false;
        for arg in &t.attrs {
            let name = arg.name.name.as_str();
            if train::TRAIN_ATTRS.contains(&name) || known.contains(&name) {
                continue;
            }
            let candidates = known
                .iter()
                .copied()
                .chain(train::TRAIN_ATTRS)
                .chain(["params"]);
            let diag = Diagnostic::error(
                format!(
                    "unknown attribute `{name}` for `train ... with {}`",
                    spec.name
                ),
                arg.name.span.range(),
            )
            .with_label("unknown")
            .with_optional_help(did_you_mean(name, candidates))
            .with_help(format!(
                "`{}` takes {}; `train` adds clip_norm, schedule, warmup, total_steps, min_lr \
                 and params",
                spec.name,
                known.join(", ")
            ));
            self.diags.push(diag);
            failed = true;
        }
        if failed { Err(Failed) } else { Ok(()) }
    }

    fn train_error(&self, err: TrainError, t: &Train) -> Diagnostic {
        let listed = |index: usize| t.params.as_ref().map(|p| p.names[index].clone());
        match err {
            TrainError::NoParams => {
                let (span, label) = match &t.params {
                    Some(list) => (list.span, "an empty list"),
                    None => (t.keyword, "no `param` is declared above"),
                };
                Diagnostic::error("there are no params to train", span.range())
                    .with_label(label)
                    .with_help(
                        "declare what `train` updates with `param NAME: TYPE = INIT` \
                         above the `train` statement",
                    )
            }
            TrainError::NotAParam { index, name } => {
                let ident = listed(index).expect("only listed params are checked");
                let id = self.graph.lookup(&name).expect("resolved");
                let what = match self.graph.value(id).def {
                    ValueDef::Input => "an input",
                    ValueDef::State(_) => "a state",
                    _ => "computed by a node",
                };
                Diagnostic::error(
                    format!("`{name}` is not a param, so `train` cannot update it"),
                    ident.span.range(),
                )
                .with_label(format!("`{name}` is {what}"))
                .with_secondary(self.def_span(id).range(), "defined here")
                .with_help("`train` updates params: declare it with `param` to train it")
            }
            TrainError::DuplicateParam { index, name } => {
                let ident = listed(index).expect("only listed params are checked");
                let first = t
                    .params
                    .as_ref()
                    .and_then(|p| p.names.iter().find(|n| n.name == name));
                let mut diag = Diagnostic::error(
                    format!("`{name}` is listed twice in `params`"),
                    ident.span.range(),
                )
                .with_label("listed again");
                if let Some(first) = first {
                    diag = diag.with_secondary(first.span.range(), "first listed here");
                }
                diag
            }
            TrainError::NotF32 { index, name, ty } => {
                let span = index.and_then(listed).map_or(t.keyword, |i| i.span);
                let mut diag = Diagnostic::error(
                    format!("`train` updates f32 params, but `{name}` is {ty}"),
                    span.range(),
                )
                .with_label(format!("`{name}` is {ty}"));
                if let Some(id) = self.graph.lookup(&name) {
                    diag = diag.with_secondary(self.def_span(id).range(), "declared here");
                }
                if index.is_none() {
                    diag = diag.with_help("list the f32 params to train with `params=[...]`");
                }
                diag
            }
            TrainError::LossType { ty } => Diagnostic::error(
                format!("`train` needs a scalar f32 loss, got {ty}"),
                t.loss.span.range(),
            )
            .with_label(format!("`{}` is {ty}", t.loss.name))
            .with_help("reduce the loss to a scalar first, e.g. `loss = mean(...)`"),
            TrainError::Schedule(message) => {
                let span = t
                    .attrs
                    .iter()
                    .find(|a| {
                        ["schedule", "total_steps", "min_lr", "warmup"]
                            .contains(&a.name.name.as_str())
                    })
                    .map_or(t.keyword, |a| a.span);
                Diagnostic::error(message, span.range()).with_label("invalid schedule")
            }
            TrainError::LrScaled { name } => {
                let span = t
                    .lr_scaled
                    .as_ref()
                    .and_then(|l| l.names.iter().find(|n| n.name == name))
                    .map_or(t.keyword, |n| n.span);
                Diagnostic::error(
                    format!("`{name}` in lr_scaled is not a param this `train` updates"),
                    span.range(),
                )
                .with_label("not trained here")
            }
            TrainError::LrScale { value } => {
                let span = t
                    .attrs
                    .iter()
                    .find(|a| a.name.name == "lr_scale")
                    .map_or(t.keyword, |a| a.span);
                Diagnostic::error(
                    format!("lr_scale={value} must be positive and finite"),
                    span.range(),
                )
                .with_label("invalid")
            }
            TrainError::NoDecay { name } => {
                let span = t
                    .no_decay
                    .as_ref()
                    .and_then(|l| l.names.iter().find(|n| n.name == name))
                    .map_or(t.keyword, |n| n.span);
                Diagnostic::error(
                    format!("`{name}` in no_decay is not a param this `train` updates"),
                    span.range(),
                )
                .with_label("not trained here")
            }
            TrainError::ClipNorm { value } => {
                let span = t
                    .attrs
                    .iter()
                    .find(|a| a.name.name == "clip_norm")
                    .map_or(t.keyword, |a| a.span);
                Diagnostic::error(
                    format!("clip_norm={value} must be positive and finite"),
                    span.range(),
                )
                .with_label("invalid")
            }
            TrainError::Optimizer(err) => {
                let (span, label) = match &err.blame {
                    Blame::Attr(name) => match t.attrs.iter().find(|a| a.name.name == *name) {
                        Some(arg) => (arg.span, String::new()),
                        None => (t.optimizer.span, format!("with the default `{name}`")),
                    },
                    Blame::Op | Blame::Operand(_) => (t.optimizer.span, String::new()),
                };
                Diagnostic::error(err.message, span.range())
                    .with_label(label)
                    .with_optional_help(err.hint)
            }
            TrainError::AlreadyAssigned { name } => {
                let index = t
                    .params
                    .as_ref()
                    .and_then(|p| p.names.iter().position(|n| n.name == name));
                let span = index.and_then(listed).map_or(t.keyword, |i| i.span);
                let mut diag = Diagnostic::error(
                    format!(
                        "`{name}` is already assigned, and `train` assigns every param it trains"
                    ),
                    span.range(),
                )
                .with_label(format!("`train` would assign `{name}` again"));
                let assigned = self
                    .graph
                    .lookup(&name)
                    .and_then(|id| self.assign_spans.get(&id));
                if let Some(first) = assigned {
                    diag = diag.with_secondary(first.range(), "assigned here");
                }
                diag.with_help(format!(
                    "remove that `assign`, or leave `{name}` out of `params=[...]`"
                ))
            }
            TrainError::NameTaken {
                name,
                purpose,
                previous,
            } => {
                let mut diag = Diagnostic::error(
                    format!(
                        "`train` needs the name `{name}` for {purpose}, but it is already defined"
                    ),
                    t.keyword.range(),
                )
                .with_label(format!("`train` defines `{name}`"));
                if let Some(id) = previous {
                    diag = diag.with_secondary(
                        self.def_span(id).range(),
                        format!("`{name}` is defined here"),
                    );
                }
                diag.with_help(TRAIN_NAMES_HELP)
            }
            TrainError::Graph(err) => Diagnostic::error(err.to_string(), t.keyword.range()),
        }
    }
}
