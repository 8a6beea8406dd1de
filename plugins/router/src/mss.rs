//! MSS clamping (`mssClamp`): chain `forward` in the pod's podgate table
//! rewrites the MSS option of SYNs forwarded between the client pools and
//! the pod interface, both ways, so tunnel clients with a larger MTU than the
//! pod network never send or ask for segments the pod network drops.

use crate::config::MssClamp;
use crate::refusal::Refusal;
use ipnet::IpNet;
use podgate_cni::CniError;
use podgate_kit::nft::{MssDirection, MssRule, MssValue};

/// The clamp rules for `pools` on `ifname`: per pool, the SYN from the pool
/// leaving by the interface and the SYN arriving by it for the pool.
pub fn plan(clamp: MssClamp, pools: &[IpNet], ifname: &str) -> Result<Vec<MssRule>, CniError> {
    if pools.is_empty() {
        return Err(Refusal::MssNoPool.into());
    }
    let mss = match clamp {
        MssClamp::Pmtu => MssValue::Pmtu,
        MssClamp::Fixed(v) => MssValue::Fixed(v),
    };
    let mut seen: Vec<IpNet> = Vec::new();
    let mut rules = Vec::new();
    for pool in pools.iter().map(IpNet::trunc) {
        if seen.contains(&pool) {
            continue;
        }
        seen.push(pool);
        for direction in [MssDirection::FromPool, MssDirection::ToPool] {
            rules.push(MssRule {
                pool,
                ifname: ifname.to_string(),
                direction,
                mss,
            });
        }
    }
    Ok(rules)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn both_directions_per_pool_once() {
        let pools: Vec<IpNet> = vec![
            "10.8.0.0/24".parse().unwrap(),
            "10.8.0.5/24".parse().unwrap(),
            "10.9.0.0/16".parse().unwrap(),
        ];
        let rules = plan(MssClamp::Fixed(1300), &pools, "eth0").unwrap();
        assert_eq!(rules.len(), 4);
        assert!(rules
            .iter()
            .all(|r| r.mss == MssValue::Fixed(1300) && r.ifname == "eth0"));
        assert_eq!(rules[0].direction, MssDirection::FromPool);
        assert_eq!(rules[1].direction, MssDirection::ToPool);
        assert_eq!(rules[2].pool, "10.9.0.0/16".parse::<IpNet>().unwrap());
        let e = plan(MssClamp::Pmtu, &[], "eth0").unwrap_err();
        assert!(e.msg.contains("refused by mssClamp"), "{}", e.msg);
    }
}
