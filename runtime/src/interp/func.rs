//! Score and mask functions in the interpreter: the evaluator is
//! `ir::func_eval` (one definition, which the cost model also runs); here
//! its leaves read the interpreter's tensors, and a read outside a tensor
//! is an error naming it.

use crate::tensor::Tensor;
pub use attnc_compiler::ir::func_eval::FVal;
use attnc_compiler::ir::func_eval::{self, Leaves};
use attnc_compiler::ir::{AttnFns, DimValues, FExpr, Func, Program};
use std::fmt;

/// A function's call that reads past the end of a captured tensor, or
/// whose integer arithmetic leaves 32 bits (error E0604).
#[derive(Clone, Debug, PartialEq)]
pub struct ReadError {
    pub fault: Box<Fault>,
    /// Behind a condition the host check cannot decide before the run (on
    /// the logit `s`, or an entry of a tensor it has no data of):
    /// `interp::reach` refuses what may happen.
    pub maybe: bool,
    /// Where: `score` or `mask`, and the call's (b, h, i, j).
    pub func: &'static str,
    pub at: [usize; 4],
}

/// What went wrong in the call.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// A read of `tensor` (of `shape`) at `index`; an axis the call cannot
    /// pin down (`attnc_compiler::ir::func_range`) is the range it may take.
    Read { tensor: String, index: Vec<(i64, i64)>, shape: Vec<usize> },
    /// Integer expression `expr` is `value` (or may reach it), outside 32 bits.
    Overflow { expr: String, value: i128 },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [b, h, i, j] = self.at;
        let (reads, is) = if self.maybe { ("may read", "may be") } else { ("reads", "is") };
        match self.fault.as_ref() {
            Fault::Read { tensor, index, shape } => {
                let index: Vec<String> = index
                    .iter()
                    .map(|(lo, hi)| if lo == hi { lo.to_string() } else { format!("{lo}..={hi}") })
                    .collect();
                write!(
                    f,
                    "the {} function {reads} `{tensor}[{}]`, outside its shape {shape:?}",
                    self.func,
                    index.join(", ")
                )?
            }
            Fault::Overflow { expr, value } => write!(
                f,
                "the {} function's integer `{expr}` {is} {value}, outside 32 bits (a function's integers are 32-bit)",
                self.func
            )?,
        }
        write!(f, " (at b={b}, h={h}, i={i}, j={j})")?;
        if self.maybe {
            write!(f, "; it stands behind a condition on the logit `s` or on a tensor on the device, which is not known before the run: keep the index in range wherever the pair is visible")?;
        }
        Ok(())
    }
}

/// What a function's leaves refer to: the captured tensors (with their
/// input names) and the dims' values.
pub struct Env<'a> {
    pub captures: Vec<(&'a str, &'a Tensor)>,
    pub dims: &'a DimValues,
}

impl<'a> Env<'a> {
    /// The environment of attention `fns` in `program`, whose node values so far are `values`.
    pub fn new(program: &'a Program, fns: &AttnFns, values: &'a [Tensor], dims: &'a DimValues) -> Env<'a> {
        let captures = fns
            .captures
            .iter()
            .map(|c| {
                let name = match program.nodes[c.0 as usize].op {
                    attnc_compiler::ir::Op::Input { index } => program.inputs[index].name.as_str(),
                    _ => "a computed tensor",
                };
                (name, &values[c.0 as usize])
            })
            .collect();
        Env { captures, dims }
    }
}

/// Calls `func` on `args` (its parameters' values); `at` is the (b, h, i, j)
/// an error names.
pub fn call(func: &Func, args: &[FVal], env: &Env, at: [usize; 4]) -> Result<FVal, ReadError> {
    func_eval::eval(&func.body, args, env).map_err(|raw| {
        let fault = match raw {
            Raw::Read(fault) => fault,
            Raw::Overflow(e, value) => {
                let names: Vec<&str> = env.captures.iter().map(|(name, _)| *name).collect();
                Fault::Overflow { expr: expr_text(&e, &func.params, &names), value }
            }
        };
        ReadError { fault: Box::new(fault), maybe: false, func: func.kind.name(), at }
    })
}

/// A fault as the evaluator meets it (an expression not yet written out).
pub enum Raw {
    Read(Fault),
    Overflow(FExpr, i128),
}

impl Leaves for Env<'_> {
    type Error = Raw;

    fn dim(&self, name: &str) -> i64 {
        self.dims[name] as i64
    }

    fn read(&self, capture: usize, index: Vec<i64>) -> Result<f64, Self::Error> {
        let t = self.captures[capture].1;
        let mut flat = 0usize;
        for (i, n) in index.iter().zip(&t.shape) {
            if *i < 0 || *i as usize >= *n {
                let (name, t) = self.captures[capture];
                let index = index.iter().map(|i| (*i, *i)).collect();
                return Err(Raw::Read(Fault::Read { tensor: name.to_string(), index, shape: t.shape.clone() }));
            }
            flat = flat * n + *i as usize;
        }
        Ok(t.data[flat])
    }

    fn read_bound(&self, capture: usize, lo: &[i64], hi: &[i64], max: bool) -> Result<f64, Self::Error> {
        Ok(read_bound(self.captures[capture].1, lo, hi, max))
    }

    fn overflow(&self, e: &FExpr, value: i128) -> Raw {
        Raw::Overflow(e.clone(), value)
    }
}

/// `e` as written in a function of `params`, captures by their input names.
pub fn expr_text(e: &FExpr, params: &[String], captures: &[&str]) -> String {
    let mut text = attnc_compiler::ir::expr_text(e, params);
    for (n, name) in captures.iter().enumerate().rev() {
        text = text.replace(&format!("#{n}["), &format!("{name}["));
    }
    text
}

/// The least (or, `max`, greatest) entry of `t` over the box `lo..=hi`,
/// each axis clamped into the shape; ∓∞ past `READ_BOX` entries, ±∞ (no
/// entry) for an empty box.
fn read_bound(t: &Tensor, lo: &[i64], hi: &[i64], max: bool) -> f64 {
    let clamp = |x: i64, n: usize| x.clamp(0, n as i64 - 1) as usize;
    let axes: Vec<(usize, usize)> =
        t.shape.iter().zip(lo.iter().zip(hi)).map(|(n, (l, h))| (clamp(*l, *n), clamp(*h, *n))).collect();
    let count: usize = axes.iter().map(|(l, h)| (h + 1).saturating_sub(*l)).product();
    let (none, all) = if max { (f64::NEG_INFINITY, f64::INFINITY) } else { (f64::INFINITY, f64::NEG_INFINITY) };
    if count > attnc_compiler::ir::READ_BOX {
        return all;
    }
    let mut best = none;
    for k in 0..count {
        let (mut rest, mut flat, mut stride) = (k, 0, 1);
        for ((l, h), n) in axes.iter().zip(&t.shape).rev() {
            let w = h + 1 - l;
            flat += (l + rest % w) * stride;
            rest /= w;
            stride *= n;
        }
        let v = t.data[flat];
        best = if max { best.max(v) } else { best.min(v) };
    }
    best
}
