//! Before any backend runs a program: whether some call of an attention's
//! score or mask function would read outside a captured tensor or leave
//! 32-bit integers (error E0604, naming the first such call). Kernels clamp
//! their reads and wrap their integers, so they are never handed such a
//! program; the interpreter refuses it the same way.
//!
//! Calls are the interpreter's (`Scores`): the mask function where the
//! built-in mask shows the key, the score function where the key is
//! visible. `ir::func_range` bounds them over boxes of calls, so proving
//! a whole attention costs one evaluation per function; where a box may
//! fail it is split (a band of query rows, a row, halves of its keys) down
//! to single calls, whose check is exact but for the logit `s`: a read or
//! an integer under a condition on `s` counts wherever its pair is visible.
//! Without the captured tensors' data (device-resident inputs), their
//! entries are unknown in conditions too.

use super::func::{expr_text, Fault, ReadError};
use crate::tensor::Tensor;
use attnc_compiler::ir::func_range::{self, Data, Range, RangeFault};
use attnc_compiler::ir::{concrete, AttnFns, DimValues, Func, Mask, Op, Program};

/// The first call of an attention function in `program` at `dims` that may
/// fail; `inputs` (in declaration order) give the captured entries where
/// the caller has them on the host.
pub fn check(program: &Program, inputs: Option<&[Tensor]>, dims: &DimValues) -> Result<(), ReadError> {
    for node in &program.nodes {
        let Op::Attention { q, k, mask, fns: Some(fns), .. } = &node.op else { continue };
        let (qs, ks) =
            (concrete(&program.nodes[q.0 as usize].shape, dims), concrete(&program.nodes[k.0 as usize].shape, dims));
        let names: Vec<String> = fns.captures.iter().map(|c| capture_name(program, *c)).collect();
        let captures = fns
            .captures
            .iter()
            .map(|c| {
                let data = match (&program.nodes[c.0 as usize].op, inputs) {
                    (Op::Input { index }, Some(inputs)) => inputs.get(*index),
                    _ => None,
                };
                (concrete(&program.nodes[c.0 as usize].shape, dims), data)
            })
            .collect();
        let at = Attention { fns, mask, dims, captures, names, sizes: [qs[0], qs[1], qs[2], ks[2]] };
        at.check()?;
    }
    Ok(())
}

fn capture_name(program: &Program, c: attnc_compiler::ir::NodeId) -> String {
    match program.nodes[c.0 as usize].op {
        Op::Input { index } => program.inputs[index].name.clone(),
        _ => "a computed tensor".into(),
    }
}

/// Query rows checked as one box before row by row.
const BAND: usize = 16;
/// Key ranges at most this wide are checked call by call.
const KEYS: usize = 8;

struct Attention<'a> {
    fns: &'a AttnFns,
    mask: &'a Mask,
    dims: &'a DimValues,
    /// Each capture's shape and, where the caller has it, its data.
    captures: Vec<(Vec<usize>, Option<&'a Tensor>)>,
    names: Vec<String>,
    /// B, H (query heads), M (query rows), N (key rows).
    sizes: [usize; 4],
}

impl Data for Attention<'_> {
    fn dim(&self, name: &str) -> i64 {
        self.dims[name] as i64
    }

    fn shape(&self, capture: usize) -> &[usize] {
        &self.captures[capture].0
    }

    fn value(&self, capture: usize, index: &[usize]) -> Option<f64> {
        let (shape, t) = &self.captures[capture];
        let flat = index.iter().zip(shape).fold(0, |f, (i, n)| f * n + i);
        t.map(|t| t.data[flat])
    }
}

/// Calls of query heads `h`, rows `i`, keys `j` (inclusive ranges) of batch `b`.
#[derive(Clone, Copy)]
struct Calls {
    b: usize,
    h: (usize, usize),
    i: (usize, usize),
    j: (usize, usize),
}

impl Attention<'_> {
    /// Softmax heads (the mask function's `h`): the logit-mixing matrix's
    /// columns under head mixing, else the query heads.
    fn mask_heads(&self) -> usize {
        self.fns.mix.logits.map_or(self.sizes[1], |c| self.captures[c].0[1])
    }

    fn mixed(&self) -> bool {
        self.fns.mix.logits.is_some() || self.fns.mix.probs.is_some()
    }

    fn check(&self) -> Result<(), ReadError> {
        let [b, h, m, n] = self.sizes;
        if b * h * m * n == 0 {
            return Ok(());
        }
        let all = Calls { b: 0, h: (0, h - 1), i: (0, m - 1), j: (0, n - 1) };
        if (0..b).all(|b| self.fine(Calls { b, ..all })) {
            return Ok(());
        }
        for b in 0..b {
            // The interpreter's order: plain attention by head, then rows and
            // keys; mixed attention takes every head of a pair at once.
            let heads: Vec<(usize, usize)> =
                if self.mixed() { vec![(0, h - 1)] } else { (0..h).map(|h| (h, h)).collect() };
            for h in heads {
                for i0 in (0..m).step_by(BAND) {
                    let i = (i0, (i0 + BAND).min(m) - 1);
                    let Some(j) = self.keys(i) else { continue };
                    if self.fine(Calls { b, h, i, j }) {
                        continue;
                    }
                    for i in i.0..=i.1 {
                        if let Some(j) = self.keys((i, i)) {
                            self.row(Calls { b, h, i: (i, i), j })?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The key rows the built-in mask shows rows `i`, as one range.
    fn keys(&self, (i0, i1): (usize, usize)) -> Option<(usize, usize)> {
        let [_, _, m, n] = self.sizes.map(|x| x as u64);
        let (mut lo, mut hi) = (u64::MAX, 0);
        for i in i0..=i1 {
            let band = self.mask.key_band(i as u64, m, n);
            if band.start < band.end.min(n) {
                lo = lo.min(band.start);
                hi = hi.max(band.end.min(n));
            }
        }
        (lo < hi).then(|| (lo as usize, hi as usize - 1))
    }

    /// One query row's calls (`c.i` a point): halves of its keys until they
    /// are proved or few, then call by call; the first failure.
    fn row(&self, c: Calls) -> Result<(), ReadError> {
        if self.fine(c) {
            return Ok(());
        }
        let (j0, j1) = c.j;
        if j1 - j0 < KEYS {
            return (j0..=j1).try_for_each(|j| self.call(Calls { j: (j, j), ..c }));
        }
        let mid = j0 + (j1 - j0) / 2;
        self.row(Calls { j: (j0, mid), ..c })?;
        self.row(Calls { j: (mid + 1, j1), ..c })
    }

    /// The mask function's heads for calls `c` of query heads `c.h`: every
    /// softmax head under head mixing.
    fn mask_calls(&self, c: Calls) -> Calls {
        match self.mixed() {
            true => Calls { h: (0, self.mask_heads() - 1), ..c },
            false => c,
        }
    }

    /// Whether no call in `c` may fail (mask and score functions over the box).
    fn fine(&self, c: Calls) -> bool {
        let mask = match &self.fns.mask {
            Some(f) => match self.eval(f, self.mask_calls(c), false) {
                Ok(r) => r.may(),
                Err(_) => return false,
            },
            None => true,
        };
        !mask || self.fns.score.as_ref().is_none_or(|f| self.eval(f, c, true).is_ok())
    }

    /// One pair's calls, every head of `c.h` (a point in plain attention),
    /// exactly as the interpreter makes them.
    fn call(&self, c: Calls) -> Result<(), ReadError> {
        let [_, _, m, n] = self.sizes;
        let (i, j) = (c.i.0, c.j.0);
        if !self.mask.visible(i as u64, j as u64, m as u64, n as u64) {
            return Ok(());
        }
        let heads = |h: (usize, usize)| (h.0..=h.1).map(move |h| Calls { h: (h, h), ..c });
        let mut seen = self.fns.mask.is_none();
        if let Some(f) = &self.fns.mask {
            for at in heads(self.mask_calls(c).h) {
                seen |= self.eval(f, at, false).map_err(|e| self.error(f, e, at))?.may();
            }
        }
        if let (true, Some(f)) = (seen, &self.fns.score) {
            for at in heads(c.h) {
                self.eval(f, at, true).map_err(|e| self.error(f, e, at))?;
            }
        }
        Ok(())
    }

    fn eval(&self, f: &Func, c: Calls, score: bool) -> Result<Range, RangeFault> {
        let int = |(lo, hi): (usize, usize)| Range::Int(lo as i128, hi as i128);
        let mut args = vec![Range::Int(c.b as i128, c.b as i128), int(c.h), int(c.i), int(c.j)];
        if score {
            args.insert(0, Range::Float(None));
        }
        func_range::eval(&f.body, &args, self)
    }

    fn error(&self, f: &Func, e: RangeFault, c: Calls) -> ReadError {
        let (e, mut maybe) = match e {
            RangeFault::Maybe(e) => (*e, true),
            e => (e, false),
        };
        // An index the call cannot pin down comes from such a condition too.
        maybe |= matches!(&e, RangeFault::Read { index, .. } if index.iter().any(|(lo, hi)| lo != hi));
        let fault = match e {
            RangeFault::Read { capture, index } => {
                Fault::Read { tensor: self.names[capture].clone(), index, shape: self.captures[capture].0.clone() }
            }
            RangeFault::Overflow { expr, value } => {
                let captures: Vec<&str> = self.names.iter().map(String::as_str).collect();
                Fault::Overflow { expr: expr_text(&expr, &f.params, &captures), value }
            }
            RangeFault::Maybe(_) => unreachable!("one level"),
        };
        ReadError { fault: Box::new(fault), maybe, func: f.kind.name(), at: [c.b, c.h.0, c.i.0, c.j.0] }
    }
}
