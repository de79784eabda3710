//! `attnc explain` and `attnc ir`: what the compiler makes of a spec, printed.

use super::{fail, program, Failed};
use crate::args::{ExplainArgs, IrArgs};
use crate::progress::Ui;

pub fn explain(a: ExplainArgs, ui: &Ui) -> Result<(), Failed> {
    let p = program(&a.spec.file, &a.spec.sizes.set, ui)?;
    let text = {
        let _step = ui.step("optimizing");
        p.explain(a.target.target(), a.mode.mode()).map_err(fail)?
    };
    print!("{text}");
    Ok(())
}

pub fn ir(a: IrArgs, ui: &Ui) -> Result<(), Failed> {
    let p = program(&a.spec.file, &a.spec.sizes.set, ui)?;
    match a.grad.wrt() {
        None => print!("{}", p.compiled().program.pretty()),
        Some(wrt) => print!("{}", p.gradient(wrt).map_err(fail)?.program().ir().pretty()),
    }
    Ok(())
}
