//! Score and mask functions in the interpreter: the evaluator is
//! `ir::func_eval` (one definition, which the cost model also runs); here
//! its leaves read the interpreter's tensors, and a read outside a tensor
//! is an error naming it.

use crate::tensor::Tensor;
pub use attnc_compiler::ir::func_eval::FVal;
use attnc_compiler::ir::func_eval::{self, Leaves};
use attnc_compiler::ir::{AttnFns, DimValues, Func, Program};
use std::fmt;

/// A read past the end of a captured tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadError {
    pub tensor: String,
    pub index: Vec<i64>,
    pub shape: Vec<usize>,
    /// Where: `score` or `mask`, and the call's (b, h, i, j).
    pub func: &'static str,
    pub at: [usize; 4],
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let index: Vec<String> = self.index.iter().map(i64::to_string).collect();
        let [b, h, i, j] = self.at;
        write!(
            f,
            "the {} function reads `{}[{}]`, outside its shape {:?} (at b={b}, h={h}, i={i}, j={j})",
            self.func,
            self.tensor,
            index.join(", "),
            self.shape
        )
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
    func_eval::eval(&func.body, args, env).map_err(|(capture, index)| {
        let (name, t) = env.captures[capture];
        ReadError { tensor: name.to_string(), index, shape: t.shape.clone(), func: func.kind.name(), at }
    })
}

/// A read outside a tensor: which capture, at which index.
impl Leaves for Env<'_> {
    type Error = (usize, Vec<i64>);

    fn dim(&self, name: &str) -> i64 {
        self.dims[name] as i64
    }

    fn read(&self, capture: usize, index: Vec<i64>) -> Result<f64, Self::Error> {
        let t = self.captures[capture].1;
        let mut flat = 0usize;
        for (i, n) in index.iter().zip(&t.shape) {
            if *i < 0 || *i as usize >= *n {
                return Err((capture, index));
            }
            flat = flat * n + *i as usize;
        }
        Ok(t.data[flat])
    }

    fn read_bound(&self, capture: usize, lo: &[i64], hi: &[i64], max: bool) -> Result<f64, Self::Error> {
        Ok(read_bound(self.captures[capture].1, lo, hi, max))
    }
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
