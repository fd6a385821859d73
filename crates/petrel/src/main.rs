//! `petrel`: the log collection agent's command line (see `petrel::cli`).

fn main() -> std::process::ExitCode {
    petrel::cli::main()
}
