//! podgate: the node-side helper. Operator commands built on the same
//! library code the plugins use (podgate-kit, podgate-router's records,
//! podgate-tunnel-guard's evaluation), plus the installer (podgate-install).

#![forbid(unsafe_code)]
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
#![cfg_attr(
    test,
    allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

mod admission;
mod attachment;
mod cmd;
mod diagnose;
mod error;
mod ipargs;
mod names;
mod output;
mod probe;
mod progress;
mod report;
mod routes;
mod select;
mod sock;

use clap::{Args, Parser, Subcommand};
use error::{exit, Error, Found};
use select::Common;

const AFTER_HELP: &str = "\
Selecting a namespace (after the command name):
  --netns /var/run/netns/NAME | --netns /proc/PID/ns/net | --pid PID | --container ID [--state-dir DIR]
  --k8s-pod NAMESPACE/NAME [--runtime-endpoint unix:///run/containerd/containerd.sock]
  --node: the namespace podgate runs in (the node's own, on the node)
Commands that only read (sysctl get/diff, route list, rule list, diagnose, inspect, ipsec) work in the
namespace podgate runs in when none is named. Commands that change routes, rules or sysctls (route add/del,
rule add/del, sysctl set) need one named, --node included, and take --dry-run (print, change nothing).

Examples:
  podgate sysctl get --pid 4242 net.ipv4.ip_forward
  podgate sysctl diff --container 3f9a
  podgate sysctl get --k8s-pod vpn/openvpn-0 net.ipv4.ip_forward
  podgate sysctl set --netns /var/run/netns/vpn net.ipv4.ip_forward=1
  podgate route list --netns /var/run/netns/vpn table all
  podgate route add --node 10.8.0.0/24 via 10.22.0.5
  podgate route del --node --dry-run -6 default
  podgate rule add --netns /var/run/netns/vpn from 10.8.0.0/24 lookup 100 pref 100
  podgate diagnose --container 3f9a --peer 10.8.0.2 --from 10.8.0.1 \\
          --pod 10.22.0.3 --service 10.96.0.1:443 --public 1.1.1.1 --dns kubernetes.default
  podgate inspect --all --json
  podgate ipsec status --agent-socket /run/kube-ovn-ipsec/status.sock

Output is plain text; --json prints one stable JSON document instead.
Progress goes to stderr, only when stderr is a terminal.

Exit codes:
  0   ok (every check passed)
  1   error: could not do what was asked (netns not found, netlink failure, ...)
  2   a check or diagnosis found a problem (broken hop, drift, netns gone, IPsec not ready)
  3   refused: not allowed by design (e.g. a node-wide sysctl such as kernel.*)
  64  bad command line";

/// `podgate --version`: the release and, when the build was given one (the
/// image's `PODGATE_COMMIT` build argument), the commit it was built from.
fn version() -> &'static str {
    podgate_cni::build_version()
}

#[derive(Parser)]
#[command(
    name = "podgate",
    version = version(),
    about = "podgate helper: namespaced sysctls, routes and rules, diagnosis of pods that route, inspection, IPsec status, installer",
    after_help = AFTER_HELP
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args)]
struct Sysctl {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    cmd: cmd::sysctl::SysctlCmd,
}

#[derive(Args)]
struct Route {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    cmd: cmd::route::RouteCmd,
}

#[derive(Args)]
struct Rule {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    cmd: cmd::rule::RuleCmd,
}

#[derive(Args)]
struct Ipsec {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    cmd: cmd::ipsec::IpsecCmd,
}

#[derive(Args)]
struct Diagnose {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    args: cmd::diagnose::DiagnoseArgs,
}

#[derive(Args)]
struct Inspect {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    args: cmd::inspect::InspectArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Namespaced net.* sysctls: get, set, diff against the node.
    Sysctl(Sysctl),
    /// Routes, like `ip route` (list, add, del).
    Route(Route),
    /// Policy rules, like `ip rule` (list, add, del).
    Rule(Rule),
    /// Find the broken hop of a pod that routes (a VPN pod): checks forwarding,
    /// default route, masquerade/return route per pool and rp_filter, then
    /// probes peer -> pod -> service -> public -> DNS from inside the pod's
    /// netns and stops at the first broken hop.
    #[command(after_help = "Examples:
  podgate diagnose --netns /var/run/netns/vpn --pool 10.8.0.0/24 --peer 10.8.0.2 --pod 10.22.0.3
  podgate diagnose --container 3f9a --from 10.8.0.1 --pod 10.22.0.3 --service 10.96.0.1:443 --dns kubernetes.default

Exit codes: 0 every hop answers and every check passes; 2 a hop is broken or a check failed; 1 error; 64 bad command line.")]
    Diagnose(Diagnose),
    /// What podgate-router applied per attachment, and whether it still holds.
    #[command(after_help = "Examples:
  podgate inspect --all
  podgate inspect --container 3f9a --json

Exit codes: 0 everything holds; 2 drift, a netns gone or a corrupt record; 1 error.")]
    Inspect(Inspect),
    /// IPsec tunnel protection on this node.
    Ipsec(Ipsec),
    /// Chain podgate after the node's primary CNI: a conflist of its own
    /// (00-podgate.conflist) that sorts first, rendered from the primary's.
    Install(podgate_install::InstallArgs),
    /// Remove podgate's conflist (and podgate entries an earlier version put
    /// into other conflists).
    Uninstall(podgate_install::UninstallArgs),
    /// The node agent: Prometheus metrics and /healthz on --metrics-address,
    /// drift checks of live attachments, the sweep of dead pods' records,
    /// adoption of sandboxes that started without the chain (--once: one
    /// scan and one sweep, then exit).
    /// Reads the CNI dirs, never writes them; stops on SIGTERM/SIGINT.
    #[command(
        after_help = "Examples (the DaemonSet's agent container; HOST_IP from the downward API status.hostIP):
  podgate agent --metrics-address $(HOST_IP):9750
  podgate agent --once                        (one adoption scan and one sweep, then exit)

With --once: what was adopted, undone and swept is printed on stdout; exit 0 when the scan ran
and every candidate was judged, 1 when it could not run (the runtime does not serve podgate's
chain) or a candidate failed.

Endpoints: GET /metrics (Prometheus text format 0.0.4), GET /healthz (200 while collections and sweeps run)."
    )]
    Agent(podgate_install::agent::AgentArgs),
    /// The DaemonSet's sysctl broker: the one container with a writable
    /// /proc/sys/net; opens sysctls for the agent, a pod's in its own
    /// namespace, the node's only those podgate-router sets there.
    #[command(after_help = "Example (the DaemonSet's sysctl-broker container):
  podgate sysctl-broker --listen /run/podgate-sysctl/broker.sock --proc-sys /host/proc/sys")]
    SysctlBroker(podgate_install::sysctl_broker::SysctlBrokerArgs),
    /// The DaemonSet's CRI proxy: holds the runtime's CRI socket and
    /// forwards only the agent's reads (and StopPodSandbox with
    /// --allow-stop); everything else is refused.
    #[command(after_help = "Example (the DaemonSet's cri-proxy container):
  podgate cri-proxy --listen /run/podgate-cri/cri.sock")]
    CriProxy(podgate_install::cri_proxy::CriProxyArgs),
    /// Write one archive for a bug report: versions, CNI configs, installer
    /// state, records with drift, IPsec status, podgate's routes, rules and
    /// nf_tables, recent logs. Never key material.
    #[command(after_help = "Examples:
  podgate report                              (./podgate-report-<host>-<time>.tar)
  podgate report --output /tmp/report.tar --log /var/log/podgate-installer.log
  podgate report --output /tmp/report-dir     (a directory instead)

Progress goes to stderr when it is a terminal; the path written is printed on stdout.")]
    Report(report::ReportArgs),
    /// The admission policy: ValidatingAdmissionPolicies that refuse, when a
    /// pod or a workload is created or its podgate annotations change, what
    /// podgate-router would refuse at ADD without looking at the node;
    /// rendered from the operator's policy (plugins.json).
    #[command(after_help = "Examples:
  podgate admission render --plugins plugins.json | kubectl apply -f -
  podgate admission render --plugins plugins.json --configmap | kubectl apply -f -
  podgate admission render --plugins plugins.json --validation-actions Warn,Audit
  podgate admission digest --plugins /etc/podgate/plugins.json

The policy's digest is stamped on every rendered object (and the ConfigMap with --configmap)
as the annotation podgate.dev/policy-digest.")]
    Admission {
        #[command(subcommand)]
        cmd: cmd::admission::AdmissionCmd,
    },
}

fn dispatch(cli: &Cli) -> Result<Found, Error> {
    match &cli.cmd {
        Cmd::Sysctl(c) => cmd::sysctl::run(&c.cmd, &c.common.target, c.common.json),
        Cmd::Route(c) => cmd::route::run(&c.cmd, &c.common.target, c.common.json),
        Cmd::Rule(c) => cmd::rule::run(&c.cmd, &c.common.target, c.common.json),
        Cmd::Diagnose(c) => cmd::diagnose::run(&c.args, &c.common.target, c.common.json),
        Cmd::Inspect(c) => cmd::inspect::run(&c.args, &c.common.target, c.common.json),
        Cmd::Ipsec(c) => cmd::ipsec::run(&c.cmd, &c.common.target, c.common.json),
        Cmd::Install(a) => cmd::install::install(a),
        Cmd::Report(a) => report::run(a),
        Cmd::Uninstall(a) => cmd::install::uninstall(a),
        Cmd::Agent(a) => cmd::install::agent(a),
        Cmd::SysctlBroker(a) => cmd::install::sysctl_broker(a),
        Cmd::CriProxy(a) => cmd::install::cri_proxy(a),
        Cmd::Admission { cmd } => cmd::admission::run(cmd),
    }
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let code = match dispatch(&cli) {
        Ok(found) => found.exit_code(),
        Err(e) => {
            eprintln!("podgate: {e}");
            e.exit_code()
        }
    };
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_agent_needs_a_metrics_address_unless_it_runs_once() {
        let once = Cli::try_parse_from(["podgate", "agent", "--once"]).unwrap();
        let Cmd::Agent(a) = once.cmd else { panic!() };
        assert!(a.once && a.metrics_address.is_none());
        assert!(Cli::try_parse_from(["podgate", "agent"]).is_err());
        assert!(Cli::try_parse_from([
            "podgate",
            "agent",
            "--once",
            "--metrics-address",
            "10.0.0.5:9750"
        ])
        .is_err());
        let daemon =
            Cli::try_parse_from(["podgate", "agent", "--metrics-address", "10.0.0.5:9750"])
                .unwrap();
        let Cmd::Agent(d) = daemon.cmd else { panic!() };
        assert!(!d.once);
    }

    #[test]
    fn selection_flags_work_before_and_after_the_command() {
        let a = Cli::try_parse_from([
            "podgate",
            "sysctl",
            "--netns",
            "/x",
            "get",
            "net.ipv4.ip_forward",
        ])
        .unwrap();
        let Cmd::Sysctl(a) = a.cmd else { panic!() };
        assert_eq!(
            a.common.target.netns.as_deref(),
            Some(std::path::Path::new("/x"))
        );
        let b = Cli::try_parse_from([
            "podgate", "route", "list", "--pid", "1", "--json", "table", "all",
        ])
        .unwrap();
        let Cmd::Route(b) = b.cmd else { panic!() };
        assert_eq!(b.common.target.pid, Some(1));
        assert!(b.common.json);
        assert!(
            Cli::try_parse_from(["podgate", "route", "list", "--netns", "/x", "--pid", "1"])
                .is_err()
        );
        let i = Cli::try_parse_from([
            "podgate",
            "inspect",
            "--container",
            "abc",
            "--state-dir",
            "/s",
        ])
        .unwrap();
        let Cmd::Inspect(i) = i.cmd else { panic!() };
        assert_eq!(i.common.target.state_dir, std::path::PathBuf::from("/s"));
        let k = Cli::try_parse_from([
            "podgate",
            "sysctl",
            "get",
            "--k8s-pod",
            "vpn/openvpn-0",
            "--runtime-endpoint",
            "unix:///run/k3s/containerd/containerd.sock",
            "net.ipv4.ip_forward",
        ])
        .unwrap();
        let Cmd::Sysctl(k) = k.cmd else { panic!() };
        assert_eq!(k.common.target.k8s_pod.as_deref(), Some("vpn/openvpn-0"));
        assert_eq!(
            k.common.target.runtime_endpoint.as_deref(),
            Some("unix:///run/k3s/containerd/containerd.sock")
        );
        for other in [["--netns", "/x"], ["--pid", "1"], ["--container", "abc"]] {
            let mut args = vec!["podgate", "diagnose", "--k8s-pod", "vpn/openvpn-0"];
            args.extend(other);
            assert!(Cli::try_parse_from(args).is_err(), "{other:?}");
        }
        assert!(
            Cli::try_parse_from(["podgate", "inspect", "--all", "--k8s-pod", "vpn/openvpn-0"])
                .is_err()
        );
        let c = Cli::try_parse_from(["podgate", "route", "add", "-6", "default", "via", "fd00::1"])
            .unwrap();
        assert!(matches!(
            c.cmd,
            Cmd::Route(Route {
                cmd: cmd::route::RouteCmd::Add { .. },
                ..
            })
        ));
        let n = Cli::try_parse_from([
            "podgate",
            "route",
            "del",
            "--node",
            "--dry-run",
            "-6",
            "default",
        ])
        .unwrap();
        let Cmd::Route(n) = n.cmd else { panic!() };
        assert!(n.common.target.node);
        let cmd::route::RouteCmd::Del { change, route } = n.cmd else {
            panic!()
        };
        assert!(change.dry_run && route.family.v6);
        assert!(
            Cli::try_parse_from(["podgate", "rule", "del", "--node", "--netns", "/x"]).is_err()
        );
    }

    /// What changes routes, rules or sysctls needs a target named, before
    /// anything is opened. Run in a network namespace of its own thread,
    /// so that a regression acts there and not on this machine's.
    #[test]
    fn changing_commands_need_a_named_target() {
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            refused_without_a_target();
        })
        .join()
        .unwrap();
    }

    fn refused_without_a_target() {
        for args in [
            &["podgate", "route", "del", "-6", "default"][..],
            &["podgate", "route", "add", "10.8.0.0/24", "via", "10.22.0.5"],
            &["podgate", "rule", "del", "from", "all", "lookup", "local"],
            &[
                "podgate",
                "rule",
                "add",
                "from",
                "10.8.0.0/24",
                "lookup",
                "100",
            ],
            &["podgate", "sysctl", "set", "net.ipv4.ip_forward=1"],
            &["podgate", "route", "del", "--dry-run", "-6", "default"],
        ] {
            let cli = Cli::try_parse_from(args).unwrap();
            let e = dispatch(&cli).unwrap_err();
            assert_eq!(e.exit_code(), error::exit::USAGE, "{args:?}: {e}");
            assert!(e.to_string().contains("--node"), "{args:?}: {e}");
        }
    }
}
