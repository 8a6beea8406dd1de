//! The cluster leaves the machine as it found it: `down` after a full
//! `up`, and after an `up` killed half-way.

use std::process::Stdio;
use std::time::{Duration, Instant};

use podgate_integration::k8s::{cluster_dir, cluster_sh, Cluster, Containerd, MachineState};
use podgate_integration::output_text;

use crate::world::World;

#[track_caller]
fn assert_restored(before: &MachineState, what: &str) {
    let after = MachineState::read();
    let diff = before.diff(&after);
    assert!(diff.is_empty(), "{what} left the machine changed:\n{diff}");
}

pub fn up_and_down_leave_the_machine_as_found(world: &mut World) {
    world.finish();
    let before = MachineState::read();
    let c = Cluster::up(Containerd::V2);
    let nodes = c.kubectl_ok(&["get", "nodes", "--no-headers"]);
    assert_eq!(
        nodes.lines().filter(|l| l.contains(" Ready ")).count(),
        3,
        "{nodes}"
    );
    // A pod on every node, so that down has sandboxes, shims and pod
    // cgroups to remove.
    c.load_image(&crate::world::test_image("greeter"));
    c.apply(crate::openvpn::GREETERS);
    c.kubectl_ok(&["rollout", "status", "ds/greeter", "--timeout=120s"]);
    drop(c);
    assert_restored(&before, "up, a pod on every node, then down");
}

pub fn down_after_an_interrupted_up_leaves_the_machine_as_found(world: &mut World) {
    world.finish();
    let before = MachineState::read();
    // Killed once the second node's containerd runs: the control plane,
    // one node and half of another are up.
    let mut up = cluster_sh(&["up", "--containerd", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let marker = cluster_dir().join("pids/containerd-node-2");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !marker.exists() {
        assert!(
            Instant::now() < deadline,
            "cluster.sh up never started node-2's containerd"
        );
        assert!(
            up.try_wait().unwrap().is_none(),
            "cluster.sh up ended before node-2"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    up.kill().unwrap();
    up.wait().unwrap();
    let down = cluster_sh(&["down"]).output().unwrap();
    assert!(
        down.status.success(),
        "cluster.sh down:\n{}",
        output_text(&down)
    );
    assert_restored(&before, "an up killed half-way, then down");
}
