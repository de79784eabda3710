//! `attnc check`, `attnc fmt` and `attnc explain-error`: the commands that
//! read specs (or a code) and run nothing.

use super::{program, read_source, report, Failed};
use crate::args::{CheckArgs, ExplainErrorArgs, FmtArgs};
use crate::progress::Ui;
use attnc_compiler::{render, Code, Diagnostic};

pub fn check(a: CheckArgs, ui: &Ui) -> Result<(), Failed> {
    let bar = ui.bar(a.files.len() as u64, "checking");
    let mut ok = true;
    for f in &a.files {
        bar.set_message(format!("checking {}", f.display()));
        ok &= program(f, &a.sizes.set, &ui.under_bar()).is_ok();
        bar.inc();
    }
    ok.then_some(()).ok_or(Failed)
}

/// `attnc fmt`: every file is read and parsed before any is written or
/// printed, so a syntax error in one leaves all of them untouched.
pub fn fmt(a: FmtArgs) -> Result<(), Failed> {
    let mut formatted = vec![];
    let mut ok = true;
    for file in &a.files {
        let source = read_source(file)?;
        match attnc_grammar::parse(&source) {
            Ok(spec) => formatted.push((file, attnc_grammar::format_spec(&source, &spec), source)),
            Err(e) => {
                let d: Diagnostic = attnc_compiler::syntax_diagnostic(&e);
                eprint!("{}", render(&file.display().to_string(), &source, &[d]));
                ok = false;
            }
        }
    }
    if !ok {
        return Err(Failed);
    }
    for (file, text, source) in formatted {
        if a.check {
            if text != source {
                eprintln!("{}: not formatted (run `attnc fmt --write {}`)", file.display(), file.display());
                ok = false;
            }
        } else if a.write {
            if text != source {
                attnc_runtime::io::write_atomic(file, text.as_bytes()).map_err(|e| report(e.code(), e))?;
            }
        } else {
            print!("{text}");
        }
    }
    ok.then_some(()).ok_or(Failed)
}

pub fn explain_error(a: ExplainErrorArgs) -> Result<(), Failed> {
    match Code::parse(&a.code) {
        Some(c) => {
            println!("{}: {}\n\n{}", c.as_str(), c.title(), c.explanation());
            Ok(())
        }
        None => Err(report(
            Code::BadSetting,
            format_args!("`{}` is not an attnc error code; codes look like E0301", a.code),
        )),
    }
}
