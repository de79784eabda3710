//! Sizes and shapes: symbolic dims, shapes, node ids and broadcasting.

use super::*;
use std::fmt;

/// A size: `coeff × Π symᵉ`, e.g. `2·N` or `B·N`. Kept normalised (symbols
/// sorted, no zero exponents), so structural equality is size equality.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dim {
    coeff: u64,
    syms: Vec<(String, u32)>,
}

impl Dim {
    pub fn known(n: u64) -> Dim {
        Dim { coeff: n, syms: vec![] }
    }
    pub fn sym(name: &str) -> Dim {
        Dim { coeff: 1, syms: vec![(name.to_string(), 1)] }
    }
    /// The concrete size, when no symbol is involved.
    pub fn as_known(&self) -> Option<u64> {
        self.syms.is_empty().then_some(self.coeff)
    }
    pub fn coeff(&self) -> u64 {
        self.coeff
    }
    pub fn symbols(&self) -> impl Iterator<Item = (&str, u32)> {
        self.syms.iter().map(|(s, e)| (s.as_str(), *e))
    }
    pub fn mul(&self, other: &Dim) -> Option<Dim> {
        let mut syms: BTreeMap<String, u32> = self.syms.iter().cloned().collect();
        for (s, e) in &other.syms {
            *syms.entry(s.clone()).or_default() += e;
        }
        Some(Dim { coeff: self.coeff.checked_mul(other.coeff)?, syms: syms.into_iter().collect() })
    }
    /// `self / n` when the coefficient divides exactly.
    pub fn div_exact(&self, n: u64) -> Option<Dim> {
        (n != 0 && self.coeff % n == 0).then(|| Dim { coeff: self.coeff / n, syms: self.syms.clone() })
    }
    /// The concrete size under a binding of every symbol.
    pub fn eval(&self, bind: &impl Fn(&str) -> Option<u64>) -> Option<u64> {
        let mut v = self.coeff;
        for (s, e) in &self.syms {
            for _ in 0..*e {
                v = v.checked_mul(bind(s)?)?;
            }
        }
        Some(v)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        if self.coeff != 1 || self.syms.is_empty() {
            parts.push(self.coeff.to_string());
        }
        for (s, e) in &self.syms {
            parts.extend(std::iter::repeat_n(s.clone(), *e as usize));
        }
        f.write_str(&parts.join("*"))
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
