//! [`Spec`] → canonical `.attn` text. Comments are not kept; parentheses are
//! printed exactly where precedence needs them, so `parse(print(spec))`
//! gives back `spec` (spans aside).

use crate::ast::*;
use std::fmt::Write;

/// The canonical text of a spec.
pub fn print_spec(spec: &Spec) -> String {
    let mut out = format!("spec {}\n", spec.name.name);
    let mut last_group = None;
    for item in &spec.items {
        let group = std::mem::discriminant(&item.kind);
        if last_group != Some(group) {
            out.push('\n');
            last_group = Some(group);
        }
        print_item(&item.kind, &mut out);
        out.push('\n');
    }
    out
}

pub(crate) fn print_item(kind: &ItemKind, out: &mut String) {
    match kind {
        ItemKind::Param { name, ty, default } => {
            let _ = write!(out, "param {}: {}", name.name, print_type(ty));
            if let Some(d) = default {
                let _ = write!(out, " = {}", print_expr(d));
            }
        }
        ItemKind::Dim { name, default } => {
            let _ = write!(out, "dim {}", name.name);
            if let Some(d) = default {
                let _ = write!(out, " = {}", print_expr(d));
            }
        }
        ItemKind::Input { name, weight, shape, domain, init, .. } => {
            let dims: Vec<String> = shape.iter().map(print_expr).collect();
            let keyword = if *weight { "weight" } else { "input" };
            let _ = write!(out, "{keyword} {}: [{}]", name.name, dims.join(", "));
            if let Some(d) = domain {
                let _ = write!(out, " in {}", print_expr(d));
            }
            if let Some(i) = init {
                let _ = write!(out, " ~ {}", print_expr(i));
            }
        }
        ItemKind::Let { name, value } => {
            let _ = write!(out, "let {} = {}", name.name, print_expr(value));
        }
        ItemKind::Output { name, value } => {
            let _ = write!(out, "output {} = {}", name.name, print_expr(value));
        }
        ItemKind::Require { cond, message } => {
            let _ = write!(out, "require {}", print_expr(cond));
            if let Some(m) = message {
                let _ = write!(out, ", \"{m}\"");
            }
        }
    }
}

pub fn print_type(ty: &Type) -> String {
    let mut s = match &ty.kind {
        TypeKind::Prim(p) => p.keyword().to_string(),
        TypeKind::List(p) => format!("[{}]", p.keyword()),
        TypeKind::Enum(names) => {
            let names: Vec<&str> = names.iter().map(|n| n.name.as_str()).collect();
            format!("{{{}}}", names.join(", "))
        }
    };
    if ty.optional {
        s.push('?');
    }
    s
}

/// The canonical text of an expression.
pub fn print_expr(e: &Expr) -> String {
    let mut out = String::new();
    write_expr(e, 0, &mut out);
    out
}

fn precedence(e: &Expr) -> u8 {
    match &e.kind {
        ExprKind::Binary(op, ..) => op.precedence(),
        ExprKind::Unary(..) => UNARY_PRECEDENCE,
        // `if` and a function's body extend as far right as they can:
        // parenthesised inside any operator.
        ExprKind::If(..) | ExprKind::Lambda { .. } => 0,
        _ => u8::MAX,
    }
}

/// Writes `e`, parenthesised when it binds more loosely than `min`.
fn write_expr(e: &Expr, min: u8, out: &mut String) {
    let paren = precedence(e) < min;
    if paren {
        out.push('(');
    }
    match &e.kind {
        ExprKind::Int(v) => {
            let _ = write!(out, "{v}");
        }
        ExprKind::Float(v) => {
            let _ = write!(out, "{v:?}");
        }
        ExprKind::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        ExprKind::None => out.push_str("none"),
        ExprKind::Name(n) => out.push_str(n),
        ExprKind::List(items) => {
            out.push('[');
            write_list(items.iter(), out);
            out.push(']');
        }
        ExprKind::Unary(op, x) => {
            out.push_str(match op {
                UnOp::Neg => "-",
                UnOp::Not => "not ",
            });
            write_expr(x, UNARY_PRECEDENCE, out);
        }
        ExprKind::Binary(op, a, b) => {
            write_expr(a, op.precedence(), out);
            let _ = write!(out, " {} ", op.symbol());
            // Left-associative: an equal-precedence right operand needs parentheses.
            write_expr(b, op.precedence() + 1, out);
        }
        ExprKind::If(c, a, b) => {
            out.push_str("if ");
            write_expr(c, 0, out);
            out.push_str(" then ");
            write_expr(a, 0, out);
            out.push_str(" else ");
            write_expr(b, 0, out);
        }
        ExprKind::Call { func, args } => {
            out.push_str(&func.name);
            out.push('(');
            for (i, a) in args.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                if let Some(n) = &a.name {
                    let _ = write!(out, "{} = ", n.name);
                }
                write_expr(&a.value, 0, out);
            }
            out.push(')');
        }
        ExprKind::Lambda { params, body } => {
            out.push('|');
            for (i, p) in params.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&p.name);
            }
            out.push_str("| ");
            write_expr(body, 0, out);
        }
        ExprKind::Index { base, indices } => {
            out.push_str(&base.name);
            out.push('[');
            write_list(indices.iter(), out);
            out.push(']');
        }
    }
    if paren {
        out.push(')');
    }
}

fn write_list<'a>(items: impl Iterator<Item = &'a Expr>, out: &mut String) {
    for (i, x) in items.enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_expr(x, 0, out);
    }
}
