//! podgate on a real Kubernetes cluster: the kube-apiserver, controller-
//! manager, scheduler, kubelets and kube-proxies of `integration/k8s/`
//! (cluster.sh), with containerd 2.x and Debian's 1.6. podgate is installed
//! with kubectl as the README says, pods come from the controllers and the
//! scheduler, Services from kube-proxy; the tests look at nodes only to
//! assert what podgate left there.
//!
//! One cluster serves every case (bringing one up takes about 20 s, the
//! cases build on each other: install, then pods, then upgrade and
//! uninstall; the privilege cases need a pod started before podgate), so
//! this binary runs its cases in order itself
//! (`harness = false`). Arguments that do not start with `-` select cases
//! by substring, as libtest's do; libtest's flags are accepted and ignored.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod admission;
mod helm;
mod install;
mod lifecycle;
mod machine;
mod nodes;
mod openvpn;
mod policy;
mod privilege;
mod upgrade;
mod world;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use world::World;

/// A case: its name and what it does with the world (the cluster and what
/// earlier cases put on it).
struct Case {
    name: &'static str,
    run: fn(&mut World),
}

const CASES: &[Case] = &[
    Case {
        name: "machine::up_and_down_leave_the_machine_as_found",
        run: machine::up_and_down_leave_the_machine_as_found,
    },
    Case {
        name: "machine::down_after_an_interrupted_up_leaves_the_machine_as_found",
        run: machine::down_after_an_interrupted_up_leaves_the_machine_as_found,
    },
    Case {
        name: "privilege::adoption_writes_a_pods_sysctls_and_the_agent_no_node_knob",
        run: privilege::adoption_writes_a_pods_sysctls_and_the_agent_no_node_knob,
    },
    Case {
        name: "privilege::forged_installer_records_and_history_from_the_agent_write_nothing",
        run: privilege::forged_installer_records_and_history_from_the_agent_write_nothing,
    },
    Case {
        name: "privilege::the_agent_gets_no_sandbox_from_any_socket_and_reads_through_the_proxy",
        run: privilege::the_agent_gets_no_sandbox_from_any_socket_and_reads_through_the_proxy,
    },
    Case {
        name: "privilege::the_agents_read_only_mounts_hold_only_as_far_as_the_lsm",
        run: privilege::the_agents_read_only_mounts_hold_only_as_far_as_the_lsm,
    },
    Case {
        name: "privilege::each_container_holds_only_its_share_of_the_privileges",
        run: privilege::each_container_holds_only_its_share_of_the_privileges,
    },
    Case {
        name: "install::the_readme_install_rolls_out_on_every_node",
        run: install::the_readme_install_rolls_out_on_every_node,
    },
    Case {
        name: "install::containerd_2_asks_status_and_a_router_without_its_state_dir_takes_the_node_out",
        run: install::containerd_2_asks_status_and_a_router_without_its_state_dir_takes_the_node_out,
    },
    Case {
        name: "openvpn::the_example_reaches_every_node_and_a_service_through_the_api",
        run: openvpn::the_example_reaches_every_node_and_a_service_through_the_api,
    },
    Case {
        name: "policy::an_edited_policy_reaches_new_sandboxes",
        run: policy_case,
    },
    Case {
        name: "admission::the_policy_refuses_what_the_router_refuses",
        run: admission::the_policy_refuses_what_the_router_refuses,
    },
    Case {
        name: "admission::the_shipped_policy_refuses_at_kubectl_apply",
        run: admission::the_shipped_policy_refuses_at_kubectl_apply,
    },
    Case {
        name: "lifecycle::a_refused_pod_waits_with_podgates_reason_in_its_events",
        run: lifecycle::a_refused_pod_waits_with_podgates_reason_in_its_events,
    },
    Case {
        name: "lifecycle::deletions_of_every_kind_leave_nothing_on_the_nodes",
        run: lifecycle::deletions_of_every_kind_leave_nothing_on_the_nodes,
    },
    Case {
        name: "lifecycle::restarts_and_a_reboot_end_with_every_pod_wired",
        run: lifecycle::restarts_and_a_reboot_end_with_every_pod_wired,
    },
    Case {
        name: "upgrade::an_upgrade_rolls_out_new_binaries_that_del_what_the_old_set_up",
        run: upgrade::an_upgrade_rolls_out_new_binaries_that_del_what_the_old_set_up,
    },
    Case {
        name: "upgrade::the_documented_uninstall_leaves_every_node_as_before_the_install",
        run: upgrade::the_documented_uninstall_leaves_every_node_as_before_the_install,
    },
    Case {
        name: "helm::install_upgrade_rollback_and_uninstall_with_helm",
        run: helm::install_upgrade_rollback_and_uninstall_with_helm,
    },
    Case {
        name: "containerd_1_6::the_readme_install_and_the_openvpn_example",
        run: containerd_1_6,
    },
];

/// The install and the OpenVPN example again, on a cluster whose nodes run
/// Debian's containerd 1.6 (the other cases run 2.x).
fn containerd_1_6(world: &mut World) {
    world.finish();
    world.containerd = Some(podgate_integration::k8s::Containerd::Debian);
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        install::the_readme_install_rolls_out_on_every_node(world);
        openvpn::the_example_reaches_every_node_and_a_service_through_the_api(world);
    }));
    world.finish();
    world.containerd = None;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

fn policy_case(world: &mut World) {
    policy::an_edited_policy_reaches_new_sandboxes(world);
    world.policy_edited = true;
}

fn main() {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-') && !a.chars().all(|c| c.is_ascii_digit()))
        .collect();
    let selected: Vec<&Case> = CASES
        .iter()
        .filter(|c| filters.is_empty() || filters.iter().any(|f| c.name.contains(f.as_str())))
        .collect();
    if selected.is_empty() {
        println!("\nrunning 0 tests\n\ntest result: ok. 0 passed; 0 failed\n");
        return;
    }
    podgate_integration::require_root();
    println!("\nrunning {} tests", selected.len());
    let mut world = World::default();
    let mut failed = Vec::new();
    let started = Instant::now();
    for case in &selected {
        let t = Instant::now();
        println!("test {} ...", case.name);
        let result = catch_unwind(AssertUnwindSafe(|| (case.run)(&mut world)));
        let secs = t.elapsed().as_secs();
        match result {
            Ok(()) => println!("test {} ... ok ({secs} s)", case.name),
            Err(_) => {
                println!("test {} ... FAILED ({secs} s)", case.name);
                failed.push(case.name);
            }
        }
    }
    // The cluster goes down before the verdict, also after a failure.
    world.finish();
    let passed = selected.len() - failed.len();
    if failed.is_empty() {
        println!(
            "\ntest result: ok. {passed} passed; 0 failed; finished in {} s\n",
            started.elapsed().as_secs()
        );
    } else {
        println!("\nfailures:");
        for f in &failed {
            println!("    {f}");
        }
        println!(
            "\ntest result: FAILED. {passed} passed; {} failed; finished in {} s\n",
            failed.len(),
            started.elapsed().as_secs()
        );
        std::process::exit(101);
    }
}
