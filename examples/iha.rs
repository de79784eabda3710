//! A Rust user's view of attnc: compile the shipped IHA spec with a few
//! parameters, draw inputs, let the optimizer choose the program, run its
//! kernels on wgpu (lavapipe on a CPU) and compare with the float64
//! interpreter. `cargo run --release --example iha`
use attnc::{Backend, Compiler, Mode, CPU};

fn main() -> Result<(), attnc::Error> {
    let program = Compiler::open("stdlib/iha.attn")?.set("H", 4).set("P", 4).set("d", 32).set("N", 128).compile()?;
    let bound = program.seeded(0)?.optimize(CPU, Mode::Inference);
    println!(
        "{} launches: {:?}",
        bound.plan().launches.len(),
        bound.plan().launches.iter().map(|l| l.spec.kind()).collect::<Vec<_>>()
    );
    let y = &bound.run(Backend::Wgpu)?["y"];
    let reference = &bound.interpret()?["y"];
    println!(
        "y {:?}: relative error {:.2e} against the interpreter",
        y.shape,
        attnc::relative_error(&y.data, &reference.data)
    );
    Ok(())
}
