//! Where a score or mask function may fail: the evaluator of
//! [`super::func_eval`] run on ranges. An int is an interval, a float a
//! value or unknown (the logit `s`, an entry the caller has no data for),
//! a bool whether it may be true and whether it may be false. A `where`
//! whose condition may go either way takes both branches. The result
//! encloses every value the function takes where its arguments lie in
//! theirs, and a fault is reported wherever some call in them may read
//! outside a tensor or leave 32-bit integers; with every argument a point
//! and every read known, it is exactly `func_eval`'s.
//!
//! The host runs it before any kernel (`attnc_runtime::interp::reach`):
//! kernels clamp their reads and wrap their integers, so a spec that may
//! fail is refused there (E0604) instead of computing a wrong number.

use super::func_eval::{binary, floor_div, int32, value_binary, Exact, FVal};
use super::{scalar, FBin, FExpr};

/// A value a function may take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Range {
    /// Every int in `lo..=hi`.
    Int(i128, i128),
    /// This float, or `None`: unknown.
    Float(Option<f64>),
    /// May be true, may be false.
    Bool(bool, bool),
}

impl Range {
    pub fn int(v: i64) -> Range {
        Range::Int(v as i128, v as i128)
    }

    /// Whether it may be true.
    pub fn may(self) -> bool {
        matches!(self, Range::Bool(true, _))
    }

    /// The hull of two ranges of one type.
    fn join(self, other: Range) -> Range {
        match (self, other) {
            (Range::Int(a, b), Range::Int(c, d)) => Range::Int(a.min(c), b.max(d)),
            (Range::Bool(a, b), Range::Bool(c, d)) => Range::Bool(a || c, b || d),
            (x, y) => Range::Float(float(x).zip(float(y)).filter(|(x, y)| x.to_bits() == y.to_bits()).map(|(x, _)| x)),
        }
    }

    fn point(self) -> Option<FVal> {
        match self {
            Range::Int(lo, hi) if lo == hi => Some(FVal::Int(lo as i64)),
            Range::Float(Some(v)) => Some(FVal::Float(v)),
            Range::Bool(t, f) if t != f => Some(FVal::Bool(t)),
            _ => None,
        }
    }
}

fn of(v: FVal) -> Range {
    match v {
        FVal::Int(v) => Range::int(v),
        FVal::Float(v) => Range::Float(Some(v)),
        FVal::Bool(v) => Range::Bool(v, !v),
    }
}

/// A number's value as a float, where known.
fn float(r: Range) -> Option<f64> {
    match r {
        Range::Float(v) => v,
        Range::Int(lo, hi) if lo == hi => Some(lo as f64),
        _ => None,
    }
}

/// What the caller knows of a function's leaves.
pub trait Data {
    fn dim(&self, name: &str) -> i64;
    /// Captured tensor `capture`'s shape.
    fn shape(&self, capture: usize) -> &[usize];
    /// Its entry at `index` (in range), if the caller has its data.
    fn value(&self, capture: usize, index: &[usize]) -> Option<f64>;
}

/// A call that may fail.
#[derive(Clone, Debug, PartialEq)]
pub enum RangeFault {
    /// A read of `capture` at indices in these ranges, some outside its shape.
    Read { capture: usize, index: Vec<(i64, i64)> },
    /// Integer `expr` may be `value`, outside 32 bits.
    Overflow { expr: FExpr, value: i128 },
    /// A fault behind a condition that may go either way (on the logit or
    /// on an entry without data).
    Maybe(Box<RangeFault>),
}

impl RangeFault {
    fn maybe(self) -> RangeFault {
        match self {
            RangeFault::Maybe(_) => self,
            f => RangeFault::Maybe(Box::new(f)),
        }
    }
}

/// The range of `e` for arguments in `args`, or a fault some call may meet.
pub fn eval<D: Data>(e: &FExpr, args: &[Range], data: &D) -> Result<Range, RangeFault> {
    let go = |x: &FExpr| eval(x, args, data);
    let checked = |lo: i128, hi: i128| match (int32(lo), int32(hi)) {
        (Some(_), Some(_)) => Ok(Range::Int(lo, hi)),
        _ => Err(RangeFault::Overflow { expr: e.clone(), value: if int32(lo).is_none() { lo } else { hi } }),
    };
    Ok(match e {
        FExpr::Param(n) => args[*n],
        FExpr::Int(v) => checked(*v as i128, *v as i128)?,
        FExpr::Float(v) => Range::Float(Some(*v)),
        FExpr::Bool(v) => Range::Bool(*v, !*v),
        FExpr::Dim(d) => Range::int(data.dim(d)),
        FExpr::Read { capture, indices } => {
            let mut index = vec![];
            for x in indices {
                let Range::Int(lo, hi) = go(x)? else { unreachable!("an index is an int") };
                index.push((lo as i64, hi as i64));
            }
            let shape = data.shape(*capture);
            if index.iter().zip(shape).any(|((lo, hi), n)| *lo < 0 || *hi >= *n as i64) {
                return Err(RangeFault::Read { capture: *capture, index });
            }
            let point: Option<Vec<usize>> = index.iter().map(|(lo, hi)| (lo == hi).then_some(*lo as usize)).collect();
            Range::Float(point.and_then(|p| data.value(*capture, &p)))
        }
        FExpr::ReadBound { .. } => Range::Float(None),
        FExpr::ToFloat(x) => Range::Float(float(go(x)?)),
        FExpr::Neg(x) => match go(x)? {
            Range::Int(lo, hi) => checked(-hi, -lo)?,
            r => Range::Float(float(r).map(|v| -v)),
        },
        FExpr::Not(x) => match go(x)? {
            Range::Bool(t, f) => Range::Bool(f, t),
            _ => unreachable!("`not` of a bool"),
        },
        FExpr::Unary(op, x) => match go(x)? {
            Range::Int(lo, hi) if lo >= 0 => Range::Int(lo, hi),
            Range::Int(lo, hi) if hi <= 0 => checked(-hi, -lo)?,
            Range::Int(lo, hi) => checked(0, (-lo).max(hi))?,
            r => Range::Float(float(r).map(|v| scalar::unary(*op, v))),
        },
        FExpr::Where(c, a, b) => match go(c)? {
            Range::Bool(true, false) => go(a)?,
            Range::Bool(false, true) => go(b)?,
            _ => go(a).map_err(RangeFault::maybe)?.join(go(b).map_err(RangeFault::maybe)?),
        },
        FExpr::Bin(op, a, b) => {
            let (x, y) = (go(a)?, go(b)?);
            if let (Some(x), Some(y)) = (x.point(), y.point()) {
                return match binary(*op, x, y) {
                    Exact::Int(v) => checked(v, v),
                    Exact::Val(v) => Ok(of(v)),
                };
            }
            match (x, y) {
                (Range::Int(al, ah), Range::Int(bl, bh)) => match int_range(*op, (al, ah), (bl, bh)) {
                    Ok((lo, hi)) => checked(lo, hi)?,
                    Err(r) => r,
                },
                (Range::Bool(at, af), Range::Bool(bt, bf)) => match op {
                    FBin::And => Range::Bool(at && bt, af || bf),
                    FBin::Or => Range::Bool(at || bt, af && bf),
                    FBin::Eq => Range::Bool((at && bt) || (af && bf), (at && bf) || (af && bt)),
                    FBin::Ne => Range::Bool((at && bf) || (af && bt), (at && bt) || (af && bf)),
                    other => unreachable!("`{}` on bools", other.symbol()),
                },
                (x, y) => match (float(x), float(y)) {
                    (Some(x), Some(y)) => of(value_binary(*op, FVal::Float(x), FVal::Float(y))),
                    _ if op.is_comparison() => Range::Bool(true, true),
                    _ => Range::Float(None),
                },
            }
        }
    })
}

/// `op` on int ranges: the result's interval, or (comparisons) its bool range.
fn int_range(op: FBin, (al, ah): (i128, i128), (bl, bh): (i128, i128)) -> Result<(i128, i128), Range> {
    let ends = |f: &dyn Fn(i128, i128) -> i128| {
        let v = [f(al, bl), f(al, bh), f(ah, bl), f(ah, bh)];
        (*v.iter().min().unwrap(), *v.iter().max().unwrap())
    };
    Ok(match op {
        FBin::Add => (al + bl, ah + bh),
        FBin::Sub => (al - bh, ah - bl),
        FBin::Mul => ends(&|x, y| x * y),
        FBin::Max => (al.max(bl), ah.max(bh)),
        FBin::Min => (al.min(bl), ah.min(bh)),
        // By a non-zero constant ⌊x/c⌋ is monotone in x.
        FBin::FloorDiv if bl == bh && bl != 0 => ends(&|x, y| floor_div(x, y)),
        FBin::FloorDiv => {
            let m = al.abs().max(ah.abs());
            (-m, m)
        }
        // The sign of the divisor, smaller than it in magnitude; 0 by 0.
        FBin::Rem => (if bl < 0 { bl + 1 } else { 0 }, if bh > 0 { bh - 1 } else { 0 }),
        Lt | Le | Gt | Ge | Eq | Ne => return Err(compare(op, (al, ah), (bl, bh))),
        other => unreachable!("`{}` on ints", other.symbol()),
    })
}
use FBin::{Eq, Ge, Gt, Le, Lt, Ne};

/// Whether `x op y` may be true and may be false for x, y in the intervals.
fn compare(op: FBin, (al, ah): (i128, i128), (bl, bh): (i128, i128)) -> Range {
    let lt = (al < bh, ah >= bl);
    let le = (al <= bh, ah > bl);
    let (t, f) = match op {
        Lt => lt,
        Le => le,
        Gt => (bl < ah, bh >= al),
        Ge => (bl <= ah, bh > al),
        Eq => (al <= bh && bl <= ah, !(al == ah && bl == bh && al == bl)),
        _ => (!(al == ah && bl == bh && al == bl), al <= bh && bl <= ah),
    };
    Range::Bool(t, f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::func_eval::{self, Leaves};

    struct NoData;
    impl Data for NoData {
        fn dim(&self, _: &str) -> i64 {
            0
        }
        fn shape(&self, _: usize) -> &[usize] {
            &[]
        }
        fn value(&self, _: usize, _: &[usize]) -> Option<f64> {
            None
        }
    }
    impl Leaves for NoData {
        type Error = ();
        fn dim(&self, _: &str) -> i64 {
            0
        }
        fn read(&self, _: usize, _: Vec<i64>) -> Result<f64, ()> {
            Err(())
        }
        fn read_bound(&self, _: usize, _: &[i64], _: &[i64], _: bool) -> Result<f64, ()> {
            Err(())
        }
        fn overflow(&self, _: &FExpr, _: i128) {}
    }

    /// Every int operation over every pair of small intervals (and intervals
    /// at 32-bit edges) encloses each of its point results, and reports an
    /// overflow wherever one of them overflows.
    #[test]
    fn int_ranges_enclose_every_point() {
        let ops = [
            FBin::Add,
            FBin::Sub,
            FBin::Mul,
            FBin::FloorDiv,
            FBin::Rem,
            FBin::Max,
            FBin::Min,
            FBin::Lt,
            FBin::Le,
            FBin::Gt,
            FBin::Ge,
            FBin::Eq,
            FBin::Ne,
        ];
        let big = i32::MAX as i64;
        let mut ends: Vec<(i64, i64)> = vec![(big - 2, big), (-big - 1, -big + 1), (46340, 46341)];
        for lo in -4..=4 {
            for hi in lo..=4 {
                ends.push((lo, hi));
            }
        }
        let args =
            |a: (i64, i64), b: (i64, i64)| [Range::Int(a.0 as i128, a.1 as i128), Range::Int(b.0 as i128, b.1 as i128)];
        for op in ops {
            let e = FExpr::Bin(op, Box::new(FExpr::Param(0)), Box::new(FExpr::Param(1)));
            for &a in &ends {
                for &b in &ends {
                    let range = eval(&e, &args(a, b), &NoData);
                    for x in a.0..=a.1 {
                        for y in b.0..=b.1 {
                            let point = func_eval::eval(&e, &[FVal::Int(x), FVal::Int(y)], &NoData);
                            let what = format!("{} {x} {y} in {a:?} {b:?}: {range:?}", op.symbol());
                            match (point, range.clone()) {
                                (Err(()), r) => assert!(r.is_err(), "missed overflow: {what}"),
                                // Another point of the box overflows.
                                (Ok(_), Err(_)) => assert!(a.0 != a.1 || b.0 != b.1, "{what}"),
                                (Ok(FVal::Int(v)), Ok(Range::Int(lo, hi))) => {
                                    assert!(lo <= v as i128 && v as i128 <= hi, "{what}")
                                }
                                (Ok(FVal::Bool(v)), Ok(Range::Bool(t, f))) => assert!(if v { t } else { f }, "{what}"),
                                (p, r) => panic!("{what}: {p:?} against {r:?}"),
                            }
                        }
                    }
                }
            }
        }
    }
}
