//! `petrel`: the log collection agent's command line (see `petrel::cli`).

/// The system allocator, with the per-thread measuring that bounds a VRL
/// program's working memory (`petrel::alloc`).
#[global_allocator]
static ALLOCATOR: petrel::alloc::Counting = petrel::alloc::Counting;

fn main() -> std::process::ExitCode {
    petrel::cli::main()
}
