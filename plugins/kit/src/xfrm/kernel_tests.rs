//! Root-only tests against the kernel, each inside a fresh netns of its own thread.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use super::*;
use std::process::Command;

/// Run `f` on a new thread moved into a brand new netns (gone when the
/// thread ends). Without root it fails loudly: these tests cannot mean
/// anything otherwise (CI runs as root).
fn in_new_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let euid = nix::unistd::geteuid();
    assert!(
        euid.is_root(),
        "the XFRM kernel tests need root to create network namespaces (euid is {euid})"
    );
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
        f()
    })
    .join()
    .expect("netns thread")
}

fn ip(args: &str) {
    let st = Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .expect("run ip");
    assert!(st.success(), "ip {args}");
}

#[test]
fn dumps_policies_made_by_iproute2() {
    let pols = in_new_netns(|| {
        assert!(dump_policies().unwrap().is_empty());
        ip("xfrm policy add dir out src 0.0.0.0/0 dst 0.0.0.0/0 action block priority 2147483647 mark 759815 mask 0xffffffff");
        ip("-6 xfrm policy add dir out src ::/0 dst ::/0 action block priority 2147483647 mark 0xb9807 mask 0xffffffff");
        ip("xfrm policy add dir out src 10.0.0.1/32 dst 10.0.0.2/32 proto udp dport 6081 priority 100 tmpl src 10.0.0.1 dst 10.0.0.2 proto esp reqid 1 mode transport");
        ip("xfrm policy add dir in src 10.0.0.2/32 dst 10.0.0.1/32 proto udp sport 4789 tmpl src 10.0.0.2 dst 10.0.0.1 proto esp reqid 2 mode tunnel level use");
        ip("xfrm policy add dir out src 10.1.0.0/16 dst 10.2.0.0/16 if_id 9");
        let out = dump_policies_where(Dir::Out, DEFAULT_TIMEOUT, |_| true)
            .unwrap()
            .kept;
        assert_eq!(out.len(), 4);
        assert!(out.iter().all(|p| p.dir == Dir::Out));
        dump_policies().unwrap()
    });
    assert_eq!(pols.len(), 5, "{pols:#?}");
    let guard4 = pols
        .iter()
        .find(|p| p.family == AF_INET && p.action == Action::Block)
        .unwrap();
    assert_eq!(guard4.dir, Dir::Out);
    assert_eq!(guard4.priority, 2_147_483_647);
    assert_eq!(
        guard4.mark,
        Some(Mark {
            value: 759_815,
            mask: 0xffff_ffff
        })
    );
    assert_eq!(guard4.selector.dst.prefix_len(), 0);
    let guard6 = pols.iter().find(|p| p.family == AF_INET6).unwrap();
    assert_eq!(guard6.selector.src, "::/0".parse::<IpNet>().unwrap());
    assert_eq!(guard6.mark.map(|m| m.value), Some(759_815));

    let esp = pols.iter().find(|p| p.priority == 100).unwrap();
    assert_eq!(esp.action, Action::Allow);
    assert_eq!(esp.selector.proto, PROTO_UDP);
    assert_eq!(
        (esp.selector.dport, esp.selector.dport_mask),
        (6081, 0xffff)
    );
    assert_eq!(esp.selector.src, "10.0.0.1/32".parse::<IpNet>().unwrap());
    assert_eq!(esp.templates.len(), 1);
    assert!(esp.templates[0].requires_esp());
    assert_eq!(esp.templates[0].reqid, 1);
    assert_eq!(esp.templates[0].dst, Some("10.0.0.2".parse().unwrap()));
    assert_eq!(esp.mark, None);

    let inbound = pols.iter().find(|p| p.dir == Dir::In).unwrap();
    assert_eq!(
        (inbound.selector.sport, inbound.selector.sport_mask),
        (4789, 0xffff)
    );
    assert_eq!(inbound.templates[0].mode, Mode::Tunnel);
    assert!(inbound.templates[0].optional);

    let xfrmi = pols.iter().find(|p| p.if_id.is_some()).unwrap();
    assert_eq!(xfrmi.if_id, Some(9));
    assert!(xfrmi.templates.is_empty());
}

#[test]
fn dumps_many_policies_across_datagrams() {
    let n = in_new_netns(|| {
        let mut batch = String::new();
        for i in 0..600u32 {
            batch.push_str(&format!(
                "xfrm policy add dir out src 10.0.0.1/32 dst 10.{}.{}.1/32 tmpl src 10.0.0.1 dst 10.{}.{}.1 proto esp reqid {i} mode transport\n",
                i / 256, i % 256, i / 256, i % 256
            ));
        }
        let mut child = Command::new("ip")
            .args(["-batch", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(batch.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success());
        dump_policies().unwrap().len()
    });
    assert_eq!(n, 600);
}
