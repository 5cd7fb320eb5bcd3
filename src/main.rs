//! `bf4ps-ops`: parse the command line, set up logging, run, report
//! ([`bf4ps_ops::cli::main`]).
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    bf4ps_ops::cli::main(std::env::args_os())
}
