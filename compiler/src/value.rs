//! Compile-time values (parameters, options, sizes) and the evaluator of
//! scalar expressions over them.

use crate::codes::Code;
use crate::diag::{suggest, Diagnostic};
use attnc_grammar::ast::{BinOp, Expr, ExprKind, Prim, Span, Type, TypeKind, UnOp};
use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
    Bool(bool),
    /// An enum variant, or a bare name used as one (`mask = causal`).
    Enum(String),
    None,
    List(Vec<Value>),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(v) => write!(f, "{v}"),
            Value::Float(v) => write!(f, "{v:?}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::Enum(v) => write!(f, "{v}"),
            Value::None => write!(f, "none"),
            Value::List(items) => {
                let items: Vec<String> = items.iter().map(Value::to_string).collect();
                write!(f, "[{}]", items.join(", "))
            }
        }
    }
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Bool(_) => "bool",
            Value::Enum(_) => "name",
            Value::None => "none",
            Value::List(_) => "list",
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(v) => Some(*v as f64),
            Value::Float(v) => Some(*v),
            _ => None,
        }
    }
}

/// Where names are looked up during evaluation.
pub trait Scope {
    fn lookup(&self, name: &str) -> Option<Value>;
    /// Every visible name, for suggestions.
    fn names(&self) -> Vec<String>;
}

/// Evaluate a constant expression. A bare unknown name at the top or as an
/// operand of `==`/`!=` is an enum literal; anywhere else it is an error.
/// The functions constant expressions may call.
pub const SCALAR_FUNCTIONS: &[&str] = &["sqrt", "exp", "log", "abs", "min", "max"];

pub fn eval(e: &Expr, scope: &dyn Scope) -> Result<Value, Diagnostic> {
    eval_inner(e, scope, true)
}

/// "unknown name `x`", with the closest visible name as a suggestion.
pub(crate) fn unknown_name(name: &str, span: Span, scope: &dyn Scope) -> Diagnostic {
    let names = scope.names();
    let mut d = Diagnostic::error(Code::UnknownName, format!("unknown name `{name}`"))
        .at(span, "not declared before this point");
    if let Some(s) = suggest(name, names.iter().map(String::as_str)) {
        d = d.hint(format!("did you mean `{s}`?"));
    }
    d
}

fn eval_inner(e: &Expr, scope: &dyn Scope, symbol_ok: bool) -> Result<Value, Diagnostic> {
    let arith = |msg: String| Diagnostic::error(Code::Arithmetic, msg).at(e.span, "here");
    Ok(match &e.kind {
        ExprKind::Int(v) => Value::Int(*v),
        ExprKind::Float(v) => Value::Float(*v),
        ExprKind::Bool(v) => Value::Bool(*v),
        ExprKind::None => Value::None,
        ExprKind::Name(n) => match scope.lookup(n) {
            Some(v) => v,
            None if symbol_ok => Value::Enum(n.clone()),
            None => return Err(unknown_name(n, e.span, scope)),
        },
        ExprKind::Lambda { .. } | ExprKind::Index { .. } => {
            return Err(Diagnostic::error(Code::WrongKind, "functions and indexing are not constants")
                .at(e.span, "not a constant")
                .note("functions are arguments of `attention`, and only they index tensors"))
        }
        ExprKind::List(items) => {
            Value::List(items.iter().map(|x| eval_inner(x, scope, false)).collect::<Result<_, _>>()?)
        }
        ExprKind::Unary(op, x) => {
            let v = eval_inner(x, scope, false)?;
            match (op, v) {
                (UnOp::Neg, Value::Int(i)) => {
                    Value::Int(i.checked_neg().ok_or_else(|| arith("integer overflow".into()))?)
                }
                (UnOp::Neg, Value::Float(f)) => Value::Float(-f),
                (UnOp::Not, Value::Bool(b)) => Value::Bool(!b),
                (op, v) => {
                    return Err(arith(format!(
                        "cannot apply `{}` to {} `{v}`",
                        if *op == UnOp::Neg { "-" } else { "not" },
                        v.type_name()
                    )))
                }
            }
        }
        ExprKind::Binary(op @ (BinOp::And | BinOp::Or), a, b) => {
            // Short-circuit, so `H_kv >= 1 and H % H_kv == 0` never divides by zero.
            match eval_inner(a, scope, false)? {
                Value::Bool(x) if x == (*op == BinOp::Or) => Value::Bool(x),
                Value::Bool(_) => match eval_inner(b, scope, false)? {
                    Value::Bool(y) => Value::Bool(y),
                    v => {
                        return Err(arith(format!(
                            "`{}` needs true or false, found {} `{v}`",
                            op.symbol(),
                            v.type_name()
                        )))
                    }
                },
                v => {
                    return Err(arith(format!("`{}` needs true or false, found {} `{v}`", op.symbol(), v.type_name())))
                }
            }
        }
        ExprKind::Binary(op, a, b) => {
            let eq = matches!(op, BinOp::Eq | BinOp::Ne);
            let va = eval_inner(a, scope, eq)?;
            let vb = eval_inner(b, scope, eq)?;
            binary(*op, va, vb).map_err(arith)?
        }
        ExprKind::If(c, a, b) => match eval_inner(c, scope, false)? {
            Value::Bool(true) => eval_inner(a, scope, symbol_ok)?,
            Value::Bool(false) => eval_inner(b, scope, symbol_ok)?,
            v => return Err(arith(format!("`if` needs true or false, found {} `{v}`", v.type_name()))),
        },
        ExprKind::Call { func, args } => {
            let vals: Vec<Value> = args.iter().map(|a| eval_inner(&a.value, scope, false)).collect::<Result<_, _>>()?;
            let nums: Option<Vec<f64>> = vals.iter().map(Value::as_f64).collect();
            let one = |f: fn(f64) -> f64| -> Result<Value, Diagnostic> {
                match nums.as_deref() {
                    Some([x]) => Ok(Value::Float(f(*x))),
                    _ => Err(arith(format!("`{}` takes one number", func.name))),
                }
            };
            match func.name.as_str() {
                "sqrt" => one(f64::sqrt)?,
                "exp" => one(f64::exp)?,
                "log" => one(f64::ln)?,
                "abs" => match vals.as_slice() {
                    [Value::Int(i)] => Value::Int(i.checked_abs().ok_or_else(|| arith("integer overflow".into()))?),
                    _ => one(f64::abs)?,
                },
                "min" | "max" => {
                    let is_min = func.name == "min";
                    if vals.len() != 2 || nums.is_none() {
                        return Err(arith(format!("`{}` takes two numbers", func.name)));
                    }
                    match (&vals[0], &vals[1]) {
                        (Value::Int(x), Value::Int(y)) => Value::Int(if is_min { *x.min(y) } else { *x.max(y) }),
                        _ => {
                            let (x, y) = (vals[0].as_f64().unwrap(), vals[1].as_f64().unwrap());
                            Value::Float(if is_min { x.min(y) } else { x.max(y) })
                        }
                    }
                }
                name => {
                    let mut d =
                        Diagnostic::error(Code::UnknownFunction, format!("`{name}` is not a function of constants"))
                            .at(func.span, "in a constant expression");
                    d = d.hint("constant expressions may call `sqrt`, `exp`, `log`, `abs`, `min` and `max`");
                    return Err(d);
                }
            }
        }
    })
}

fn binary(op: BinOp, a: Value, b: Value) -> Result<Value, String> {
    use Value::*;
    let overflow = || "integer overflow".to_string();
    Ok(match (op, &a, &b) {
        (BinOp::Eq, _, _) => Bool(values_equal(&a, &b)),
        (BinOp::Ne, _, _) => Bool(!values_equal(&a, &b)),
        (BinOp::Add, Int(x), Int(y)) => Int(x.checked_add(*y).ok_or_else(overflow)?),
        (BinOp::Sub, Int(x), Int(y)) => Int(x.checked_sub(*y).ok_or_else(overflow)?),
        (BinOp::Mul, Int(x), Int(y)) => Int(x.checked_mul(*y).ok_or_else(overflow)?),
        (BinOp::Div | BinOp::Rem, Int(_), Int(0)) => return Err("division by zero".into()),
        (BinOp::Div, Int(x), Int(y)) if x % y == 0 => Int(x / y),
        (BinOp::Div, Int(x), Int(y)) => Float(*x as f64 / *y as f64),
        (BinOp::Rem, Int(x), Int(y)) => Int(x.rem_euclid(*y)),
        (BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge, _, _) => {
            let (Some(x), Some(y)) = (a.as_f64(), b.as_f64()) else {
                return Err(format!("cannot compare {} `{a}` with {} `{b}`", a.type_name(), b.type_name()));
            };
            Bool(match op {
                BinOp::Lt => x < y,
                BinOp::Le => x <= y,
                BinOp::Gt => x > y,
                _ => x >= y,
            })
        }
        (BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div, _, _) if a.as_f64().is_some() && b.as_f64().is_some() => {
            let (x, y) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            if op == BinOp::Div && y == 0.0 {
                return Err("division by zero".into());
            }
            Float(match op {
                BinOp::Add => x + y,
                BinOp::Sub => x - y,
                BinOp::Mul => x * y,
                _ => x / y,
            })
        }
        _ => {
            return Err(format!(
                "cannot apply `{}` to {} `{a}` and {} `{b}`",
                op.symbol(),
                a.type_name(),
                b.type_name()
            ))
        }
    })
}

fn values_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Enum(n), Value::None) | (Value::None, Value::Enum(n)) => n == "none",
        _ => match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => a == b,
        },
    }
}

/// Check `v` against a declared parameter type, converting ints to floats
/// where a float is expected. Returns the message of a mismatch.
pub fn conform(v: Value, ty: &Type) -> Result<Value, String> {
    if let (Value::None, TypeKind::Enum(names)) = (&v, &ty.kind) {
        if names.iter().any(|n| n.name == "none") {
            return Ok(Value::Enum("none".into()));
        }
    }
    if v == Value::None {
        return if ty.optional {
            Ok(v)
        } else {
            Err(format!("`none` is not allowed; the type `{}` is not optional", attnc_grammar::print_type(ty)))
        };
    }
    let prim = |v: Value, p: Prim| -> Result<Value, String> {
        match (p, v) {
            (Prim::Int, v @ Value::Int(_)) | (Prim::Bool, v @ Value::Bool(_)) | (Prim::Float, v @ Value::Float(_)) => {
                Ok(v)
            }
            (Prim::Float, Value::Int(i)) => Ok(Value::Float(i as f64)),
            (p, v) => Err(format!("expected {}, found {} `{v}`", p.keyword(), v.type_name())),
        }
    };
    match &ty.kind {
        TypeKind::Prim(p) => prim(v, *p),
        TypeKind::List(p) => match v {
            Value::List(items) => Ok(Value::List(items.into_iter().map(|x| prim(x, *p)).collect::<Result<_, _>>()?)),
            v => Err(format!("expected a list of {}, found {} `{v}`", p.keyword(), v.type_name())),
        },
        TypeKind::Enum(names) => match v {
            Value::Enum(n) if names.iter().any(|x| x.name == n) => Ok(Value::Enum(n)),
            v => {
                let list: Vec<&str> = names.iter().map(|n| n.name.as_str()).collect();
                let mut msg = format!("expected one of {{{}}}, found `{v}`", list.join(", "));
                if let Some(s) = suggest(&v.to_string(), list.iter().copied()) {
                    msg.push_str(&format!("; did you mean `{s}`?"));
                }
                Err(msg)
            }
        },
    }
}
