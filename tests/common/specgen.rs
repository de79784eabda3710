//! A generator of well-typed score and mask functions (proptest strategies
//! over the function grammar of docs/language.md, "Score and mask
//! functions"): int arithmetic with `%` and `floordiv` by any divisor
//! (zero included), every elementwise function, comparisons, `and`, `or`,
//! `not`, `where`, reads of the captured `t: [2, N]` and `u: [N]` at
//! indices that may fall outside them, parameters, dims, and constants
//! from 0 to past 32 bits and f32, NaN and infinities among them.

#![allow(dead_code)]

use proptest::prelude::*;

/// Elementwise functions of a float.
pub const UNARY: [&str; 16] = [
    "sqrt", "abs", "exp", "log", "log1p", "tanh", "sigmoid", "softplus", "silu", "gelu", "erf", "sin", "cos", "floor",
    "ceil", "sign",
];

/// Int constants: small, a power of two, 32-bit edges and past them.
const INTS: [&str; 12] =
    ["0", "1", "2", "3", "7", "8", "-5", "64", "100000", "2147483647", "-2147483648", "4294967296"];

/// Float constants, with the non-finite ones as expressions (the language
/// has no literal for them) and one past f32's range.
const FLOATS: [&str; 9] = ["0.0", "1.5", "-2.0", "0.001", "1e30", "1e39", "log(0.0)", "0.0 / 0.0", "-log(0.0)"];

/// An int expression of `b, h, i, j` and the dims.
pub fn int_expr() -> BoxedStrategy<String> {
    let leaf = prop_oneof![
        3 => prop::sample::select(vec!["i", "j", "h", "b", "N", "M"]).prop_map(str::to_string),
        1 => prop::sample::select(INTS.to_vec()).prop_map(str::to_string),
    ];
    leaf.prop_recursive(3, 12, 3, |inner| {
        prop_oneof![
            (inner.clone(), prop::sample::select(vec!["+", "-", "*", "%"]), inner.clone())
                .prop_map(|(a, op, b)| format!("({a} {op} {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("floordiv({a}, {b})")),
            inner.clone().prop_map(|a| format!("abs({a})")),
            inner.clone().prop_map(|a| format!("(-{a})")),
            (prop::sample::select(vec!["minimum", "maximum"]), inner.clone(), inner.clone())
                .prop_map(|(f, a, b)| format!("{f}({a}, {b})")),
            (inner.clone(), inner.clone(), inner.clone()).prop_map(|(x, a, b)| format!("clamp({x}, {a}, {b})")),
            (int_compare(inner.clone()), inner.clone(), inner).prop_map(|(c, a, b)| format!("where({c}, {a}, {b})")),
        ]
    })
    .boxed()
}

fn int_compare(ints: BoxedStrategy<String>) -> impl Strategy<Value = String> {
    (ints.clone(), prop::sample::select(vec!["<", "<=", "==", "!=", ">", ">="]), ints)
        .prop_map(|(a, op, b)| format!("{a} {op} {b}"))
}

/// A read of `t` or `u`: an index in range (reduced modulo the axis, `%`
/// being non-negative for a positive divisor) or anywhere.
pub fn read() -> BoxedStrategy<String> {
    let index = prop_oneof![
        2 => int_expr().prop_map(|e| format!("({e}) % N")),
        1 => int_expr(),
    ];
    prop_oneof![
        (index.clone()).prop_map(|x| format!("t[h % 2, {x}]")),
        (index.clone(), index.clone()).prop_map(|(x, y)| format!("t[{y} % 2, {x}]")),
        index.prop_map(|x| format!("u[{x}]")),
    ]
    .boxed()
}

/// A float compared in a condition: a read, an exact multiple of 0.25, a
/// constant (±∞ and NaN among them; none that rounds to another in f32),
/// and with `s` the logit.
fn compared_leaf(s: bool) -> BoxedStrategy<String> {
    let mut leaves = vec![
        read().boxed(),
        int_expr().prop_map(|e| format!("0.25 * (({e}) % 1000)")).boxed(),
        prop::sample::select(vec!["0.0", "1.5", "-2.0", "0.001", "log(0.0)", "-log(0.0)", "0.0 / 0.0"])
            .prop_map(str::to_string)
            .boxed(),
    ];
    if s {
        leaves.push(Just("s".to_string()).boxed());
    }
    prop::strategy::Union::new(leaves).boxed()
}

/// A bool expression; `s`: the logit may appear (in a score function).
pub fn bool_expr(s: bool) -> BoxedStrategy<String> {
    let float_cmp = (compared_leaf(s), prop::sample::select(vec!["<", ">", "==", "!="]), compared_leaf(s))
        .prop_map(|(a, op, b)| format!("{a} {op} {b}"));
    let leaf = prop_oneof![3 => int_compare(int_expr()), 1 => float_cmp, 1 => Just("true".to_string())];
    leaf.prop_recursive(2, 6, 2, |inner| {
        prop_oneof![
            (inner.clone(), prop::sample::select(vec!["and", "or", "==", "!="]), inner.clone())
                .prop_map(|(a, op, b)| format!("(({a}) {op} ({b}))")),
            inner.prop_map(|a| format!("not ({a})")),
        ]
    })
    .boxed()
}

fn float_leaf(s: bool) -> BoxedStrategy<String> {
    let mut leaves = vec![
        read().boxed(),
        int_expr().prop_map(|e| format!("0.01 * {e}")).boxed(),
        prop::sample::select(FLOATS.to_vec()).prop_map(str::to_string).boxed(),
    ];
    if s {
        leaves.push(Just("s".to_string()).boxed());
        leaves.push(Just("s".to_string()).boxed());
    }
    prop::strategy::Union::new(leaves).boxed()
}

/// A float expression; `s` as in [`bool_expr`].
pub fn float_expr(s: bool) -> BoxedStrategy<String> {
    float_leaf(s)
        .prop_recursive(3, 12, 2, move |inner| {
            prop_oneof![
                (inner.clone(), prop::sample::select(vec!["+", "-", "*", "/"]), inner.clone())
                    .prop_map(|(a, op, b)| format!("({a} {op} {b})")),
                (prop::sample::select(UNARY.to_vec()), inner.clone()).prop_map(|(f, a)| format!("{f}({a})")),
                (prop::sample::select(vec!["maximum", "minimum", "pow"]), inner.clone(), inner.clone())
                    .prop_map(|(f, a, b)| format!("{f}({a}, {b})")),
                (bool_expr(s), inner.clone(), inner).prop_map(|(c, a, b)| format!("where({c}, {a}, {b})")),
            ]
        })
        .boxed()
}

/// A score function's body: mostly around `s`, so the softmax has a logit.
pub fn score_body() -> BoxedStrategy<String> {
    prop_oneof![
        2 => float_expr(true).prop_map(|e| format!("s + 0.1 * tanh({e})")),
        1 => float_expr(true),
    ]
    .boxed()
}

/// A mask function's body: mostly near the causal mask, so rows see keys.
pub fn mask_body() -> BoxedStrategy<String> {
    prop_oneof![
        2 => bool_expr(false).prop_map(|e| format!("j <= i + (N - M) or ({e})")),
        1 => bool_expr(false),
    ]
    .boxed()
}

// The compared grammar: functions whose value the f32 kernels and the
// float64 interpreter must agree on to 1e-4 (tests/differential.rs). The
// logit `s` enters only through operations continuous in it (f32 and f64
// logits differ by rounding, so a jump at some `s` would make the two
// disagree by chance), and integers only as exact floats (a multiple of
// 0.25 below 250: no rounding either way) or indices. NaN and ±∞ enter as
// a whole score or from `s`-free terms, where they are the same on both.

/// An `s`-free float term: finite or NaN, never ±∞ (which `s · ∞` would
/// turn into a sign of `s`).
fn exact_term() -> BoxedStrategy<String> {
    let leaf = prop_oneof![
        2 => read(),
        1 => int_expr().prop_map(|e| format!("0.25 * (({e}) % 1000)")),
        1 => prop::sample::select(vec!["0.0", "1.5", "-2.0", "0.001"]).prop_map(str::to_string),
    ];
    leaf.prop_recursive(2, 8, 2, |inner| {
        prop_oneof![
            (inner.clone(), prop::sample::select(vec!["+", "-", "*"]), inner.clone())
                .prop_map(|(a, op, b)| format!("({a} {op} {b})")),
            inner.clone().prop_map(|a| format!("({a} / -1.5)")),
            (
                prop::sample::select(vec!["sqrt", "abs", "tanh", "sigmoid", "sin", "floor", "ceil", "sign", "erf"]),
                inner.clone()
            )
                .prop_map(|(f, a)| format!("{f}({a})")),
            (bool_expr(false), inner.clone(), inner).prop_map(|(c, a, b)| format!("where({c}, {a}, {b})")),
        ]
    })
    .boxed()
}

/// A float continuous in `s` wherever it is finite.
fn smooth() -> BoxedStrategy<String> {
    let leaf = prop_oneof![2 => Just("s".to_string()), 1 => exact_term()];
    leaf.prop_recursive(3, 10, 2, |inner| {
        prop_oneof![
            (inner.clone(), prop::sample::select(vec!["+", "-", "*"]), inner.clone())
                .prop_map(|(a, op, b)| format!("({a} {op} {b})")),
            (
                prop::sample::select(vec!["tanh", "sigmoid", "softplus", "silu", "gelu", "erf", "sin", "cos", "abs"]),
                inner.clone()
            )
                .prop_map(|(f, a)| format!("{f}({a})")),
            (prop::sample::select(vec!["maximum", "minimum"]), inner.clone(), inner.clone())
                .prop_map(|(f, a, b)| format!("{f}({a}, {b})")),
            (bool_expr(false), inner.clone(), inner).prop_map(|(c, a, b)| format!("where({c}, {a}, {b})")),
        ]
    })
    .boxed()
}

/// Which infinite scores a compared score function may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Infinite {
    /// None: −∞ and +∞ both leave a mixed logit to the driver's arithmetic.
    Neither,
    /// −∞ (which hides the key): +∞ weighs linear attention's values infinitely.
    Minus,
    Both,
}

/// A compared score function's body: a bounded change of `s`, a raw smooth
/// expression, or either where a condition holds and NaN, an `s`-free term
/// or the infinities `infinite` allows (−∞ hides the key) elsewhere.
pub fn compared_score_body(infinite: Infinite) -> BoxedStrategy<String> {
    let bounded = smooth().prop_map(|e| format!("s + 0.5 * tanh({e})")).boxed();
    let mut ends = vec!["0.0 / 0.0"];
    if infinite != Infinite::Neither {
        ends.push("log(0.0)");
    }
    if infinite == Infinite::Both {
        ends.push("-log(0.0)");
    }
    let other = prop_oneof![prop::sample::select(ends).prop_map(str::to_string), exact_term()];
    prop_oneof![
        3 => bounded.clone(),
        1 => smooth(),
        2 => (bool_expr(false), bounded, other).prop_map(|(c, a, b)| format!("where({c}, {a}, {b})")),
    ]
    .boxed()
}
