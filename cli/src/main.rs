//! `swarm`: the toolkit's command line.
//!
//! - `swarm memnode create|list|remove`: clusters of memory nodes in shared
//!   memory (`/dev/shm`, `--dir`) or on DAX devices and files
//!   (`--backend cxl --path`), formatted so that SWARM clients can use them.
//! - `swarm memnode --backend rdma --listen ADDR --size SIZE`: one RDMA
//!   memory node, served until SIGINT or SIGTERM (build with `--features rdma`).
//! - `swarm bench`: the YCSB comparison of the key-value stores (RAW,
//!   DM-ABD, SWARM-KV) on shared memory (threads or processes), DAX devices
//!   and files, RDMA memory nodes, or the deterministic simulator: a table,
//!   JSON and plots.
//! - `swarm bench-register`: a Safe-Guess register benchmark on the same
//!   backends.
//! - `swarm kv`: get, put, delete and a small shell on a shm cluster.
//! - `swarm serve`: a server beside a memory node (the store's server role,
//!   or pings and counters), until SIGINT or SIGTERM; `swarm rpc` calls it.
//!
//! Every failure, from a mistyped flag to a cluster that cannot be opened,
//! ends as one `error: ...` line on stderr and a non-zero exit status (2 for
//! a bad command line, 1 for a failed command); user input never panics.
#![forbid(unsafe_code)]

mod args;
mod bench;
mod kv;
mod memnode;
mod rdma;
mod report;
mod serve;

use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;

use args::{Cli, Command, Memnode};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let result = match cli.command {
        Command::Memnode(m) => match m.action {
            Some(Memnode::Create(a)) => memnode::create(&a),
            Some(Memnode::List(a)) => memnode::list(&a),
            Some(Memnode::Remove(a)) => memnode::remove(&a),
            Some(Memnode::Fault(a)) => memnode::fault(&a),
            Some(Memnode::Stats(a)) => memnode::stats(&a),
            None => rdma::serve(&m.serve),
        },
        Command::Bench(a) => bench::ycsb::run(&a),
        Command::BenchRegister(a) => bench::run(&a),
        Command::Kv(a) => kv::run(&a),
        Command::Serve(a) => serve::serve(&a),
        Command::Rpc(a) => serve::rpc(&a),
        Command::YcsbWorker => bench::procs::worker(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            // An empty message: already reported (a worker process's
            // errors go to its parent).
            if !msg.is_empty() {
                eprintln!("error: {msg}");
            }
            ExitCode::FAILURE
        }
    }
}

/// Reports a command-line error as one line (clap's own first line, plus
/// the usage it would print), or prints help and version as clap does.
fn usage_error(e: clap::Error) -> ExitCode {
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS }
        }
        _ => {
            eprintln!("{}", one_line(&e.render().to_string()));
            ExitCode::from(2)
        }
    }
}

/// Squeezes clap's multi-line message into one line: its `error: ...` line,
/// and the usage line in parentheses.
fn one_line(rendered: &str) -> String {
    let mut lines = rendered.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("error: bad command line");
    let first = if first.starts_with("error:") { first.to_string() } else { format!("error: {first}") };
    match rendered.lines().find_map(|l| l.trim().strip_prefix("Usage: ")) {
        Some(usage) => format!("{first} (usage: {usage}; see --help)"),
        None => first,
    }
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn clap_errors_become_one_line() {
        let rendered = "error: unexpected argument '--x' found\n\n  tip: ...\n\nUsage: swarm bench [OPTIONS]\n\nFor more information, try '--help'.\n";
        assert_eq!(
            one_line(rendered),
            "error: unexpected argument '--x' found (usage: swarm bench [OPTIONS]; see --help)"
        );
        assert_eq!(one_line(""), "error: bad command line");
    }
}
