//! The `memcg-trace` command.

fn main() {
    std::process::exit(memcg_trace::cli::main());
}
