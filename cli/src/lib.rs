//! The `edgemark` command as a library: [`run()`] runs a command line and
//! returns its exit status. The `edgemark` binary (`main.rs`) is one
//! caller; the Python package's `edgemark` console script, through the
//! extension module, is the other, so that one wheel carries the command.
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
mod export_dir;
mod inspect;
mod notes;
mod ops;
mod out;
mod remove;
mod run;
mod serve;
mod views;

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::OnceLock;

use clap::Parser;

use crate::command::Cli;

/// How this process starts the command again (the demo's stage workers):
/// the program and the arguments before the subcommand.
static SELF_COMMAND: OnceLock<Vec<OsString>> = OnceLock::new();

/// Runs the command line `args` (the first is the program's name, as in
/// `std::env::args_os()`) and returns the exit status: 0 on success, 1 on
/// an error (said on standard error), 2 for a command line clap refuses.
/// `--help` and `--version` print and return 0.
///
/// The demo starts its stage workers as this process's executable; a
/// caller whose executable is not the command (an interpreter) says how
/// to start it with [`run_as`].
pub fn run<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // What clap's own `exit` does, without ending the process.
            let _ = e.print();
            let _ = std::io::Write::flush(&mut std::io::stdout());
            return e.exit_code();
        }
    };
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
    if code == ExitCode::SUCCESS { 0 } else { 1 }
}

/// [`run()`], in a process whose executable is not the command: `command` is
/// the program and the arguments before the subcommand that start the
/// command again (for the Python console script, the interpreter, `-m`,
/// `edgemark`). Only the first call in a process sets it.
pub fn run_as<I, T>(args: I, command: Vec<OsString>) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let _ = SELF_COMMAND.set(command);
    run(args)
}

/// Shows the notes of the libraries the command runs (the OTLP exporter's)
/// on standard error from now on, as the command does: `edgemark: <note>`.
/// For a process that runs an exporter without the command (the Python
/// package's in-process export). A process whose `log` logger is already
/// set keeps its own.
pub fn show_notes() {
    notes::install();
}

/// The command that starts this command again: what [`run_as`] was given,
/// or this process's executable.
pub(crate) fn self_command() -> std::io::Result<std::process::Command> {
    match SELF_COMMAND.get() {
        Some(c) if !c.is_empty() => {
            let mut cmd = std::process::Command::new(&c[0]);
            cmd.args(&c[1..]);
            Ok(cmd)
        }
        _ => Ok(std::process::Command::new(std::env::current_exe()?)),
    }
}
