//! The middle of attnc: binding parameters, lowering `.attn` specs to a typed,
//! shape-checked IR, validating it, and reporting problems as diagnostics.
//!
//! **Architecture Invariant:** the IR is plain data, printable and checkable
//! without any device; nothing here depends on a GPU crate.

pub mod builtins;
pub mod codes;
pub mod cost;
pub mod diag;
pub mod grad;
pub mod ir;
mod lower;
pub mod opt;
pub mod plan;
pub mod sparsity;
pub mod valid;
pub mod value;

pub use codes::Code;
pub use diag::{render, Diagnostic, Severity};
pub use lower::{lower, Compiled, Setting};

/// Parse and lower `source` under `settings`; on failure, every diagnostic
/// found, sorted by position.
pub fn compile(source: &str, settings: &[Setting]) -> Result<Compiled, Vec<Diagnostic>> {
    let spec = attnc_grammar::parse(source).map_err(|e| vec![syntax_diagnostic(&e)])?;
    let compiled = lower(&spec, settings)?;
    let problems = valid::validate(&compiled.program);
    if !problems.is_empty() {
        return Err(problems.into_iter().map(|p| Diagnostic::error(Code::Internal, p)).collect());
    }
    Ok(compiled)
}

pub fn syntax_diagnostic(e: &attnc_grammar::SyntaxError) -> Diagnostic {
    use attnc_grammar::SyntaxErrorKind as K;
    let code = match e.kind {
        K::Unexpected => Code::Syntax,
        K::BadNumber => Code::BadNumber,
        K::TooLarge => Code::TooLarge,
    };
    let mut d = Diagnostic::error(code, e.message.clone()).at(e.span, "here");
    if let Some(h) = &e.hint {
        d = d.hint(h.clone());
    }
    d
}
