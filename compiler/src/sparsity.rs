//! Block sparsity derived from a mask function: interval arithmetic over
//! the function turns `mask(b, h, i, j)` into two functions of a tile,
//! `(b, h, i0, i1, j0, j1)` (query rows `i0..=i1`, key rows `j0..=j1`):
//! whether some pair of the tile may be seen (`any`) and whether some pair
//! may be hidden (`hidden`). A tile where `any` is false is empty and never
//! loaded; where `hidden` is false it is full and the mask is not evaluated;
//! otherwise the kernel evaluates the mask per pair.
//!
//! The method is sound, not exact: each bound encloses every value the
//! sub-expression takes over the tile (`tests/functions.rs` holds it to the
//! mask evaluated at every pair), so `any = false` and `hidden = false` are
//! never wrong, but a tile may be called partial when it is not. What has
//! no useful bound (a product of two indices, `sin`, division by a
//! non-constant) is unbounded, and a comparison with it may go either way.
//! Reads of a captured tensor are bounded by its minimum and maximum over
//! the box of indices the tile reaches (`FExpr::ReadBound`, computed by
//! the kernel from the data, up to `READ_BOX` entries): a document mask
//! skips the tiles of other documents.

use crate::ir::{FBin, FExpr, FType, Func, FuncKind, UnaryOp};

/// A tile's two functions: `any` (some pair may be seen) and `hidden`
/// (some pair may be hidden).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TileFns {
    pub any: Func,
    pub hidden: Func,
}

/// The tile functions of a mask function.
pub fn tile_fns(mask: &Func) -> TileFns {
    assert_eq!(mask.kind, FuncKind::Mask);
    let (any, hidden) = match bounds(&mask.body) {
        Bound::Bool(t, f) => (t, f),
        _ => unreachable!("a mask function is boolean"),
    };
    let params: Vec<String> = FuncKind::Tile.param_names().iter().map(|p| p.to_string()).collect();
    TileFns {
        any: Func { kind: FuncKind::Tile, params: params.clone(), body: any },
        hidden: Func { kind: FuncKind::Tile, params, body: hidden },
    }
}

/// An enclosure of a sub-expression over a tile: an interval of ints or
/// floats (`None` when unbounded), or for a bool whether it may be true and
/// whether it may be false.
enum Bound {
    Int(Option<(FExpr, FExpr)>),
    Float(Option<(FExpr, FExpr)>),
    Bool(FExpr, FExpr),
}

fn b(x: FExpr) -> Box<FExpr> {
    Box::new(x)
}

fn bin(op: FBin, x: FExpr, y: FExpr) -> FExpr {
    FExpr::Bin(op, b(x), b(y))
}

fn and(x: FExpr, y: FExpr) -> FExpr {
    match (&x, &y) {
        (FExpr::Bool(true), _) => y,
        (_, FExpr::Bool(true)) => x,
        (FExpr::Bool(false), _) | (_, FExpr::Bool(false)) => FExpr::Bool(false),
        _ => bin(FBin::And, x, y),
    }
}

fn or(x: FExpr, y: FExpr) -> FExpr {
    match (&x, &y) {
        (FExpr::Bool(false), _) => y,
        (_, FExpr::Bool(false)) => x,
        (FExpr::Bool(true), _) | (_, FExpr::Bool(true)) => FExpr::Bool(true),
        _ => bin(FBin::Or, x, y),
    }
}

/// The constant value of an interval's end, if it is a literal.
fn literal(x: &FExpr) -> Option<f64> {
    match x {
        FExpr::Int(v) => Some(*v as f64),
        FExpr::Float(v) => Some(*v),
        _ => None,
    }
}

/// An interval's ends as one type; `int` when both are.
fn interval(bound: Bound) -> (Option<(FExpr, FExpr)>, bool) {
    match bound {
        Bound::Int(i) => (i, true),
        Bound::Float(f) => (f, false),
        Bound::Bool(..) => unreachable!("a number was expected"),
    }
}

fn number(int: bool, i: Option<(FExpr, FExpr)>) -> Bound {
    if int {
        Bound::Int(i)
    } else {
        Bound::Float(i)
    }
}

/// Tile parameters: `b, h, i0, i1, j0, j1`; the mask's `b, h, i, j` are
/// the points `[b, b]`, `[h, h]` and the intervals `[i0, i1]`, `[j0, j1]`.
fn param(n: usize) -> Bound {
    let p = |k| FExpr::Param(k);
    match n {
        0 => Bound::Int(Some((p(0), p(0)))),
        1 => Bound::Int(Some((p(1), p(1)))),
        2 => Bound::Int(Some((p(2), p(3)))),
        3 => Bound::Int(Some((p(4), p(5)))),
        _ => unreachable!("a mask function has four parameters"),
    }
}

fn bounds(e: &FExpr) -> Bound {
    match e {
        FExpr::Param(n) => param(*n),
        FExpr::Int(_) | FExpr::Dim(_) => Bound::Int(Some((e.clone(), e.clone()))),
        FExpr::Float(_) => Bound::Float(Some((e.clone(), e.clone()))),
        FExpr::Bool(v) => Bound::Bool(FExpr::Bool(*v), FExpr::Bool(!*v)),
        FExpr::ReadBound { .. } => unreachable!("bounds are taken of mask functions"),
        FExpr::Read { capture, indices } => {
            let mut lo = vec![];
            let mut hi = vec![];
            for x in indices {
                match interval(bounds(x)).0 {
                    Some((l, h)) => {
                        lo.push(l);
                        hi.push(h);
                    }
                    None => return Bound::Float(None),
                }
            }
            let read = |max| FExpr::ReadBound { capture: *capture, lo: lo.clone(), hi: hi.clone(), max };
            Bound::Float(Some((read(false), read(true))))
        }
        FExpr::ToFloat(x) => {
            Bound::Float(interval(bounds(x)).0.map(|(l, h)| (FExpr::ToFloat(b(l)), FExpr::ToFloat(b(h)))))
        }
        FExpr::Neg(x) => {
            let (i, int) = interval(bounds(x));
            number(int, i.map(|(l, h)| (FExpr::Neg(b(h)), FExpr::Neg(b(l)))))
        }
        FExpr::Not(x) => match bounds(x) {
            Bound::Bool(t, f) => Bound::Bool(f, t),
            _ => unreachable!("`not` of a bool"),
        },
        FExpr::Unary(op, x) => unary(*op, bounds(x)),
        FExpr::Where(c, x, y) => {
            let Bound::Bool(ct, cf) = bounds(c) else { unreachable!("a condition is a bool") };
            match (bounds(x), bounds(y)) {
                (Bound::Bool(xt, xf), Bound::Bool(yt, yf)) => {
                    Bound::Bool(or(and(ct.clone(), xt), and(cf.clone(), yt)), or(and(ct, xf), and(cf, yf)))
                }
                (x, y) => {
                    let ((xi, xint), (yi, yint)) = (interval(x), interval(y));
                    let int = xint && yint;
                    let (Some((xl, xh)), Some((yl, yh))) = (xi, yi) else { return number(int, None) };
                    let (xl, xh, yl, yh) =
                        if int { (xl, xh, yl, yh) } else { (to_float(xl), to_float(xh), to_float(yl), to_float(yh)) };
                    // Both branches possible: the hull; one: that branch's interval.
                    let pick = |x: FExpr, y: FExpr, hull: FExpr| {
                        FExpr::Where(
                            b(and(ct.clone(), cf.clone())),
                            b(hull),
                            b(FExpr::Where(b(ct.clone()), b(x), b(y))),
                        )
                    };
                    let lo = pick(xl.clone(), yl.clone(), bin(FBin::Min, xl, yl));
                    let hi = pick(xh.clone(), yh.clone(), bin(FBin::Max, xh, yh));
                    number(int, Some((lo, hi)))
                }
            }
        }
        // `x − x % c` is `c·⌊x/c⌋` (c > 0), which intervals bound exactly
        // where the difference of two bounds of `x` would not.
        FExpr::Bin(FBin::Sub, x, y) if rounded_down(x, y).is_some() => {
            let c = rounded_down(x, y).unwrap();
            bounds(&bin(FBin::Mul, FExpr::Int(c), bin(FBin::FloorDiv, (**x).clone(), FExpr::Int(c))))
        }
        FExpr::Bin(op, x, y) => binary(*op, bounds(x), bounds(y)),
    }
}

/// `c` where `y` is `x % c` with `c` a positive integer literal.
fn rounded_down(x: &FExpr, y: &FExpr) -> Option<i64> {
    match y {
        FExpr::Bin(FBin::Rem, a, c) if **a == *x => match **c {
            FExpr::Int(c) if c > 0 => Some(c),
            _ => None,
        },
        _ => None,
    }
}

/// An int end as a float end (a float end unchanged).
fn to_float(x: FExpr) -> FExpr {
    match x {
        FExpr::Float(_) => x,
        FExpr::Int(v) => FExpr::Float(v as f64),
        other if other.ty(FuncKind::Tile.params()) == FType::Int => FExpr::ToFloat(b(other)),
        other => other,
    }
}

fn unary(op: UnaryOp, x: Bound) -> Bound {
    let (i, int) = interval(x);
    let Some((l, h)) = i else {
        return if int && op == UnaryOp::Abs { Bound::Int(None) } else { Bound::Float(None) };
    };
    match op {
        UnaryOp::Abs => {
            // [max(l, −h, 0), max(−l, h)]: 0 when the interval holds it.
            let zero = if int { FExpr::Int(0) } else { FExpr::Float(0.0) };
            let lo = bin(FBin::Max, bin(FBin::Max, l.clone(), FExpr::Neg(b(h.clone()))), zero);
            let hi = bin(FBin::Max, FExpr::Neg(b(l)), h);
            number(int, Some((lo, hi)))
        }
        // Non-decreasing and defined everywhere: the ends map to the ends.
        UnaryOp::Exp
        | UnaryOp::Tanh
        | UnaryOp::Sigmoid
        | UnaryOp::Softplus
        | UnaryOp::Erf
        | UnaryOp::Floor
        | UnaryOp::Ceil
        | UnaryOp::Sign => {
            let f = |x: FExpr| FExpr::Unary(op, b(to_float(x)));
            Bound::Float(Some((f(l), f(h))))
        }
        // Not monotone, or not defined everywhere (a NaN end would compare false).
        UnaryOp::Neg
        | UnaryOp::Sqrt
        | UnaryOp::Log
        | UnaryOp::Log1p
        | UnaryOp::Silu
        | UnaryOp::Gelu
        | UnaryOp::GeluTanh
        | UnaryOp::Sin
        | UnaryOp::Cos => Bound::Float(None),
    }
}

fn binary(op: FBin, x: Bound, y: Bound) -> Bound {
    match (op, x, y) {
        (FBin::And, Bound::Bool(xt, xf), Bound::Bool(yt, yf)) => Bound::Bool(and(xt, yt), or(xf, yf)),
        (FBin::Or, Bound::Bool(xt, xf), Bound::Bool(yt, yf)) => Bound::Bool(or(xt, yt), and(xf, yf)),
        (FBin::Eq | FBin::Ne, Bound::Bool(xt, xf), Bound::Bool(yt, yf)) => {
            let same = or(and(xt.clone(), yt.clone()), and(xf.clone(), yf.clone()));
            let differ = or(and(xt, yf), and(xf, yt));
            if op == FBin::Eq {
                Bound::Bool(same, differ)
            } else {
                Bound::Bool(differ, same)
            }
        }
        (op, x, y) => {
            let ((xi, xint), (yi, yint)) = (interval(x), interval(y));
            let int = xint && yint;
            let unbounded = || {
                if op.is_comparison() {
                    Bound::Bool(FExpr::Bool(true), FExpr::Bool(true))
                } else {
                    number(int, None)
                }
            };
            let (Some((xl, xh)), Some((yl, yh))) = (xi, yi) else { return unbounded() };
            let (xl, xh, yl, yh) = if int || (op.is_comparison() && xint == yint) {
                (xl, xh, yl, yh)
            } else {
                (to_float(xl), to_float(xh), to_float(yl), to_float(yh))
            };
            numeric(op, int, (xl, xh), (yl, yh)).unwrap_or_else(unbounded)
        }
    }
}

/// `c · [lo, hi]` for the literal `c` (written `factor`).
fn scale(int: bool, c: f64, factor: FExpr, (lo, hi): (FExpr, FExpr)) -> Option<Bound> {
    let (lo, hi) = (bin(FBin::Mul, factor.clone(), lo), bin(FBin::Mul, factor, hi));
    Some(number(int, Some(if c >= 0.0 { (lo, hi) } else { (hi, lo) })))
}

/// `op` on intervals `x`, `y` (both ints when `int`); `None` when unbounded.
fn numeric(op: FBin, int: bool, (xl, xh): (FExpr, FExpr), (yl, yh): (FExpr, FExpr)) -> Option<Bound> {
    let n = |lo, hi| Some(number(int, Some((lo, hi))));
    let constant = literal(&yl).filter(|c| Some(*c) == literal(&yh));
    match op {
        FBin::Add => n(bin(FBin::Add, xl, yl), bin(FBin::Add, xh, yh)),
        FBin::Sub => n(bin(FBin::Sub, xl, yh), bin(FBin::Sub, xh, yl)),
        FBin::Max => n(bin(FBin::Max, xl, yl), bin(FBin::Max, xh, yh)),
        FBin::Min => n(bin(FBin::Min, xl, yl), bin(FBin::Min, xh, yh)),
        FBin::Mul if literal(&xl).is_some() && xl == xh => scale(int, literal(&xl)?, xl, (yl, yh)),
        FBin::Mul if constant.is_some() => scale(int, constant?, yl, (xl, xh)),
        FBin::Mul => {
            // The extremes of the four corner products.
            let corners = [
                bin(FBin::Mul, xl.clone(), yl.clone()),
                bin(FBin::Mul, xl, yh.clone()),
                bin(FBin::Mul, xh.clone(), yl),
                bin(FBin::Mul, xh, yh),
            ];
            let fold = |op| corners.iter().cloned().reduce(|a, c| bin(op, a, c)).unwrap();
            n(fold(FBin::Min), fold(FBin::Max))
        }
        FBin::Div => {
            let c = constant.filter(|c| *c != 0.0)?;
            let (l, h) = (bin(FBin::Div, xl, FExpr::Float(c)), bin(FBin::Div, xh, FExpr::Float(c)));
            if c > 0.0 {
                Some(Bound::Float(Some((l, h))))
            } else {
                Some(Bound::Float(Some((h, l))))
            }
        }
        FBin::FloorDiv => {
            let c = constant.filter(|c| *c != 0.0)? as i64;
            let fd = |x| bin(FBin::FloorDiv, x, FExpr::Int(c));
            if c > 0 {
                n(fd(xl), fd(xh))
            } else {
                n(fd(xh), fd(xl))
            }
        }
        FBin::Rem => {
            let c = constant.filter(|c| *c > 0.0)? as i64;
            // Within one period the remainder is the interval shifted; across periods, all of 0..c.
            let period = |x: FExpr| bin(FBin::FloorDiv, x, FExpr::Int(c));
            let one = bin(FBin::Eq, period(xl.clone()), period(xh.clone()));
            let base = bin(FBin::Mul, FExpr::Int(c), period(xl.clone()));
            let lo = FExpr::Where(b(one.clone()), b(bin(FBin::Sub, xl, base.clone())), b(FExpr::Int(0)));
            let hi = FExpr::Where(b(one), b(bin(FBin::Sub, xh, base)), b(FExpr::Int(c - 1)));
            n(lo, hi)
        }
        FBin::Pow => None,
        FBin::Lt => Some(Bound::Bool(bin(FBin::Lt, xl, yh), bin(FBin::Ge, xh, yl))),
        FBin::Le => Some(Bound::Bool(bin(FBin::Le, xl, yh), bin(FBin::Gt, xh, yl))),
        FBin::Gt => Some(Bound::Bool(bin(FBin::Gt, xh, yl), bin(FBin::Le, xl, yh))),
        FBin::Ge => Some(Bound::Bool(bin(FBin::Ge, xh, yl), bin(FBin::Lt, xl, yh))),
        FBin::Eq | FBin::Ne => {
            let overlap = and(bin(FBin::Le, xl.clone(), yh.clone()), bin(FBin::Le, yl.clone(), xh.clone()));
            let point = and(and(bin(FBin::Eq, xl.clone(), xh), bin(FBin::Eq, yl.clone(), yh)), bin(FBin::Eq, xl, yl));
            let differ = FExpr::Not(b(point));
            Some(if op == FBin::Eq { Bound::Bool(overlap, differ) } else { Bound::Bool(differ, overlap) })
        }
        FBin::And | FBin::Or => unreachable!("logic on numbers"),
    }
}

/// The tile functions' reads of captured tensors (`FExpr::ReadBound`), each
/// once: those the same for every tile of the other side (`keys`: the
/// tiles are of key rows, so reads not using `j0`, `j1`; else not using
/// `i0`, `i1`), which a kernel reads once per cube, and the rest, read per tile.
pub fn reads(t: &TileFns, keys: bool) -> (Vec<FExpr>, Vec<FExpr>) {
    let tiled = if keys { [4, 5] } else { [2, 3] };
    let (mut once, mut each) = (vec![], vec![]);
    for f in [&t.any, &t.hidden] {
        f.body.walk(&mut |e| {
            if let FExpr::ReadBound { .. } = e {
                let mut varies = false;
                e.walk(&mut |x| varies |= matches!(x, FExpr::Param(p) if tiled.contains(p)));
                let list = if varies { &mut each } else { &mut once };
                if !list.contains(e) {
                    list.push(e.clone());
                }
            }
        });
    }
    (once, each)
}

/// Loop iterations the reads of `t` add to a cube of `rows` rows walking
/// `tiles` tiles of `tile` rows of the other side (`keys` as in [`reads`]):
/// each read scans its box, bounded by the rows it spans (`READ_BOX` where
/// its extent is not one of the tile's ranges).
pub fn read_trips(t: &TileFns, rows: usize, tile: usize, tiles: usize, keys: bool) -> usize {
    let (q, k) = if keys { (rows, tile) } else { (tile, rows) };
    let scan = |e: &FExpr| {
        let FExpr::ReadBound { lo, hi, .. } = e else { unreachable!("reads are ReadBounds") };
        let extent = |(l, h): (&FExpr, &FExpr)| match (l, h) {
            _ if l == h => 1,
            (FExpr::Param(2), FExpr::Param(3)) => q,
            (FExpr::Param(4), FExpr::Param(5)) => k,
            _ => crate::ir::READ_BOX,
        };
        lo.iter().zip(hi).map(extent).product::<usize>().min(crate::ir::READ_BOX) + 1
    };
    let (once, each) = reads(t, keys);
    once.iter().map(scan).sum::<usize>() + tiles * each.iter().map(scan).sum::<usize>()
}
