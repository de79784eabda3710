//! Sizes and shapes: symbolic dims, shapes, node ids and broadcasting.

use super::*;
use std::fmt;

/// A monomial: dims with their exponents, sorted by name (empty: the constant term).
type Monomial = Vec<(String, u32)>;

/// A size: a polynomial in the dims with integer coefficients, e.g. `2·N`,
/// `B·N` or `(N − 1)·P + P`. Kept normalised (terms sorted by monomial, no
/// zero coefficients, symbols sorted, no zero exponents), so structural
/// equality is equality as polynomials: the sizes are equal at every binding.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dim {
    terms: Vec<(Monomial, i64)>,
}

impl Dim {
    pub fn known(n: u64) -> Dim {
        Dim::normal(vec![(vec![], n as i64)])
    }
    pub fn sym(name: &str) -> Dim {
        Dim { terms: vec![(vec![(name.to_string(), 1)], 1)] }
    }
    /// Sorts and merges terms, dropping zero coefficients.
    fn normal(terms: Vec<(Monomial, i64)>) -> Dim {
        let mut merged: BTreeMap<Monomial, i64> = BTreeMap::new();
        for (m, c) in terms {
            *merged.entry(m).or_default() += c;
        }
        Dim { terms: merged.into_iter().filter(|(_, c)| *c != 0).collect() }
    }
    /// The concrete size, when no symbol is involved and it is not negative.
    pub fn as_known(&self) -> Option<u64> {
        match &self.terms[..] {
            [] => Some(0),
            [(m, c)] if m.is_empty() => u64::try_from(*c).ok(),
            _ => None,
        }
    }
    /// The terms: each coefficient with its dims and their exponents.
    pub fn terms(&self) -> impl Iterator<Item = (i64, &[(String, u32)])> {
        self.terms.iter().map(|(m, c)| (*c, m.as_slice()))
    }
    pub fn mul(&self, other: &Dim) -> Option<Dim> {
        let mut terms = vec![];
        for (ma, ca) in &self.terms {
            for (mb, cb) in &other.terms {
                let mut syms: BTreeMap<String, u32> = ma.iter().cloned().collect();
                for (s, e) in mb {
                    *syms.entry(s.clone()).or_default() += e;
                }
                terms.push((syms.into_iter().collect(), ca.checked_mul(*cb)?));
            }
        }
        Some(Dim::normal(terms))
    }
    pub fn add(&self, other: &Dim) -> Dim {
        Dim::normal(self.terms.iter().chain(&other.terms).cloned().collect())
    }
    pub fn sub(&self, other: &Dim) -> Dim {
        Dim::normal(self.terms.iter().cloned().chain(other.terms.iter().map(|(m, c)| (m.clone(), -c))).collect())
    }
    /// `self / n` when every coefficient divides exactly.
    pub fn div_exact(&self, n: u64) -> Option<Dim> {
        let n = i64::try_from(n).ok().filter(|n| *n != 0)?;
        self.terms
            .iter()
            .all(|(_, c)| c % n == 0)
            .then(|| Dim { terms: self.terms.iter().map(|(m, c)| (m.clone(), c / n)).collect() })
    }
    /// The value under a binding of every symbol; `None` when a symbol is
    /// unbound, the value overflows or it is negative.
    pub fn eval(&self, bind: &impl Fn(&str) -> Option<u64>) -> Option<u64> {
        u64::try_from(self.signed(bind)?).ok()
    }
    /// Whether the value under a binding of every symbol is below zero (a
    /// difference of sizes at small dims); an overflow is not.
    pub fn negative_at(&self, bind: &impl Fn(&str) -> Option<u64>) -> bool {
        self.signed(bind).is_some_and(|v| v < 0)
    }
    fn signed(&self, bind: &impl Fn(&str) -> Option<u64>) -> Option<i64> {
        let mut total: i64 = 0;
        for (m, c) in &self.terms {
            let mut v = *c;
            for (s, e) in m {
                let x = i64::try_from(bind(s)?).ok()?;
                for _ in 0..*e {
                    v = v.checked_mul(x)?;
                }
            }
            total = total.checked_add(v)?;
        }
        Some(total)
    }
    /// The value with every dim at 1, the least size a product of dims can take.
    pub fn at_ones(&self) -> i64 {
        self.terms.iter().map(|(_, c)| *c).sum()
    }
    /// The dims this size mentions.
    pub fn symbols(&self) -> impl Iterator<Item = &str> {
        let names: std::collections::BTreeSet<&str> =
            self.terms.iter().flat_map(|(m, _)| m.iter().map(|(s, _)| s.as_str())).collect();
        names.into_iter()
    }
    /// With every dim bound but one, `x`, which appears only to the first
    /// power: `(x, a, c)` such that the size is `a·x + c` (`a ≠ 0`).
    pub fn linear_in(&self, bound: &impl Fn(&str) -> Option<u64>) -> Option<(String, i64, i64)> {
        let unknown: Vec<&str> = self.symbols().filter(|s| bound(s).is_none()).collect();
        let [x] = unknown[..] else { return None };
        let (mut a, mut c) = (0i64, 0i64);
        for (m, coeff) in &self.terms {
            let mut v = *coeff;
            let mut has_x = false;
            for (s, e) in m {
                if s == x {
                    if *e != 1 {
                        return None;
                    }
                    has_x = true;
                } else {
                    for _ in 0..*e {
                        v = v.checked_mul(i64::try_from(bound(s)?).ok()?)?;
                    }
                }
            }
            if has_x {
                a = a.checked_add(v)?;
            } else {
                c = c.checked_add(v)?;
            }
        }
        (a != 0).then(|| (x.to_string(), a, c))
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        // Terms with dims first, those added before those subtracted, the
        // constant last: `N*P - P`, `2*N - 1`, `N - K`.
        let with_dims = |positive: bool| self.terms.iter().filter(move |(m, c)| !m.is_empty() && (*c > 0) == positive);
        let ordered = with_dims(true).chain(with_dims(false)).chain(self.terms.iter().filter(|(m, _)| m.is_empty()));
        for (k, (m, c)) in ordered.enumerate() {
            let mut parts: Vec<String> = Vec::new();
            if c.unsigned_abs() != 1 || m.is_empty() {
                parts.push(c.unsigned_abs().to_string());
            }
            for (s, e) in m {
                parts.extend(std::iter::repeat_n(s.clone(), *e as usize));
            }
            let sign = match (k, *c < 0) {
                (0, false) => "",
                (0, true) => "-",
                (_, false) => " + ",
                (_, true) => " - ",
            };
            write!(f, "{sign}{}", parts.join("*"))?;
        }
        Ok(())
    }
}

/// Concrete values of a program's dims.
pub type DimValues = BTreeMap<String, u64>;

/// The concrete shape of `s` under `dims`. Every dim must be bound.
pub fn concrete(s: &Shape, dims: &DimValues) -> Vec<usize> {
    s.0.iter()
        .map(|d| d.eval(&|n| dims.get(n).copied()).expect("every dim is bound before evaluation") as usize)
        .collect()
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    /// Axis `i` counted from the end (`back(1)` is the last axis).
    pub fn back(&self, i: usize) -> &Dim {
        &self.0[self.0.len() - i]
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.0.iter().map(Dim::to_string).collect();
        write!(f, "[{}]", dims.join(", "))
    }
}

/// A handle to a node of a [`Program`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// The numpy broadcast of two shapes.
pub fn broadcast(a: &Shape, b: &Shape) -> Result<Shape, String> {
    let rank = a.rank().max(b.rank());
    let one = Dim::known(1);
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = if i < rank - a.rank() { &one } else { &a.0[i - (rank - a.rank())] };
        let db = if i < rank - b.rank() { &one } else { &b.0[i - (rank - b.rank())] };
        out.push(if da == db || *db == one {
            da.clone()
        } else if *da == one {
            db.clone()
        } else {
            return Err(format!("shapes {a} and {b} do not broadcast"));
        });
    }
    Ok(Shape(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n() -> Dim {
        Dim::sym("N")
    }

    #[test]
    fn sizes_are_polynomials_equal_when_equal_as_polynomials() {
        let p = Dim::known(3);
        // (N - 1)·3 + 3 = 3·N, whatever N is.
        let cache = n().sub(&Dim::known(1)).mul(&p).unwrap();
        assert_eq!(cache.add(&p), n().mul(&p).unwrap());
        assert_ne!(cache, n().mul(&p).unwrap());
        assert_eq!(cache.to_string(), "3*N - 3");
        assert_eq!(n().sub(&Dim::sym("K")).to_string(), "N - K");
        assert_eq!(Dim::known(2).mul(&n()).unwrap().sub(&Dim::known(1)).to_string(), "2*N - 1");
        assert_eq!(cache.div_exact(3), Some(n().sub(&Dim::known(1))));
        assert_eq!(cache.div_exact(2), None);
        let at = |v: u64| move |s: &str| (s == "N").then_some(v);
        assert_eq!(cache.eval(&at(5)), Some(12));
        assert_eq!(cache.eval(&at(1)), Some(0));
        assert_eq!(cache.eval(&at(0)), None, "a negative size has no value");
        assert!(cache.negative_at(&at(0)) && !cache.negative_at(&at(1)));
        assert_eq!(Dim::known(7).sub(&Dim::known(7)).as_known(), Some(0));
    }

    #[test]
    fn a_dim_is_solved_from_an_axis_linear_in_it() {
        // 2·N·P - 1 with P = 4 bound: a = 8, c = -1.
        let d = Dim::known(2).mul(&n()).unwrap().mul(&Dim::sym("P")).unwrap().sub(&Dim::known(1));
        let bound = |s: &str| (s == "P").then_some(4);
        assert_eq!(d.linear_in(&bound), Some(("N".to_string(), 8, -1)));
        // Squares and two unknowns are not solved.
        assert_eq!(n().mul(&n()).unwrap().linear_in(&|_| None), None);
        assert_eq!(n().add(&Dim::sym("M")).linear_in(&|_| None), None);
        assert_eq!(Dim::known(4).linear_in(&|_| None), None);
    }
}
