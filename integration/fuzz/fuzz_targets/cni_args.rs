//! CNI_ARGS (`K=V;K2=V2`, untrusted: set by the runtime on the pod's behalf)
//! and the other CNI_* variables through `env::from_vars`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use podgate_cni::env::{from_vars, parse_cni_args, validate_container_id, validate_ifname};
use podgate_cni::Command;

fuzz_target!(|data: &[u8]| {
    if data.len() > 64 * 1024 {
        return;
    }
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(pairs) = parse_cni_args(s) {
        // Every pair is a non-empty key; joining them back parses the same.
        assert!(pairs.iter().all(|(k, _)| !k.is_empty() && !k.contains(';')));
        let joined: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(parse_cni_args(&joined.join(";")).ok(), Some(pairs));
    }
    // Fields separated by NUL: CNI_ARGS, CNI_CONTAINERID, CNI_IFNAME, CNI_NETNS.
    let mut parts = s.split('\0');
    let (args, cid, ifname, netns) = (parts.next(), parts.next(), parts.next(), parts.next());
    if let Some(c) = cid {
        let _ = validate_container_id(c);
    }
    if let Some(i) = ifname {
        if validate_ifname(i).is_ok() {
            assert!(!i.is_empty() && i.len() <= 15 && !i.contains('/'));
        }
    }
    for cmd in [Command::Add, Command::Del, Command::Check, Command::Gc] {
        let vars = |k: &str| -> Option<String> {
            match k {
                "CNI_ARGS" => args.map(str::to_string),
                "CNI_CONTAINERID" => cid.map(str::to_string),
                "CNI_IFNAME" => ifname.map(str::to_string),
                "CNI_NETNS" => netns.map(str::to_string),
                "CNI_PATH" => Some("/opt/cni/bin:/usr/lib/cni".into()),
                _ => None,
            }
        };
        let _ = from_vars(cmd, vars);
    }
});
