//! podgate: the node-side helper (skeleton; the CLI work owns this file).

mod install;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "podgate", version, about = "podgate helper")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Chain podgate into the node's primary CNI conflist.
    Install(install::InstallArgs),
    /// Remove podgate from the node's primary CNI conflist.
    Uninstall(install::UninstallArgs),
}

fn main() {
    let cli = Cli::parse();
    let res = match &cli.cmd {
        Cmd::Install(a) => install::install(a),
        Cmd::Uninstall(a) => install::uninstall(a),
    };
    if let Err(e) = res {
        eprintln!("podgate: {e}");
        std::process::exit(1);
    }
}
