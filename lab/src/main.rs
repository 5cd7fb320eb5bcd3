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
        Err(e) => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("error: invalid arguments");
            eprintln!("{first} (see --help)");
            return ExitCode::from(2);
        }
    };
    bf4ps_ops::telemetry::init(cli.log_filter(), cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(bf4ps_lab::cli::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            // One line: the error and its causes (each once), no backtrace.
            eprintln!("error: {}", bf4ps_ops::telemetry::error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}
