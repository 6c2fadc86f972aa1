//! The parser: tokens to a syntax tree ([`File`]), reporting syntax errors.
//!
//! Recovery is per statement: after an error the parser skips to the next newline (or `;`) at
//! bracket depth 0 and records a [`Stmt::Broken`] that poisons the names the statement seemed to
//! define. Inside brackets newlines are insignificant, so a call may span lines; when an open
//! bracket meets a line that starts like a new statement, the parser assumes a missing `)` and
//! resumes at that line instead of skipping the rest of the file.

use super::ast::{
    AttrArg, AttrValue, Call, DeclKind, Expr, File, Ident, Number, ParamList, Stmt, Train, TypeExpr,
};
use super::lexer::{Token, TokenKind};
use super::suggest::did_you_mean;
use super::{KEYWORDS, MAX_NESTING, Span};
use crate::diag::Diagnostic;
use crate::types::{DType, TensorType};

/// A syntax error was reported (or an invalid token was met); the statement is abandoned.
struct Stop;

type PResult<T> = Result<T, Stop>;

/// Parses a token stream (ending in `Eof`) into a file.
pub(crate) fn parse_tokens(src: &str, tokens: &[Token], diags: &mut Vec<Diagnostic>) -> File {
    let mut parser = Parser {
        src,
        tokens,
        pos: 0,
        diags,
        depth: 0,
        open: Vec::new(),
    };
    parser.file()
}

struct Parser<'a> {
    src: &'a str,
    tokens: &'a [Token],
    pos: usize,
    diags: &'a mut Vec<Diagnostic>,
    /// Nesting of calls and lists in the current statement, bounded by [`MAX_NESTING`].
    depth: usize,
    /// Brackets open in the current statement (newlines inside them are skipped).
    open: Vec<Span>,
}

// Token access.
impl<'a> Parser<'a> {
    /// Index of the next significant token: inside brackets, newlines are skipped.
    fn next_index(&self, from: usize) -> usize {
        let mut i = from.min(self.tokens.len() - 1);
        if !self.open.is_empty() {
            while self.tokens[i].kind == TokenKind::Newline {
                i += 1;
            }
        }
        i
    }

    fn skip_insignificant(&mut self) {
        self.pos = self.next_index(self.pos);
    }

    fn peek(&mut self) -> &TokenKind {
        self.skip_insignificant();
        &self.tokens[self.pos].kind
    }

    /// The token after the next one.
    fn peek_second(&mut self) -> &TokenKind {
        self.skip_insignificant();
        let i = self.next_index(self.pos + 1);
        &self.tokens[i].kind
    }

    fn peek_third(&mut self) -> &TokenKind {
        self.skip_insignificant();
        let second = self.next_index(self.pos + 1);
        let i = self.next_index(second + 1);
        &self.tokens[i].kind
    }

    fn span(&mut self) -> Span {
        self.skip_insignificant();
        self.tokens[self.pos].span
    }

    fn text(&self, span: Span) -> &'a str {
        &self.src[span.range()]
    }

    /// The text of the next token when it is an identifier.
    fn peek_ident(&mut self) -> Option<&'a str> {
        match self.peek() {
            TokenKind::Ident => {
                let span = self.tokens[self.pos].span;
                Some(self.text(span))
            }
            _ => None,
        }
    }

    fn bump(&mut self) -> Token {
        self.skip_insignificant();
        let token = self.tokens[self.pos].clone();
        if token.kind != TokenKind::Eof {
            self.pos += 1;
        }
        token
    }

    /// End of the previous token other than a newline (where a missing token belongs).
    fn prev_end(&self) -> usize {
        self.tokens[..self.pos]
            .iter()
            .rev()
            .find(|t| t.kind != TokenKind::Newline)
            .map_or(0, |t| t.span.end)
    }

    /// Whether the next token is the first of its line.
    fn at_line_start(&mut self) -> bool {
        self.skip_insignificant();
        self.pos > 0 && self.tokens[self.pos - 1].kind == TokenKind::Newline
    }

    fn open_bracket(&mut self) {
        let token = self.bump();
        self.open.push(token.span);
    }

    fn close_bracket(&mut self) -> Span {
        let token = self.bump();
        self.open.pop();
        token.span
    }
}

// Errors and recovery.
impl<'a> Parser<'a> {
    fn fail<T>(&mut self, diag: Diagnostic) -> PResult<T> {
        self.diags.push(diag);
        Err(Stop)
    }

    /// Reports "expected X, found Y" at the next token (unless it is an invalid token, which the
    /// lexer already reported).
    fn unexpected<T>(&mut self, expected: &str) -> PResult<T> {
        self.unexpected_with(expected, None)
    }

    fn unexpected_with<T>(&mut self, expected: &str, help: Option<String>) -> PResult<T> {
        let kind = self.peek().clone();
        if kind == TokenKind::Error {
            return Err(Stop);
        }
        if let Some(&opened) = self.open.last()
            && self.at_line_start()
        {
            let end = self.prev_end();
            let diag = Diagnostic::error(
                format!("expected {expected} before the end of the line"),
                end..end,
            )
            .with_label(format!("expected {expected} here"))
            .with_secondary(opened.range(), "this bracket is still open")
            .with_help("close the bracket, or continue the list with `,`");
            return self.fail(diag);
        }
        let span = self.span();
        let found = self.describe_next();
        let diag = Diagnostic::error(format!("expected {expected}, found {found}"), span.range())
            .with_label(format!("expected {expected}"))
            .with_optional_help(help);
        self.fail(diag)
    }

    fn describe_next(&mut self) -> String {
        let span = self.span();
        match self.peek() {
            TokenKind::Ident => format!("`{}`", self.text(span)),
            TokenKind::Int | TokenKind::Float(_) => format!("the number `{}`", self.text(span)),
            other => other.describe().to_string(),
        }
    }

    /// Skips the rest of a broken statement: to the next newline at bracket depth 0, to a `;`,
    /// to the graph's `}`, or to a line that clearly starts a new statement (an unclosed bracket
    /// must not swallow the rest of the file).
    fn recover(&mut self) {
        if !self.open.is_empty() && self.at_line_start() && self.starts_statement(self.pos) {
            return;
        }
        let mut depth = self.open.len();
        self.open.clear();
        loop {
            let kind = &self.tokens[self.pos].kind;
            match kind {
                TokenKind::Eof => return,
                TokenKind::RBrace if depth == 0 || self.starts_statement(self.pos) => return,
                TokenKind::Semi => return,
                TokenKind::Newline if depth == 0 => return,
                TokenKind::Newline if self.starts_statement(self.pos + 1) => return,
                k if k.is_open() => depth += 1,
                k if k.is_close() => depth = depth.saturating_sub(1),
                _ => {}
            }
            self.pos += 1;
        }
    }

    /// Whether the line starting at token `i` clearly starts a statement: a statement keyword,
    /// `NAMES = op(`, or the graph's closing `}` alone at the start of a line.
    fn starts_statement(&self, i: usize) -> bool {
        let at_line_start = i == 0 || self.tokens[i - 1].kind == TokenKind::Newline;
        let kind = |j: usize| self.tokens.get(j).map(|t| &t.kind);
        let is_ident = |j: usize| kind(j) == Some(&TokenKind::Ident);
        if !at_line_start {
            return false;
        }
        match kind(i) {
            Some(TokenKind::RBrace) => return true,
            Some(TokenKind::Ident) => {}
            _ => return false,
        }
        let word = self.text(self.tokens[i].span);
        if matches!(word, "input" | "param" | "state" | "assign" | "output") {
            return true;
        }
        if word == "train" && is_ident(i + 1) {
            return true;
        }
        let mut j = i + 1;
        while kind(j) == Some(&TokenKind::Comma) && is_ident(j + 1) {
            j += 2;
        }
        kind(j) == Some(&TokenKind::Equals)
            && is_ident(j + 1)
            && kind(j + 2) == Some(&TokenKind::LParen)
    }

    /// The names a broken statement starting at token `start` seemed to define: the name after
    /// `input`/`param`/`state`, or the names before the first `=`.
    fn names_defined_from(&self, start: usize) -> Vec<Ident> {
        let tokens = &self.tokens[start..self.pos.max(start)];
        let ident = |t: &Token| Ident {
            name: self.text(t.span).to_string(),
            span: t.span,
        };
        let is_name = |t: &&Token| t.kind == TokenKind::Ident && !is_keyword(self.text(t.span));
        match tokens.first() {
            Some(t)
                if self.text(t.span) == "train"
                    && tokens.get(1).is_some_and(|t| t.kind == TokenKind::Ident) =>
            {
                Vec::new()
            }
            Some(t) if matches!(self.text(t.span), "input" | "param" | "state") => tokens
                .get(1)
                .filter(is_name)
                .map(ident)
                .into_iter()
                .collect(),
            Some(t) if is_name(&t) => {
                match tokens.iter().position(|t| t.kind == TokenKind::Equals) {
                    Some(eq) => tokens[..eq].iter().filter(is_name).map(ident).collect(),
                    None => vec![ident(t)],
                }
            }
            _ => Vec::new(),
        }
    }

    /// Enters a nested call or list.
    fn enter(&mut self) -> PResult<()> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            let span = self.span();
            let diag = Diagnostic::error(
                format!("expression nested more than {MAX_NESTING} levels deep"),
                span.range(),
            )
            .with_label("too deep")
            .with_help("name intermediate values with separate statements");
            return self.fail(diag);
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }
}

fn is_keyword(name: &str) -> bool {
    KEYWORDS.contains(&name)
}

// The file and its statements.
impl<'a> Parser<'a> {
    fn file(&mut self) -> File {
        self.skip_separators();
        let starts_with_graph = self.peek_ident() == Some("graph");
        let header = self.header();
        let name = match &header {
            Ok((name, _)) => name.name.clone(),
            Err(Stop) => {
                // A broken header line is skipped; a missing one leaves the statements to parse.
                if starts_with_graph {
                    self.skip_line_through_brace();
                }
                String::new()
            }
        };
        let mut stmts = Vec::new();
        loop {
            self.skip_separators();
            match self.peek() {
                TokenKind::RBrace => {
                    self.bump();
                    break;
                }
                TokenKind::Eof => {
                    if let Ok((_, brace)) = header {
                        self.missing_close_brace(brace);
                    }
                    return File { name, stmts };
                }
                _ => stmts.push(self.statement_or_recover()),
            }
        }
        self.trailing_text();
        File { name, stmts }
    }

    fn skip_separators(&mut self) {
        while matches!(
            self.tokens[self.pos].kind,
            TokenKind::Newline | TokenKind::Semi
        ) {
            self.pos += 1;
        }
    }

    /// `graph NAME {`; returns the name and the span of `{`.
    fn header(&mut self) -> PResult<(Ident, Span)> {
        if self.peek_ident() != Some("graph") {
            let help = "a .sir file is one graph: `graph NAME { ... }`".to_string();
            return self.unexpected_with("`graph`", Some(help));
        }
        self.bump();
        let name = self.name("the graph's name")?;
        if *self.peek() != TokenKind::LBrace {
            return self.unexpected("`{` after the graph's name");
        }
        let brace = self.bump().span;
        Ok((name, brace))
    }

    /// After a broken header: skip its line, and a `{` on it.
    fn skip_line_through_brace(&mut self) {
        loop {
            match self.tokens[self.pos].kind {
                TokenKind::Eof | TokenKind::Newline => return,
                TokenKind::LBrace => {
                    self.pos += 1;
                    return;
                }
                _ => self.pos += 1,
            }
        }
    }

    fn missing_close_brace(&mut self, brace: Span) {
        let end = self.prev_end();
        let diag = Diagnostic::error("the graph is not closed", end..end)
            .with_label("expected `}` after this")
            .with_secondary(brace.range(), "the graph opens here");
        self.diags.push(diag);
    }

    fn trailing_text(&mut self) {
        self.skip_separators();
        if *self.peek() == TokenKind::Eof || *self.peek() == TokenKind::Error {
            return;
        }
        let span = self.span().range();
        let diag = if self.peek_ident() == Some("graph") {
            Diagnostic::error("a .sir file holds exactly one graph", span)
                .with_label("a second graph")
                .with_help("put each graph in its own file")
        } else {
            Diagnostic::error("unexpected text after the graph", span)
                .with_label("after the closing `}`")
                .with_help("statements go inside `graph NAME { ... }`")
        };
        self.diags.push(diag);
    }

    fn statement_or_recover(&mut self) -> Stmt {
        let start = self.pos;
        self.open.clear();
        self.depth = 0;
        let train = self.at_train().then(|| self.span());
        let result = self.statement();
        let stmt = match result {
            Ok(stmt) => stmt,
            Err(Stop) => {
                self.recover();
                return Stmt::Broken {
                    defines: self.names_defined_from(start),
                    train,
                };
            }
        };
        if !matches!(
            self.peek(),
            TokenKind::Newline | TokenKind::Semi | TokenKind::RBrace | TokenKind::Eof
        ) {
            let help = Some("put one statement per line, or separate them with `;`".to_string());
            let _ = self.unexpected_with::<()>("the end of the statement", help);
            self.recover();
        }
        stmt
    }

    fn statement(&mut self) -> PResult<Stmt> {
        let Some(word) = self.peek_ident() else {
            let help = "statements are `input`, `param`, `state`, `NAME = op(...)`, `assign`, \
                        `output` and `train`";
            return self.unexpected_with("a statement", Some(help.to_string()));
        };
        let word = word.to_string();
        if is_keyword(&word) && matches!(self.peek_second(), TokenKind::Equals | TokenKind::Comma) {
            return self.keyword_as_name();
        }
        if self.at_train() {
            return self.train();
        }
        match word.as_str() {
            "input" => self.decl(DeclKind::Input),
            "param" => self.decl(DeclKind::Param),
            "state" => self.decl(DeclKind::State),
            "assign" => self.assign(),
            "output" => self.output(),
            "graph" => {
                let span = self.span();
                let diag = Diagnostic::error("graphs do not nest", span.range())
                    .with_label("inside another graph")
                    .with_help("a .sir file holds exactly one graph");
                self.fail(diag)
            }
            _ => self.let_stmt(),
        }
    }

    fn keyword_as_name<T>(&mut self) -> PResult<T> {
        let span = self.span();
        let word = self.text(span).to_string();
        let diag = Diagnostic::error(
            format!("`{word}` is a keyword and cannot name a value"),
            span.range(),
        )
        .with_label("keyword")
        .with_help(format!("pick another name, such as `{word}_`"));
        self.fail(diag)
    }

    /// A name in a defining or referring position (not a keyword, not a literal word).
    fn name(&mut self, what: &str) -> PResult<Ident> {
        let Some(text) = self.peek_ident() else {
            return self.unexpected(what);
        };
        if is_keyword(text) {
            return self.keyword_as_name();
        }
        if matches!(text, "inf" | "nan") {
            let span = self.span();
            let diag = Diagnostic::error(
                format!("`{}` is a number, not a name", self.text(span)),
                span.range(),
            )
            .with_label("reserved for the literal")
            .with_help("pick another name");
            return self.fail(diag);
        }
        let token = self.bump();
        Ok(Ident {
            name: self.text(token.span).to_string(),
            span: token.span,
        })
    }

    /// `input NAME: TYPE`, `param NAME: TYPE = INIT`, `state NAME: TYPE = INIT`.
    fn decl(&mut self, kind: DeclKind) -> PResult<Stmt> {
        self.bump();
        let name = self.name(&format!("a name after `{}`", kind.keyword()))?;
        if *self.peek() != TokenKind::Colon {
            let help = format!(
                "declare it as `{} {}: f32[2, 3]`",
                kind.keyword(),
                name.name
            );
            return self.unexpected_with("`:` and a type", Some(help));
        }
        self.bump();
        let ty = self.type_expr()?;
        let init = if *self.peek() == TokenKind::Equals {
            self.bump();
            Some(self.expr()?)
        } else {
            None
        };
        Ok(Stmt::Decl {
            kind,
            name,
            ty,
            init,
        })
    }

    /// `N1, N2 = expr`.
    fn let_stmt(&mut self) -> PResult<Stmt> {
        let mut names = vec![self.name("a name")?];
        while *self.peek() == TokenKind::Comma {
            self.bump();
            names.push(self.name("a name after `,`")?);
        }
        if *self.peek() == TokenKind::LParen && names.len() == 1 {
            let op = &names[0].name;
            let span = names[0].span;
            let diag =
                Diagnostic::error(format!("the result of `{op}` needs a name"), span.range())
                    .with_label("a call on its own")
                    .with_help(format!("name its results: `y = {op}(...)`"));
            return self.fail(diag);
        }
        if *self.peek() != TokenKind::Equals {
            let help = "name an op's results: `y = relu(x)` or `a, b = grad(loss, w1, w2)`";
            return self.unexpected_with("`=`", Some(help.to_string()));
        }
        self.bump();
        let expr = self.expr()?;
        Ok(Stmt::Let { names, expr })
    }

    /// `assign TARGET = SOURCE`.
    fn assign(&mut self) -> PResult<Stmt> {
        self.bump();
        let target = self.name("the param or state to assign")?;
        if *self.peek() != TokenKind::Equals {
            let help = format!("write `assign {} = new_value`", target.name);
            return self.unexpected_with("`=`", Some(help));
        }
        self.bump();
        let source = self.expr()?;
        Ok(Stmt::Assign { target, source })
    }

    /// Whether the next statement is a `train` statement: `train` is a keyword only where a
    /// statement starts and it is not followed by `=` or `,` (so `train = relu(x)` still names a
    /// value `train`).
    fn at_train(&mut self) -> bool {
        self.peek_ident() == Some("train")
            && !matches!(self.peek_second(), TokenKind::Equals | TokenKind::Comma)
    }

    /// `train LOSS with OPT(name=value, ..., params=[P1, ...])`.
    fn train(&mut self) -> PResult<Stmt> {
        let keyword = self.bump().span;
        let usage =
            "write `train loss with adamw(lr=1e-3)`; the optimizers are sgd, adam and adamw";
        if self.peek_ident().is_none() {
            return self.missing("the name of the loss after `train`", usage.into());
        }
        if self.peek_ident() == Some("with") && *self.peek_second() == TokenKind::Ident {
            let span = self.span();
            let diag = Diagnostic::error(
                "`train` needs the name of the loss before `with`",
                span.range(),
            )
            .with_label("the loss is missing")
            .with_help(usage);
            return self.fail(diag);
        }
        let loss = self.name("the name of the loss after `train`")?;
        if *self.peek() == TokenKind::LParen {
            let diag = Diagnostic::error(
                "`train` takes the name of the loss, not a call",
                loss.span.range(),
            )
            .with_label("a call")
            .with_help(format!(
                "name the loss first: `loss = {}(...)`, then `train loss with ...`",
                loss.name
            ));
            return self.fail(diag);
        }
        if self.peek_ident() != Some("with") {
            let help = format!(
                "write `train {} with adamw(lr=1e-3)`; the optimizers are sgd, adam and adamw",
                loss.name
            );
            return self.missing("`with` and an optimizer", help);
        }
        self.bump();
        if self.peek_ident().is_none() {
            return self.missing("an optimizer (sgd, adam or adamw)", usage.into());
        }
        let optimizer = self.name("an optimizer (sgd, adam or adamw)")?;
        if *self.peek() != TokenKind::LParen {
            let help = format!(
                "write `{0}()` for the defaults, or `{0}(lr=...)`",
                optimizer.name
            );
            return self.missing("`(` after the optimizer", help);
        }
        self.open_bracket();
        let mut attrs = Vec::new();
        let mut params: Option<ParamList> = None;
        let mut no_decay: Option<ParamList> = None;
        let mut lr_scaled: Option<ParamList> = None;
        loop {
            if self.at_line_start() && self.starts_statement(self.pos) {
                return self.unexpected("`)`");
            }
            match self.peek().clone() {
                TokenKind::RParen => break,
                TokenKind::Ident if *self.peek_second() == TokenKind::Equals => {
                    let listed = match self.peek_ident() {
                        Some("params") => Some("params"),
                        Some("no_decay") if *self.peek_third() == TokenKind::LBracket => {
                            Some("no_decay")
                        }
                        Some("lr_scaled") => Some("lr_scaled"),
                        _ => None,
                    };
                    if let Some(key) = listed {
                        let list = self.param_list()?;
                        let slot = match key {
                            "params" => &mut params,
                            "no_decay" => &mut no_decay,
                            _ => &mut lr_scaled,
                        };
                        if let Some(first) = slot {
                            let diag = Diagnostic::error(
                                format!("`{key}` is given twice"),
                                list.span.range(),
                            )
                            .with_label("given again")
                            .with_secondary(first.span.range(), "first given here");
                            return self.fail(diag);
                        }
                        *slot = Some(list);
                    } else {
                        attrs.push(self.attr_arg()?);
                    }
                }
                _ => {
                    let help = "the optimizer takes attributes only: the loss comes before `with` \
                                and the params to train are `params=[w1, w2]`";
                    return self
                        .unexpected_with("an attribute such as `lr=1e-3`", Some(help.to_string()));
                }
            }
            match self.peek() {
                TokenKind::Comma => {
                    self.bump();
                }
                TokenKind::RParen => break,
                _ => return self.unexpected("`,` or `)`"),
            }
        }
        let end = self.close_bracket();
        Ok(Stmt::Train(Train {
            keyword,
            loss,
            optimizer,
            attrs,
            params,
            no_decay,
            lr_scaled,
            span: keyword.to(end),
        }))
    }

    /// "expected X, found Y"; when Y ends the statement, the caret goes right after the last
    /// token (where X is missing) rather than on the line break.
    fn missing<T>(&mut self, expected: &str, help: String) -> PResult<T> {
        let at_end = matches!(
            self.peek(),
            TokenKind::Newline | TokenKind::Semi | TokenKind::RBrace | TokenKind::Eof
        );
        if !at_end || !self.open.is_empty() {
            return self.unexpected_with(expected, Some(help));
        }
        let end = self.prev_end();
        let found = self.describe_next();
        let diag = Diagnostic::error(format!("expected {expected}, found {found}"), end..end)
            .with_label(format!("expected {expected} here"))
            .with_help(help);
        self.fail(diag)
    }

    /// `params=[P1, P2, ...]` (or `no_decay=[...]`, `lr_scaled=[...]`) inside a `train`
    /// statement's optimizer call.
    fn param_list(&mut self) -> PResult<ParamList> {
        let start = self.bump().span; // `params`, `no_decay` or `lr_scaled`
        self.bump(); // `=`
        if *self.peek() != TokenKind::LBracket {
            let help = "list the params to train by name: `params=[w1, b1]`".to_string();
            return self.unexpected_with("`[` and a list of params", Some(help));
        }
        self.open_bracket();
        let mut names = Vec::new();
        while *self.peek() != TokenKind::RBracket {
            names.push(self.name("the name of a param")?);
            match self.peek() {
                TokenKind::Comma => {
                    self.bump();
                }
                TokenKind::RBracket => {}
                _ => return self.unexpected("`,` or `]`"),
            }
        }
        let end = self.close_bracket();
        Ok(ParamList {
            names,
            span: start.to(end),
        })
    }

    /// `output N1, N2, ...`.
    fn output(&mut self) -> PResult<Stmt> {
        self.bump();
        let mut names = Vec::new();
        loop {
            let name = self.name("a name to output")?;
            if *self.peek() == TokenKind::LParen {
                let diag = Diagnostic::error("`output` takes names, not calls", name.span.range())
                    .with_label("a call")
                    .with_help(format!(
                        "name the value first: `y = {}(...)`, then `output y`",
                        name.name
                    ));
                return self.fail(diag);
            }
            names.push(name);
            if *self.peek() != TokenKind::Comma {
                return Ok(Stmt::Output { names });
            }
            self.bump();
        }
    }
}

// Types.
impl<'a> Parser<'a> {
    /// `f32[d0, d1, ...]`; `f32[]` is a scalar.
    fn type_expr(&mut self) -> PResult<TypeExpr> {
        let Some(dtype_name) = self.peek_ident() else {
            return self.unexpected("a type such as `f32[2, 3]`");
        };
        let dtype_name = dtype_name.to_string();
        let start = self.span();
        let Some(dtype) = DType::from_name(&dtype_name) else {
            let names = DType::ALL.map(DType::name);
            let diag = Diagnostic::error(format!("unknown dtype `{dtype_name}`"), start.range())
                .with_label("not a dtype")
                .with_optional_help(did_you_mean(&dtype_name, names))
                .with_help(format!("the dtypes are {}", names.join(", ")));
            return self.fail(diag);
        };
        self.bump();
        if *self.peek() != TokenKind::LBracket {
            let help =
                format!("write the shape in brackets: `{dtype}[2, 3]`; a scalar is `{dtype}[]`");
            return self.unexpected_with("`[` and a shape", Some(help));
        }
        self.open_bracket();
        let mut shape = Vec::new();
        while *self.peek() != TokenKind::RBracket {
            shape.push(self.extent()?);
            match self.peek() {
                TokenKind::Comma => {
                    self.bump();
                }
                TokenKind::RBracket => {}
                _ => return self.unexpected("`,` or `]`"),
            }
        }
        let end = self.close_bracket();
        let span = start.to(end);
        let ty = TensorType::new(dtype, shape);
        if ty.checked_size_bytes().is_none() {
            let diag = Diagnostic::error(format!("`{ty}` is too large"), span.range())
                .with_label("its size in bytes does not fit in 64 bits");
            return self.fail(diag);
        }
        Ok(TypeExpr { ty, span })
    }

    /// One extent of a shape: a positive integer.
    fn extent(&mut self) -> PResult<usize> {
        let span = self.span();
        let kind = self.peek().clone();
        let bad = |message: String, label: &str| {
            Diagnostic::error(message, span.range()).with_label(label.to_string())
        };
        let help = "extents are integers of at least 1; a scalar is written `f32[]`";
        match kind {
            TokenKind::Int => {
                self.bump();
                match self.text(span).parse::<usize>() {
                    Ok(0) => {
                        let diag = bad("a shape extent cannot be 0".into(), "zero extent");
                        self.fail(diag.with_help("empty tensors are not supported"))
                    }
                    Ok(d) => Ok(d),
                    Err(_) => self.fail(bad(
                        format!("extent `{}` is too large", self.text(span)),
                        "does not fit in 64 bits",
                    )),
                }
            }
            TokenKind::Minus => {
                let diag = bad("a shape extent cannot be negative".into(), "negative");
                self.fail(diag.with_help(help))
            }
            TokenKind::Float(_) => {
                let diag = bad(
                    format!("extent `{}` is not an integer", self.text(span)),
                    "not an integer",
                );
                self.fail(diag.with_help(help))
            }
            _ => self.unexpected("an extent (a positive integer)"),
        }
    }
}

// Expressions and attribute values.
impl<'a> Parser<'a> {
    /// An operand: a name, a number (`-` allowed), `inf`, or a call.
    fn expr(&mut self) -> PResult<Expr> {
        self.enter()?;
        let expr = self.expr_inner()?;
        self.leave();
        Ok(expr)
    }

    fn expr_inner(&mut self) -> PResult<Expr> {
        let span = self.span();
        match self.peek().clone() {
            TokenKind::Int | TokenKind::Float(_) | TokenKind::Minus => {
                self.number().map(Expr::Number)
            }
            TokenKind::Ident => match self.text(span) {
                "inf" => self.number().map(Expr::Number),
                "true" | "false" => self.fail(
                    Diagnostic::error("a boolean is not an operand", span.range())
                        .with_label("not a value")
                        .with_help("booleans are attribute values: `name=true`"),
                ),
                _ if *self.peek_second() == TokenKind::LParen => {
                    let op = self.name("an op name")?;
                    self.call(op).map(Expr::Call)
                }
                _ => self.name("an operand").map(Expr::Name),
            },
            TokenKind::Str(_) | TokenKind::LBracket => {
                let what = if matches!(self.peek(), TokenKind::Str(_)) {
                    "a string"
                } else {
                    "a list"
                };
                self.fail(
                    Diagnostic::error(format!("{what} is not an operand"), span.range())
                        .with_label("not a value")
                        .with_help(
                            "strings and lists are attribute values: \
                             `name=value` after the operands",
                        ),
                )
            }
            _ => self.unexpected("an operand (a name, a number or a call)"),
        }
    }

    /// A numeric literal operand: `3`, `-0.5`, `1e-3`, `inf`, `-inf`.
    fn number(&mut self) -> PResult<Number> {
        let start = self.span();
        let negative = *self.peek() == TokenKind::Minus;
        if negative {
            self.bump();
        }
        let span = self.span();
        let magnitude = match self.peek().clone() {
            TokenKind::Float(v) => v,
            TokenKind::Int => self.text(span).parse::<f64>().unwrap_or(f64::INFINITY),
            TokenKind::Ident if self.text(span) == "inf" => f64::INFINITY,
            _ => return self.minus_without_number(),
        };
        if magnitude.is_infinite() && self.text(span) != "inf" {
            let diag = Diagnostic::error(
                format!("number `{}` is out of range", self.text(span)),
                span.range(),
            )
            .with_label("does not fit in an f64");
            return self.fail(diag);
        }
        self.bump();
        let value = if negative { -magnitude } else { magnitude };
        Ok(Number {
            value,
            span: start.to(span),
        })
    }

    fn minus_without_number<T>(&mut self) -> PResult<T> {
        let help =
            Some("`-` only negates number literals; use neg(x) to negate a value".to_string());
        self.unexpected_with("a number after `-`", help)
    }

    /// `op(operands..., attrs...)`; the op name is already read.
    fn call(&mut self, op: Ident) -> PResult<Call> {
        self.open_bracket();
        let mut operands = Vec::new();
        let mut attrs: Vec<AttrArg> = Vec::new();
        loop {
            if self.at_line_start() && self.starts_statement(self.pos) {
                // `y = f(x,` followed by a new statement: a missing `)`, not an attribute.
                return self.unexpected("`)`");
            }
            match self.peek().clone() {
                TokenKind::RParen => break,
                TokenKind::Ident if *self.peek_second() == TokenKind::Equals => {
                    attrs.push(self.attr_arg()?);
                }
                _ => {
                    let operand = self.expr()?;
                    if let Some(first) = attrs.first() {
                        let diag = Diagnostic::error(
                            "operands must come before attributes",
                            operand.span().range(),
                        )
                        .with_label("operand after an attribute")
                        .with_secondary(first.span.range(), "first attribute")
                        .with_help(format!("write `{}(operands..., name=value, ...)`", op.name));
                        return self.fail(diag);
                    }
                    operands.push(operand);
                }
            }
            match self.peek() {
                TokenKind::Comma => {
                    self.bump();
                }
                TokenKind::RParen => break,
                _ => return self.unexpected("`,` or `)`"),
            }
        }
        let end = self.close_bracket();
        Ok(Call {
            span: op.span.to(end),
            op,
            operands,
            attrs,
        })
    }

    /// `name=value`.
    fn attr_arg(&mut self) -> PResult<AttrArg> {
        let name = self.name("an attribute name")?;
        self.bump(); // `=`
        let (value, value_span) = self.attr_value()?;
        Ok(AttrArg {
            span: name.span.to(value_span),
            name,
            value,
        })
    }

    /// An attribute value: int, float, `inf`, string, `true`/`false`, or a list of values.
    fn attr_value(&mut self) -> PResult<(AttrValue, Span)> {
        self.enter()?;
        let value = self.attr_value_inner()?;
        self.leave();
        Ok(value)
    }

    fn attr_value_inner(&mut self) -> PResult<(AttrValue, Span)> {
        let span = self.span();
        match self.peek().clone() {
            TokenKind::Str(s) => {
                self.bump();
                Ok((AttrValue::Str(s), span))
            }
            TokenKind::LBracket => self.attr_list(),
            TokenKind::Int => self.attr_int(false),
            TokenKind::Minus if *self.peek_second() == TokenKind::Int => {
                self.bump();
                let (value, end) = self.attr_int(true)?;
                Ok((value, span.to(end)))
            }
            TokenKind::Float(_) | TokenKind::Minus => {
                let n = self.number()?;
                Ok((AttrValue::Float(n.value), n.span))
            }
            TokenKind::Ident => match self.text(span) {
                "true" => {
                    self.bump();
                    Ok((AttrValue::Bool(true), span))
                }
                "false" => {
                    self.bump();
                    Ok((AttrValue::Bool(false), span))
                }
                "inf" => {
                    let n = self.number()?;
                    Ok((AttrValue::Float(n.value), n.span))
                }
                word => {
                    let help = if DType::from_name(word).is_some() {
                        format!("a dtype is written as a string: \"{word}\"")
                    } else {
                        "attribute values are numbers, strings in quotes, \
                         true/false or lists `[...]`"
                            .to_string()
                    };
                    self.unexpected_with("an attribute value", Some(help))
                }
            },
            _ => self.unexpected("an attribute value"),
        }
    }

    /// An int attribute value: any magnitude that fits in 64 bits, with its sign.
    fn attr_int(&mut self, negative: bool) -> PResult<(AttrValue, Span)> {
        let span = self.bump().span;
        let text = self.text(span);
        match text.parse::<u64>() {
            Ok(m) => {
                let m = i128::from(m);
                Ok((AttrValue::Int(if negative { -m } else { m }), span))
            }
            Err(_) => {
                let diag = Diagnostic::error(
                    format!("integer `{text}` does not fit in 64 bits"),
                    span.range(),
                )
                .with_label("too large");
                self.fail(diag)
            }
        }
    }

    /// `[v, v, ...]`, possibly empty or nested.
    fn attr_list(&mut self) -> PResult<(AttrValue, Span)> {
        let start = self.span();
        self.open_bracket();
        let mut items = Vec::new();
        while *self.peek() != TokenKind::RBracket {
            items.push(self.attr_value()?.0);
            match self.peek() {
                TokenKind::Comma => {
                    self.bump();
                }
                TokenKind::RBracket => {}
                _ => return self.unexpected("`,` or `]`"),
            }
        }
        let end = self.close_bracket();
        Ok((AttrValue::List(items), start.to(end)))
    }
}
