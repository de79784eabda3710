//! Source text → [`Spec`]. pest recognises the text; this module builds the
//! tree, resolves operator precedence and turns pest's errors into
//! [`SyntaxError`]s that say what was expected in words.

use crate::ast::*;
use pest::error::{ErrorVariant, InputLocation};
use pest::iterators::Pair;
use pest::Parser as _;

#[derive(pest_derive::Parser)]
#[grammar = "attn.pest"]
struct AttnParser;

/// Specs larger than this are refused before parsing.
pub const MAX_SOURCE_BYTES: usize = 1 << 20;
/// Brackets nested deeper than this are refused before parsing.
pub const MAX_NESTING: usize = 64;
/// Expressions whose tree is deeper than this are refused.
pub const MAX_EXPR_DEPTH: usize = 256;

/// Why a text is not a spec.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SyntaxError {
    pub kind: SyntaxErrorKind,
    pub message: String,
    pub span: Span,
    pub hint: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyntaxErrorKind {
    /// The text does not follow the grammar.
    Unexpected,
    /// A number literal that does not fit its type.
    BadNumber,
    /// The input is too large or nested too deeply to be processed safely.
    TooLarge,
}

/// Parse a whole `.attn` file.
pub fn parse(source: &str) -> Result<Spec, SyntaxError> {
    check_limits(source)?;
    let mut pairs = AttnParser::parse(Rule::file, source).map_err(|e| convert_error(source, e))?;
    let file = pairs.next().expect("pest yields the `file` rule");
    let mut inner = file.into_inner();
    let header = inner.next().expect("grammar: file starts with a header");
    let name = ident(header.into_inner().nth(1).expect("grammar: header has a name"));
    let mut items = Vec::new();
    for pair in inner {
        if pair.as_rule() == Rule::EOI {
            break;
        }
        items.push(item(pair)?);
    }
    Ok(Spec { name, items })
}

/// Parse a single expression (used for `--set NAME=VALUE` values).
pub fn parse_expr(source: &str) -> Result<Expr, SyntaxError> {
    check_limits(source)?;
    let mut pairs = AttnParser::parse(Rule::expr, source).map_err(|e| convert_error(source, e))?;
    let pair = pairs.next().expect("pest yields the `expr` rule");
    let end = pair.as_span().end();
    if source[end..].trim().is_empty() {
        expr(pair)
    } else {
        Err(SyntaxError {
            kind: SyntaxErrorKind::Unexpected,
            message: format!("unexpected `{}` after the expression", source[end..].trim()),
            span: Span::new(end, source.len()),
            hint: None,
        })
    }
}

fn check_limits(source: &str) -> Result<(), SyntaxError> {
    if source.len() > MAX_SOURCE_BYTES {
        return Err(SyntaxError {
            kind: SyntaxErrorKind::TooLarge,
            message: format!("spec is {} bytes; the limit is {} bytes", source.len(), MAX_SOURCE_BYTES),
            span: Span::new(0, 0),
            hint: Some("split the computation into smaller specs".into()),
        });
    }
    // Count bracket nesting outside comments and strings, so that pest's
    // recursive descent can never overflow the stack.
    let bytes = source.as_bytes();
    let (mut depth, mut i) = (0usize, 0usize);
    while i < bytes.len() {
        match bytes[i] {
            b'#' => i = skip_line(bytes, i),
            b'/' if bytes.get(i + 1) == Some(&b'/') => i = skip_line(bytes, i),
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'(' | b'[' | b'{' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Err(SyntaxError {
                        kind: SyntaxErrorKind::TooLarge,
                        message: format!("brackets nested more than {MAX_NESTING} deep"),
                        span: Span::new(i, i + 1),
                        hint: Some("name intermediate results with `let`".into()),
                    });
                }
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

fn skip_line(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && bytes[i] != b'\n' {
        i += 1;
    }
    i
}

fn span_of(pair: &Pair<Rule>) -> Span {
    let s = pair.as_span();
    Span::new(s.start(), s.end())
}

fn ident(pair: Pair<Rule>) -> Ident {
    debug_assert_eq!(pair.as_rule(), Rule::ident);
    Ident { name: pair.as_str().to_string(), span: span_of(&pair) }
}

fn item(pair: Pair<Rule>) -> Result<Item, SyntaxError> {
    let span = span_of(&pair);
    let rule = pair.as_rule();
    let mut inner = pair.into_inner();
    let keyword = inner.next().expect("grammar: items start with a keyword");
    let kind = match rule {
        Rule::param => {
            let name = ident(inner.next().unwrap());
            let ty = ty(inner.next().unwrap());
            let default = inner.next().map(expr).transpose()?;
            ItemKind::Param { name, ty, default }
        }
        Rule::dim_decl => {
            let name = ident(inner.next().unwrap());
            let default = inner.next().map(expr).transpose()?;
            ItemKind::Dim { name, default }
        }
        Rule::input => {
            let weight = keyword.as_str() == "weight";
            let name = ident(inner.next().unwrap());
            let shape_pair = inner.next().unwrap();
            let shape_span = span_of(&shape_pair);
            let shape = shape_pair.into_inner().map(expr).collect::<Result<_, _>>()?;
            let (mut domain, mut init) = (None, None);
            for clause in inner {
                let rule = clause.as_rule();
                let value = expr(clause.into_inner().last().unwrap())?;
                if rule == Rule::domain {
                    domain = Some(value);
                } else {
                    init = Some(value);
                }
            }
            ItemKind::Input { name, weight, shape, shape_span, domain, init }
        }
        Rule::let_stmt | Rule::output => {
            let name = ident(inner.next().unwrap());
            let value = expr(inner.next().unwrap())?;
            if rule == Rule::let_stmt {
                ItemKind::Let { name, value }
            } else {
                ItemKind::Output { name, value }
            }
        }
        Rule::require => {
            let cond = expr(inner.next().unwrap())?;
            let message = inner.next().map(|s| {
                let text = s.as_str();
                text[1..text.len() - 1].to_string()
            });
            ItemKind::Require { cond, message }
        }
        other => unreachable!("grammar: unexpected item rule {other:?}"),
    };
    Ok(Item { kind, span })
}

fn ty(pair: Pair<Rule>) -> Type {
    let span = span_of(&pair);
    let mut inner = pair.into_inner();
    let base = inner.next().unwrap();
    let optional = inner.next().is_some();
    let kind = match base.as_rule() {
        Rule::prim_ty => TypeKind::Prim(prim(base.as_str())),
        Rule::list_ty => TypeKind::List(prim(base.into_inner().next().unwrap().as_str())),
        Rule::enum_ty => TypeKind::Enum(
            base.into_inner()
                .map(|v| {
                    let inner = v.into_inner().next().unwrap();
                    Ident { name: inner.as_str().to_string(), span: span_of(&inner) }
                })
                .collect(),
        ),
        other => unreachable!("grammar: unexpected type rule {other:?}"),
    };
    Type { kind, optional, span }
}

fn prim(text: &str) -> Prim {
    match text {
        "int" => Prim::Int,
        "float" => Prim::Float,
        _ => Prim::Bool,
    }
}

/// Operator-precedence parsing of the flat `prefix* primary (infix prefix* primary)*`
/// sequence, without recursion over the operator chain.
fn expr(pair: Pair<Rule>) -> Result<Expr, SyntaxError> {
    let whole = span_of(&pair);
    let mut operands: Vec<(Expr, usize)> = Vec::new();
    let mut operators: Vec<BinOp> = Vec::new();
    let mut prefixes: Vec<(UnOp, usize)> = Vec::new();
    for p in pair.into_inner() {
        let op = match p.as_rule() {
            Rule::neg => {
                prefixes.push((UnOp::Neg, p.as_span().start()));
                continue;
            }
            Rule::not => {
                prefixes.push((UnOp::Not, p.as_span().start()));
                continue;
            }
            Rule::or => BinOp::Or,
            Rule::and => BinOp::And,
            Rule::eq => BinOp::Eq,
            Rule::ne => BinOp::Ne,
            Rule::le => BinOp::Le,
            Rule::ge => BinOp::Ge,
            Rule::lt => BinOp::Lt,
            Rule::gt => BinOp::Gt,
            Rule::add => BinOp::Add,
            Rule::sub => BinOp::Sub,
            Rule::mul => BinOp::Mul,
            Rule::div => BinOp::Div,
            Rule::rem => BinOp::Rem,
            Rule::matmul => BinOp::MatMul,
            _ => {
                let (mut e, mut depth) = primary(p)?;
                while let Some((op, start)) = prefixes.pop() {
                    let span = Span::new(start, e.span.end);
                    e = Expr { kind: ExprKind::Unary(op, Box::new(e)), span };
                    depth += 1;
                }
                check_depth(depth, whole)?;
                operands.push((e, depth));
                continue;
            }
        };
        while operators.last().is_some_and(|top| top.precedence() >= op.precedence()) {
            reduce(&mut operands, &mut operators, whole)?;
        }
        operators.push(op);
    }
    while !operators.is_empty() {
        reduce(&mut operands, &mut operators, whole)?;
    }
    Ok(operands.pop().expect("grammar: an expression has an operand").0)
}

fn reduce(operands: &mut Vec<(Expr, usize)>, operators: &mut Vec<BinOp>, whole: Span) -> Result<(), SyntaxError> {
    let op = operators.pop().unwrap();
    let (b, db) = operands.pop().unwrap();
    let (a, da) = operands.pop().unwrap();
    let depth = da.max(db) + 1;
    check_depth(depth, whole)?;
    let span = a.span.to(b.span);
    operands.push((Expr { kind: ExprKind::Binary(op, Box::new(a), Box::new(b)), span }, depth));
    Ok(())
}

fn check_depth(depth: usize, span: Span) -> Result<(), SyntaxError> {
    if depth > MAX_EXPR_DEPTH {
        return Err(SyntaxError {
            kind: SyntaxErrorKind::TooLarge,
            message: format!("expression nested more than {MAX_EXPR_DEPTH} operators deep"),
            span,
            hint: Some("name intermediate results with `let`".into()),
        });
    }
    Ok(())
}

/// A primary expression and the depth of its tree.
fn primary(pair: Pair<Rule>) -> Result<(Expr, usize), SyntaxError> {
    let span = span_of(&pair);
    let leaf = |kind| Ok((Expr { kind, span }, 1));
    match pair.as_rule() {
        Rule::number => leaf(number(pair.as_str(), span)?),
        Rule::kw_none => leaf(ExprKind::None),
        Rule::kw_true => leaf(ExprKind::Bool(true)),
        Rule::kw_false => leaf(ExprKind::Bool(false)),
        Rule::ident => leaf(ExprKind::Name(pair.as_str().to_string())),
        Rule::expr => {
            // Parentheses: keep the inner tree, widen nothing (printing re-adds them).
            let e = expr(pair)?;
            let depth = depth_of(&e);
            Ok((e, depth))
        }
        Rule::if_expr => {
            let mut parts = pair.into_inner().filter(|p| p.as_rule() == Rule::expr);
            let (c, a, b) = (expr(parts.next().unwrap())?, expr(parts.next().unwrap())?, expr(parts.next().unwrap())?);
            let depth = 1 + depth_of(&c).max(depth_of(&a)).max(depth_of(&b));
            Ok((Expr { kind: ExprKind::If(Box::new(c), Box::new(a), Box::new(b)), span }, depth))
        }
        Rule::list => {
            let items: Vec<Expr> = pair.into_inner().map(expr).collect::<Result<_, _>>()?;
            let depth = 1 + items.iter().map(depth_of).max().unwrap_or(0);
            Ok((Expr { kind: ExprKind::List(items), span }, depth))
        }
        Rule::call => {
            let mut inner = pair.into_inner();
            let func = ident(inner.next().unwrap());
            let mut args = Vec::new();
            for a in inner {
                if a.as_rule() == Rule::kwarg {
                    let mut kv = a.into_inner();
                    let name = ident(kv.next().unwrap());
                    args.push(Arg { name: Some(name), value: expr(kv.next().unwrap())? });
                } else {
                    args.push(Arg { name: None, value: expr(a)? });
                }
            }
            let depth = 1 + args.iter().map(|a| depth_of(&a.value)).max().unwrap_or(0);
            Ok((Expr { kind: ExprKind::Call { func, args }, span }, depth))
        }
        Rule::lambda => {
            let mut params = vec![];
            let mut body = None;
            for p in pair.into_inner() {
                match p.as_rule() {
                    Rule::ident => params.push(ident(p)),
                    _ => body = Some(expr(p)?),
                }
            }
            let body = body.expect("grammar: a lambda has a body");
            let depth = 1 + depth_of(&body);
            Ok((Expr { kind: ExprKind::Lambda { params, body: Box::new(body) }, span }, depth))
        }
        Rule::index => {
            let mut inner = pair.into_inner();
            let base = ident(inner.next().unwrap());
            let indices: Vec<Expr> = inner.map(expr).collect::<Result<_, _>>()?;
            let depth = 1 + indices.iter().map(depth_of).max().unwrap_or(0);
            Ok((Expr { kind: ExprKind::Index { base, indices }, span }, depth))
        }
        other => unreachable!("grammar: unexpected primary {other:?}"),
    }
}

/// Depth of an already-built (hence bounded) tree.
fn depth_of(e: &Expr) -> usize {
    match &e.kind {
        ExprKind::List(items) => 1 + items.iter().map(depth_of).max().unwrap_or(0),
        ExprKind::Unary(_, x) => 1 + depth_of(x),
        ExprKind::Binary(_, a, b) => 1 + depth_of(a).max(depth_of(b)),
        ExprKind::Call { args, .. } => 1 + args.iter().map(|a| depth_of(&a.value)).max().unwrap_or(0),
        ExprKind::If(c, a, b) => 1 + depth_of(c).max(depth_of(a)).max(depth_of(b)),
        ExprKind::Lambda { body, .. } => 1 + depth_of(body),
        ExprKind::Index { indices, .. } => 1 + indices.iter().map(depth_of).max().unwrap_or(0),
        _ => 1,
    }
}

fn number(text: &str, span: Span) -> Result<ExprKind, SyntaxError> {
    let bad = |message: String| SyntaxError { kind: SyntaxErrorKind::BadNumber, message, span, hint: None };
    if text.contains(['.', 'e', 'E']) {
        let v: f64 = text.parse().map_err(|_| bad(format!("`{text}` is not a number")))?;
        if !v.is_finite() {
            return Err(bad(format!("`{text}` is too large for a float")));
        }
        Ok(ExprKind::Float(v))
    } else {
        text.parse::<i64>().map(ExprKind::Int).map_err(|_| SyntaxError {
            hint: Some(format!("integers must lie within ±{}", i64::MAX)),
            ..bad(format!("integer `{text}` is too large"))
        })
    }
}

fn describe(rule: &Rule) -> Option<&'static str> {
    Some(match rule {
        Rule::header | Rule::kw_spec => "`spec NAME`",
        Rule::param | Rule::kw_param => "`param`",
        Rule::dim_decl | Rule::kw_dim => "`dim`",
        Rule::input | Rule::kw_input => "`input`",
        Rule::kw_weight => "`weight`",
        Rule::let_stmt | Rule::kw_let => "`let`",
        Rule::output | Rule::kw_output => "`output`",
        Rule::require | Rule::kw_require => "`require`",
        Rule::ident | Rule::variant => "a name",
        Rule::expr => "an expression",
        Rule::number => "a number",
        Rule::string => "a quoted message",
        Rule::ty | Rule::prim_ty | Rule::enum_ty | Rule::list_ty => "a type",
        Rule::shape => "a shape `[...]`",
        Rule::optional => "`?`",
        Rule::EOI => "end of file",
        Rule::or | Rule::and | Rule::eq | Rule::ne | Rule::le | Rule::ge | Rule::lt | Rule::gt => "an operator",
        Rule::add | Rule::sub | Rule::mul | Rule::div | Rule::rem | Rule::matmul => "an operator",
        Rule::neg | Rule::not => "an expression",
        Rule::call | Rule::list | Rule::kwarg | Rule::if_expr | Rule::lambda | Rule::index => "an expression",
        Rule::domain | Rule::kw_in => "`in DOMAIN`",
        Rule::init => "`~ DISTRIBUTION`",
        Rule::kw_then => "`then`",
        Rule::kw_else => "`else`",
        Rule::kw_none | Rule::kw_true | Rule::kw_false => "an expression",
        _ => return None,
    })
}

fn convert_error(source: &str, e: pest::error::Error<Rule>) -> SyntaxError {
    let pos = match e.location {
        InputLocation::Pos(p) => p,
        InputLocation::Span((s, _)) => s,
    };
    let found_end = source[pos..]
        .char_indices()
        .find(|(i, c)| c.is_whitespace() || (*i > 0 && !(c.is_alphanumeric() || *c == '_')))
        .map_or(source.len(), |(i, _)| pos + i);
    let found_end = if found_end == pos {
        (pos + source[pos..].chars().next().map_or(0, char::len_utf8)).min(source.len())
    } else {
        found_end
    };
    let found = &source[pos..found_end];
    let (message, expected) = match &e.variant {
        ErrorVariant::ParsingError { positives, .. } => {
            let mut names: Vec<&str> = positives.iter().filter_map(describe).collect();
            names.sort();
            names.dedup();
            if names.contains(&"an expression") {
                names.retain(|n| *n != "a name" && *n != "a number");
            }
            let expected = match names.len() {
                0 => "something else".to_string(),
                1 => names[0].to_string(),
                _ => format!("{} or {}", names[..names.len() - 1].join(", "), names[names.len() - 1]),
            };
            let found_text = if found.is_empty() { "end of file".to_string() } else { format!("`{found}`") };
            (format!("expected {expected}, found {found_text}"), positives.clone())
        }
        ErrorVariant::CustomError { message } => (message.clone(), vec![]),
    };
    let hint = if expected.contains(&Rule::header) {
        Some("a spec starts with `spec NAME`".to_string())
    } else if expected.contains(&Rule::ty) || expected.contains(&Rule::prim_ty) {
        Some("a type is `int`, `float`, `bool`, `{a, b, ...}` or `[float]`, optionally followed by `?`".to_string())
    } else if found == "=" {
        Some("compare with `==`; `=` only binds names and keyword arguments".to_string())
    } else if expected.contains(&Rule::EOI) || expected.contains(&Rule::param) {
        Some("each item starts with `param`, `dim`, `input`, `let`, `output` or `require`".to_string())
    } else {
        None
    };
    SyntaxError { kind: SyntaxErrorKind::Unexpected, message, span: Span::new(pos, found_end), hint }
}

#[cfg(test)]
mod tests {
    /// An operand after an `if` or a function used to be parsed again at
    /// every level of their nesting: `||5---||if||` repeated 11 times took
    /// 6 s to refuse, 20 times hours (found by fuzzing `parse_check`). Under
    /// pest's call limit the old grammar fails here on the limit ("call
    /// limit reached"), the new one on the last function's missing body.
    #[test]
    fn nesting_after_an_open_expression_is_parsed_once() {
        pest::set_call_limit(std::num::NonZeroUsize::new(10_000_000));
        let source = format!("spec a\nrequire\n{}", "||5---||if||\n".repeat(40));
        let e = super::parse(&source).expect_err("no body");
        assert_eq!(e.message, "expected an expression, found end of file");
    }
}
