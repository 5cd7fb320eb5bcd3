//! `bf4ps-lab`: parse the command line, set up logging, run, report.
//! `bf4ps-lab ops ARGS` is `bf4ps-ops ARGS`, run in this process
//! ([`bf4ps_lab::cli::OPS`]).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == bf4ps_lab::cli::OPS)
    {
        let product = std::iter::once("bf4ps-ops".into()).chain(std::env::args_os().skip(2));
        return bf4ps_ops::cli::main(product);
    }
    let cli = match bf4ps_lab::cli::Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version print normally; usage errors are one line.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => return bf4ps_ops::cli::usage_error(&e),
    };
    bf4ps_ops::telemetry::init(cli.log_filter(), cli.log_format);
    bf4ps_ops::cli::block_on_reported(bf4ps_lab::cli::run(cli))
}
