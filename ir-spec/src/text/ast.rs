//! The syntax tree of one `.sir` file, as the parser reads it and before any checking against
//! the op table. Every piece keeps its span so that later errors can point at it.

use super::Span;
use crate::attr::Attr;
use crate::types::TensorType;

/// A name as written, with where it was written.
#[derive(Clone, Debug)]
pub(crate) struct Ident {
    pub name: String,
    pub span: Span,
}

/// An operand: a name, a numeric literal or a nested call.
#[derive(Clone, Debug)]
pub(crate) enum Expr {
    Name(Ident),
    Number(Number),
    Call(Call),
}

impl Expr {
    pub fn span(&self) -> Span {
        match self {
            Expr::Name(i) => i.span,
            Expr::Number(n) => n.span,
            Expr::Call(c) => c.span,
        }
    }
}

/// A numeric literal operand (sign included); it becomes a `constant` node.
#[derive(Clone, Debug)]
pub(crate) struct Number {
    pub value: f64,
    pub span: Span,
}

/// `op(operand, ..., name=value, ...)`.
#[derive(Clone, Debug)]
pub(crate) struct Call {
    pub op: Ident,
    pub operands: Vec<Expr>,
    pub attrs: Vec<AttrArg>,
    pub span: Span,
}

/// `name=value` inside a call; `span` covers both.
#[derive(Clone, Debug)]
pub(crate) struct AttrArg {
    pub name: Ident,
    pub value: AttrValue,
    pub span: Span,
}

/// An attribute value as written. Ints keep their full written range (any 64-bit signed or
/// unsigned value) until the context says which one they must fit: op attributes are `i64`,
/// initializer seeds are `u64`.
#[derive(Clone, Debug)]
pub(crate) enum AttrValue {
    Int(i128),
    Float(f64),
    Str(String),
    Bool(bool),
    List(Vec<AttrValue>),
}

impl AttrValue {
    /// The value as an op attribute; `None` when an int does not fit in an `i64`.
    pub fn to_attr(&self) -> Option<Attr> {
        Some(match self {
            AttrValue::Int(v) => Attr::Int(i64::try_from(*v).ok()?),
            AttrValue::Float(v) => Attr::Float(*v),
            AttrValue::Str(s) => Attr::Str(s.clone()),
            AttrValue::Bool(b) => Attr::Bool(*b),
            AttrValue::List(items) => Attr::List(
                items
                    .iter()
                    .map(AttrValue::to_attr)
                    .collect::<Option<_>>()?,
            ),
        })
    }
}

/// A written tensor type such as `f32[64, 784]`, already checked.
#[derive(Clone, Debug)]
pub(crate) struct TypeExpr {
    pub ty: TensorType,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeclKind {
    Input,
    Param,
    State,
}

impl DeclKind {
    pub fn keyword(self) -> &'static str {
        match self {
            DeclKind::Input => "input",
            DeclKind::Param => "param",
            DeclKind::State => "state",
        }
    }
}

/// One statement of the graph body.
#[derive(Clone, Debug)]
pub(crate) enum Stmt {
    /// `input NAME: TYPE`, `param NAME: TYPE = INIT`, `state NAME: TYPE = INIT`.
    Decl {
        kind: DeclKind,
        name: Ident,
        ty: TypeExpr,
        /// The initializer, written like a call (`zeros`, `normal(std=0.1)`).
        init: Option<Expr>,
    },
    /// `N1, N2 = expr`.
    Let { names: Vec<Ident>, expr: Expr },
    /// `assign TARGET = SOURCE`.
    Assign { target: Ident, source: Expr },
    /// `output N1, N2`.
    Output { names: Vec<Ident> },
    /// `train LOSS with OPT(name=value, ..., params=[P1, P2])`.
    Train(Train),
    /// A statement with a syntax error (already reported); the names it seemed to define are
    /// poisoned from here on, so their uses are not reported again. `train` is the span of the
    /// `train` keyword when the statement was a `train` (whose names are poisoned too).
    Broken {
        defines: Vec<Ident>,
        train: Option<Span>,
    },
}

/// `train LOSS with OPT(name=value, ..., params=[P1, P2])`, before any checking.
#[derive(Clone, Debug)]
pub(crate) struct Train {
    /// The `train` keyword.
    pub keyword: Span,
    pub loss: Ident,
    pub optimizer: Ident,
    /// Every `name=value` argument except `params` (`clip_norm` included), as written.
    pub attrs: Vec<AttrArg>,
    /// `params=[...]`, when given.
    pub params: Option<ParamList>,
    /// `no_decay=[...]`, when given as a list (`no_decay="1d"` is among `attrs`).
    pub no_decay: Option<ParamList>,
    /// `lr_scaled=[...]`, when given.
    pub lr_scaled: Option<ParamList>,
    /// The whole statement.
    pub span: Span,
}

/// `params=[P1, P2, ...]` of a `train` statement; `span` covers the whole argument.
#[derive(Clone, Debug)]
pub(crate) struct ParamList {
    pub names: Vec<Ident>,
    pub span: Span,
}

/// A parsed file: the graph's name and its statements in source order.
#[derive(Clone, Debug)]
pub(crate) struct File {
    pub name: String,
    pub stmts: Vec<Stmt>,
}
