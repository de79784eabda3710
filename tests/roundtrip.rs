//! `parse(print(spec)) == spec` over randomly generated syntax trees.

use attnc_grammar::ast::*;
use attnc_grammar::{parse, print_spec};
use proptest::prelude::*;

const NAMES: &[&str] = &["x", "H", "P", "d", "w_q", "alpha", "mask", "N", "_t0", "nonempty", "spec_like", "dims"];

fn ident() -> impl Strategy<Value = Ident> {
    prop::sample::select(NAMES).prop_map(|n| Ident { name: n.to_string(), span: Span::default() })
}

fn e(kind: ExprKind) -> Expr {
    Expr { kind, span: Span::default() }
}

fn expr() -> impl Strategy<Value = Expr> {
    let leaf = prop_oneof![
        (0..1_000_000i64).prop_map(|v| e(ExprKind::Int(v))),
        prop_oneof![0.0..1e6f64, 1e-9..1e-3f64, Just(1e21), Just(0.5)].prop_map(|v| e(ExprKind::Float(v))),
        any::<bool>().prop_map(|b| e(ExprKind::Bool(b))),
        Just(e(ExprKind::None)),
        ident().prop_map(|i| e(ExprKind::Name(i.name))),
    ];
    leaf.prop_recursive(5, 48, 4, |inner| {
        let binop = prop::sample::select(vec![
            BinOp::Or,
            BinOp::And,
            BinOp::Eq,
            BinOp::Ne,
            BinOp::Lt,
            BinOp::Le,
            BinOp::Gt,
            BinOp::Ge,
            BinOp::Add,
            BinOp::Sub,
            BinOp::Mul,
            BinOp::Div,
            BinOp::Rem,
            BinOp::MatMul,
        ]);
        prop_oneof![
            (binop, inner.clone(), inner.clone()).prop_map(|(op, a, b)| e(ExprKind::Binary(
                op,
                Box::new(a),
                Box::new(b)
            ))),
            (prop::sample::select(vec![UnOp::Neg, UnOp::Not]), inner.clone())
                .prop_map(|(op, x)| e(ExprKind::Unary(op, Box::new(x)))),
            prop::collection::vec(inner.clone(), 0..3).prop_map(|v| e(ExprKind::List(v))),
            (inner.clone(), inner.clone(), inner.clone()).prop_map(|(c, a, b)| e(ExprKind::If(
                Box::new(c),
                Box::new(a),
                Box::new(b)
            ))),
            (ident(), prop::collection::vec((prop::option::of(ident()), inner.clone()), 0..4)).prop_map(
                |(func, args)| e(ExprKind::Call {
                    func,
                    args: args.into_iter().map(|(name, value)| Arg { name, value }).collect()
                })
            ),
            (prop::collection::vec(ident(), 0..5), inner.clone())
                .prop_map(|(params, body)| e(ExprKind::Lambda { params, body: Box::new(body) })),
            (ident(), prop::collection::vec(inner, 1..4))
                .prop_map(|(base, indices)| e(ExprKind::Index { base, indices })),
        ]
    })
}

fn ty() -> impl Strategy<Value = Type> {
    let prim = prop::sample::select(vec![Prim::Int, Prim::Float, Prim::Bool]);
    let kind = prop_oneof![
        prim.clone().prop_map(TypeKind::Prim),
        prim.prop_map(TypeKind::List),
        prop::collection::vec(prop_oneof![ident(), Just(Ident { name: "none".into(), span: Span::default() })], 1..4)
            .prop_map(TypeKind::Enum),
    ];
    (kind, any::<bool>()).prop_map(|(kind, optional)| Type { kind, optional, span: Span::default() })
}

fn item() -> impl Strategy<Value = Item> {
    let kind = prop_oneof![
        (ident(), ty(), prop::option::of(expr())).prop_map(|(name, ty, default)| ItemKind::Param { name, ty, default }),
        (ident(), prop::option::of(expr())).prop_map(|(name, default)| ItemKind::Dim { name, default }),
        (
            ident(),
            any::<bool>(),
            prop::collection::vec(expr(), 0..4),
            prop::option::of(expr()),
            prop::option::of(expr())
        )
            .prop_map(|(name, weight, shape, domain, init)| ItemKind::Input {
                name,
                weight,
                shape,
                shape_span: Span::default(),
                domain,
                init
            }),
        (ident(), expr()).prop_map(|(name, value)| ItemKind::Let { name, value }),
        (ident(), expr()).prop_map(|(name, value)| ItemKind::Output { name, value }),
        (expr(), prop::option::of("[a-zA-Z0-9 ,.:=*/+-]{0,20}"))
            .prop_map(|(cond, message)| ItemKind::Require { cond, message }),
    ];
    kind.prop_map(|kind| Item { kind, span: Span::default() })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn parse_of_print_is_identity(name in ident(), items in prop::collection::vec(item(), 0..8)) {
        let spec = Spec { name, items };
        let text = print_spec(&spec);
        let parsed = parse(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(parsed.without_spans(), spec, "text:\n{}", text);
    }
}
