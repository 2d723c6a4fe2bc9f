//! The `edgemark` command: create, inspect and drive regions from a shell.
//!
//! `command.rs` is the command line, `run.rs` what each command does;
//! `attach.rs` attaches a region as a command needs it, `inspect.rs`
//! renders the report, `remove.rs` holds the rule for removing a region
//! left behind, `ops.rs` the commands on one region that `batch` shares,
//! `export.rs` the `export` command and `serve.rs` its `/metrics` server,
//! `notes.rs` shows the libraries' notes, `demo/` and `views/` the demo
//! and the views; `out.rs` writes standard output.

mod attach;
mod command;
mod demo;
mod export;
mod inspect;
mod notes;
mod ops;
mod out;
mod remove;
mod run;
mod serve;
mod views;

use std::process::ExitCode;

use clap::Parser;

use crate::command::Cli;

fn main() {
    let cli = Cli::parse();
    notes::install();
    let code = match run::run(cli).and_then(|code| {
        out::flush()?;
        Ok(code)
    }) {
        Ok(code) => code,
        // The reader of a pipe went away (`| head -1`): it wanted no more.
        Err(e)
            if e.chain()
                .find_map(|c| c.downcast_ref::<out::StdoutError>())
                .is_some_and(out::StdoutError::is_closed_pipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("edgemark: {e:#}");
            ExitCode::FAILURE
        }
    };
    std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 });
}
