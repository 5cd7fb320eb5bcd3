//! `bf4ps-ops`: parse the command line, set up logging, run, report.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = bf4ps_ops::cli::Cli::parse();
    bf4ps_ops::telemetry::init(&cli.log);
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
    match runtime.block_on(bf4ps_ops::cli::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            // One line: the error and its causes, no backtrace.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
