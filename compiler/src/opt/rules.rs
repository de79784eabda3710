//! The rewrite rules, one table. Each rule is sound on its own (the property
//! tests hold every rule to the float64 interpreter); `<=>` rules hold in both
//! directions. Rules whose right side needs sizes read them from the analysis.

use super::analysis::{cols, shape, TensorAnalysis, TensorGraph};
use super::lang::TensorLang;
use crate::ir::Dim;
use egg::{rewrite as rw, Applier, Id, Language, Pattern, PatternAst, Rewrite, Searcher, Subst, Symbol, Var};

pub type Rule = Rewrite<TensorLang, TensorAnalysis>;

fn var(s: &str) -> Var {
    s.parse().expect("pattern variable")
}

/// Rules by family; `rules()` is all of them.
#[rustfmt::skip]
pub fn rules() -> Vec<Rule> {
    let mut rules: Vec<Rule> = vec![
        // Head mixing after a head split is a column map before it (docs/semantics.md §2).
        Rewrite::new("mix-heads-to-cols", pattern("(mix_heads (split_heads ?y ?h) ?a)"), MixToCols).unwrap(),
        Rewrite::new("cols-to-mix-heads", pattern("(unflatten_heads (split_heads (mix_cols ?y ?a) ?hp) ?p)"), ColsToMix).unwrap(),
        // Collapse before a head merge is a column map after it.
        rw!("collapse-to-cols"; "(merge_heads (collapse ?x ?r))" => "(collapse_cols (merge_heads (flatten_heads ?x)) ?r)"),
        rw!("cols-to-collapse"; "(collapse_cols (merge_heads (flatten_heads ?x)) ?r)" => "(merge_heads (collapse ?x ?r))"),
        // Column slices commute with a right multiplication.
        rw!("slice-into-matmul"; "(slice_cols (matmul ?x ?w) ?s ?n)" => "(matmul ?x (slice_cols ?w ?s ?n))"),
        rw!("slice-out-of-matmul"; "(matmul ?x (slice_cols ?w ?s ?n))" => "(slice_cols (matmul ?x ?w) ?s ?n)"),
        rw!("slice-concat-left"; "(slice_cols (concat_cols ?a ?b) 0 ?n)" => "?a" if cols_are("?a", "?n")),
        Rewrite::new("slice-concat-right", pattern("(slice_cols (concat_cols ?a ?b) ?s ?n)"), SliceRight).unwrap(),
        // Merge projections of the same activations into one GEMM on concatenated weights.
        Rewrite::new("merge-projections", MergeSearcher, MergeProjections).unwrap(),
    ];
    rules.extend(fold_rules());
    rules
}

/// Associativity of a column map with the GEMM before it: what folds mixing
/// into the projection weight and the collapse into the output weight.
#[rustfmt::skip]
pub fn fold_rules() -> Vec<Rule> {
    vec![
        rw!("fold-mix-into-weight";   "(mix_cols (matmul ?x ?w) ?a)"           => "(matmul ?x (mix_cols ?w ?a))"),
        rw!("unfold-mix-from-weight"; "(matmul ?x (mix_cols ?w ?a))"           => "(mix_cols (matmul ?x ?w) ?a)"),
        rw!("fold-collapse-into-weight";   "(matmul (collapse_cols ?y ?r) ?w)" => "(matmul ?y (collapse_rows ?w ?r))"),
        rw!("unfold-collapse-from-weight"; "(matmul ?y (collapse_rows ?w ?r))" => "(matmul (collapse_cols ?y ?r) ?w)"),
    ]
}

fn pattern(s: &str) -> Pattern<TensorLang> {
    s.parse().expect("rule pattern")
}

/// Guard: the last axis of `?a` has `?n` columns.
fn cols_are(a: &str, n: &str) -> impl Fn(&mut TensorGraph, Id, &Subst) -> bool {
    let (a, n) = (var(a), var(n));
    move |g, _, s| cols(g, s[a]).is_some() && cols(g, s[a]) == g[s[n]].data.num
}

/// Adds `to` (a pattern over the matched variables) and unions it with the match.
fn union_with(g: &mut TensorGraph, eclass: Id, subst: &Subst, to: &str, rule: Symbol) -> Vec<Id> {
    let to: Pattern<TensorLang> = to.parse().expect("applier pattern");
    let new = add_pattern(g, &to.ast, subst);
    if g.union_trusted(eclass, new, rule) {
        vec![new]
    } else {
        vec![]
    }
}

fn add_pattern(g: &mut TensorGraph, ast: &PatternAst<TensorLang>, subst: &Subst) -> Id {
    let mut ids: Vec<Id> = Vec::with_capacity(ast.as_ref().len());
    for node in ast.as_ref() {
        let id = match node {
            egg::ENodeOrVar::Var(v) => subst[*v],
            egg::ENodeOrVar::ENode(n) => {
                let n = n.clone().map_children(|c| ids[usize::from(c)]);
                g.add(n)
            }
        };
        ids.push(id);
    }
    *ids.last().unwrap()
}

/// `mix_heads(split_heads(y, M), α[M, H, P])` → `unflatten_heads(split_heads(mix_cols(y, α), H·P), P)`.
struct MixToCols;
impl Applier<TensorLang, TensorAnalysis> for MixToCols {
    fn apply_one(
        &self,
        g: &mut TensorGraph,
        eclass: Id,
        subst: &Subst,
        _: Option<&PatternAst<TensorLang>>,
        rule: Symbol,
    ) -> Vec<Id> {
        let a = shape(g, subst[var("?a")]).clone();
        let (Some(h), Some(p)) = (a.0[1].as_known(), a.0[2].as_known()) else { return vec![] };
        union_with(g, eclass, subst, &format!("(unflatten_heads (split_heads (mix_cols ?y ?a) {}) {p})", h * p), rule)
    }
}

/// The inverse of [`MixToCols`], when the split and unflatten sizes are α's.
struct ColsToMix;
impl Applier<TensorLang, TensorAnalysis> for ColsToMix {
    fn apply_one(
        &self,
        g: &mut TensorGraph,
        eclass: Id,
        subst: &Subst,
        _: Option<&PatternAst<TensorLang>>,
        rule: Symbol,
    ) -> Vec<Id> {
        let a = shape(g, subst[var("?a")]).clone();
        let known: Vec<Option<u64>> = a.0.iter().map(Dim::as_known).collect();
        let [Some(m), Some(h), Some(p)] = known[..] else { return vec![] };
        if g[subst[var("?hp")]].data.num != Some(h * p) || g[subst[var("?p")]].data.num != Some(p) {
            return vec![];
        }
        union_with(g, eclass, subst, &format!("(mix_heads (split_heads ?y {m}) ?a)"), rule)
    }
}

/// `slice_cols(concat_cols(a, b), cols(a), cols(b))` → `b`.
struct SliceRight;
impl Applier<TensorLang, TensorAnalysis> for SliceRight {
    fn apply_one(
        &self,
        g: &mut TensorGraph,
        eclass: Id,
        subst: &Subst,
        _: Option<&PatternAst<TensorLang>>,
        rule: Symbol,
    ) -> Vec<Id> {
        let (a, b) = (subst[var("?a")], subst[var("?b")]);
        let (s, n) = (g[subst[var("?s")]].data.num, g[subst[var("?n")]].data.num);
        if cols(g, a).is_some() && s == cols(g, a) && n == cols(g, b) && g.union_trusted(eclass, b, rule) {
            vec![b]
        } else {
            vec![]
        }
    }
}

/// Finds pairs `matmul(x, w1)`, `matmul(x, w2)` of one activation `x` whose
/// weights are an input (or a column concatenation of inputs) and a later
/// input, so that each set of weights is merged in one order only.
struct MergeSearcher;

impl MergeSearcher {
    /// Every `(class, x, w)` of a matmul node, canonical ids.
    fn matmuls(g: &TensorGraph) -> Vec<(Id, Id, Id)> {
        let mut out = vec![];
        for class in g.classes() {
            for node in &class.nodes {
                if let TensorLang::MatMul([x, w]) = node {
                    out.push((class.id, g.find(*x), g.find(*w)));
                }
            }
        }
        out.sort();
        out
    }

    fn pairs(
        g: &TensorGraph,
        first: &[(Id, Id, Id)],
        all: &[(Id, Id, Id)],
        limit: usize,
    ) -> Vec<egg::SearchMatches<'static, TensorLang>> {
        let mut by_class: std::collections::BTreeMap<Id, Vec<Subst>> = Default::default();
        let mut count = 0;
        for &(class, x, w1) in first {
            let Some(left) = &g[w1].data.concat_of else { continue };
            for &(other, x2, w2) in all {
                let Some([j]) = g[w2].data.concat_of.as_deref() else { continue };
                if x2 != x || w2 == w1 || left.iter().any(|i| i >= j) || count >= limit {
                    continue;
                }
                let mut s = Subst::with_capacity(4);
                s.insert(var("?x"), x);
                s.insert(var("?w1"), w1);
                s.insert(var("?w2"), w2);
                s.insert(var("?other"), other);
                by_class.entry(class).or_default().push(s);
                count += 1;
            }
        }
        by_class.into_iter().map(|(eclass, substs)| egg::SearchMatches { eclass, substs, ast: None }).collect()
    }
}

impl Searcher<TensorLang, TensorAnalysis> for MergeSearcher {
    fn search_eclass_with_limit(
        &self,
        g: &TensorGraph,
        eclass: Id,
        limit: usize,
    ) -> Option<egg::SearchMatches<'_, TensorLang>> {
        let all = Self::matmuls(g);
        let first: Vec<_> = all.iter().copied().filter(|(c, _, _)| *c == g.find(eclass)).collect();
        Self::pairs(g, &first, &all, limit).into_iter().next()
    }

    fn search_with_limit(&self, g: &TensorGraph, limit: usize) -> Vec<egg::SearchMatches<'_, TensorLang>> {
        let all = Self::matmuls(g);
        Self::pairs(g, &all, &all, limit)
    }

    fn vars(&self) -> Vec<Var> {
        vec![var("?x"), var("?w1"), var("?w2"), var("?other")]
    }
}

/// `matmul(x, w1)` and `matmul(x, w2)` become the two column slices of `matmul(x, concat_cols(w1, w2))`.
struct MergeProjections;
impl Applier<TensorLang, TensorAnalysis> for MergeProjections {
    fn apply_one(
        &self,
        g: &mut TensorGraph,
        eclass: Id,
        subst: &Subst,
        _: Option<&PatternAst<TensorLang>>,
        rule: Symbol,
    ) -> Vec<Id> {
        let (Some(n1), Some(n2)) = (cols(g, subst[var("?w1")]), cols(g, subst[var("?w2")])) else { return vec![] };
        let other = subst[var("?other")];
        let mut added =
            union_with(g, eclass, subst, &format!("(slice_cols (matmul ?x (concat_cols ?w1 ?w2)) 0 {n1})"), rule);
        added.extend(union_with(
            g,
            other,
            subst,
            &format!("(slice_cols (matmul ?x (concat_cols ?w1 ?w2)) {n1} {n2})"),
            rule,
        ));
        added
    }
}
