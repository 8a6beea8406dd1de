//! `podgate admission render|digest`: the admission policy rendered from
//! the operator's policy, and the policy's digest (crate::admission).

use crate::admission::{check_actions, Action, Policy};
use crate::error::{Error, Found, Result};
use crate::output;
use clap::{Args, Subcommand};
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Subcommand)]
pub enum AdmissionCmd {
    /// Print the ValidatingAdmissionPolicies and their bindings rendered
    /// from the podgate-router entry of --plugins, as YAML for
    /// `kubectl apply -f -`.
    Render(RenderArgs),
    /// Print the policy digest of --plugins (`sha256:<hex>` of the
    /// podgate-router entry's canonical JSON), as the rendered objects and
    /// the ConfigMap carry it in the annotation podgate.dev/policy-digest.
    Digest(PluginsArg),
}

#[derive(Debug, Clone, Args)]
pub struct PluginsArg {
    /// The plugins file (a JSON array of podgate's plugin entries, what the
    /// podgate-plugins ConfigMap holds as plugins.json); `-` reads stdin.
    #[arg(long, value_name = "FILE")]
    pub plugins: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct RenderArgs {
    #[command(flatten)]
    pub plugins: PluginsArg,
    /// What the API server does with a refusal: Deny (refuse the request),
    /// Warn (admit it with a warning to the client), Audit (admit it and
    /// record it in the audit log); comma-separated, Deny and Warn not
    /// together.
    #[arg(
        long,
        value_name = "ACTIONS",
        value_enum,
        ignore_case = true,
        value_delimiter = ',',
        default_value = "Deny"
    )]
    pub validation_actions: Vec<Action>,
    /// Also print the podgate-plugins ConfigMap holding the plugins file
    /// as it is, with the same digest annotation (first, so one
    /// `kubectl apply` updates the policy and its admission together).
    #[arg(long)]
    pub configmap: bool,
}

fn read(path: &Path) -> Result<String> {
    let mut text = String::new();
    let read = if path == Path::new("-") {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(path).map(|t| text = t)
    };
    read.map_err(|source| Error::File {
        op: "reading",
        path: path.into(),
        source,
    })?;
    Ok(text)
}

fn policy(path: &Path, text: &str) -> Result<Policy> {
    Policy::from_plugins(text.as_bytes()).map_err(|source| Error::Policy {
        path: path.into(),
        source,
    })
}

pub fn run(cmd: &AdmissionCmd) -> Result<Found> {
    match cmd {
        AdmissionCmd::Render(a) => {
            check_actions(&a.validation_actions).map_err(|e| Error::usage(e.to_string()))?;
            let path = &a.plugins.plugins;
            let text = read(path)?;
            let p = policy(path, &text)?;
            output::text(p.render(&a.validation_actions, a.configmap.then_some(text.as_str())))?;
        }
        AdmissionCmd::Digest(a) => {
            let text = read(&a.plugins)?;
            output::text(format!("{}\n", policy(&a.plugins, &text)?.digest()))?;
        }
    }
    Ok(Found::Ok)
}
