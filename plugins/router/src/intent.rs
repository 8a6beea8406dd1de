//! What the pod asks for (untrusted: CNI_ARGS, annotations, args.cni) checked
//! against operator policy. Refusals name the rule that refused.

use crate::config::{Profile, RouterConfig, ANNOTATIONS_CAPABILITY};
use crate::refusal::Refusal;
use ipnet::IpNet;
use podgate_cni::{CniError, Env, NetConf};
use serde_json::Value;
use std::net::IpAddr;

pub const ANN_PROFILE: &str = "podgate.dev/profile";
pub const ANN_MASQUERADE: &str = "podgate.dev/masquerade";
pub const ANN_RETURN_ROUTES: &str = "podgate.dev/return-routes";
/// At most this many CIDRs per annotation: a pod cannot make us do unbounded work.
pub const MAX_ANNOTATION_POOLS: usize = 16;

/// Where the profile came from, for logs and refusals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Assign(usize),
    Annotation,
    Args,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Assign(i) => write!(f, "assign[{i}]"),
            Source::Annotation => write!(f, "annotation {ANN_PROFILE}"),
            Source::Args => write!(f, "args.cni.profile"),
        }
    }
}

/// The pod's request, as delivered.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodIntent {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub ann_profile: Option<String>,
    pub ann_masquerade: Option<String>,
    pub ann_return_routes: Option<String>,
    pub args_profile: Option<String>,
}

/// The pod's annotations or CNI `args` do not decode (untrusted input).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

impl PodIntent {
    pub fn from_request(env: &Env, conf: &NetConf) -> Result<PodIntent, DecodeError> {
        let ann = match conf.runtime_config.get(ANNOTATIONS_CAPABILITY) {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m),
            Some(_) => {
                return Err(DecodeError(format!(
                    "runtimeConfig.{ANNOTATIONS_CAPABILITY} must be an object of strings"
                )))
            }
        };
        let ann_str = |k: &str| -> Result<Option<String>, DecodeError> {
            match ann.and_then(|m| m.get(k)) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(DecodeError(format!("annotation {k} must be a string"))),
            }
        };
        let args_profile = match conf.args_cni.get("profile") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(DecodeError("args.cni.profile must be a string".into())),
        };
        Ok(PodIntent {
            namespace: env.arg("K8S_POD_NAMESPACE").map(str::to_string),
            name: env.arg("K8S_POD_NAME").map(str::to_string),
            ann_profile: ann_str(ANN_PROFILE)?,
            ann_masquerade: ann_str(ANN_MASQUERADE)?,
            ann_return_routes: ann_str(ANN_RETURN_ROUTES)?,
            args_profile,
        })
    }

    fn asks_anything(&self) -> bool {
        self.ann_profile.is_some()
            || self.ann_masquerade.is_some()
            || self.ann_return_routes.is_some()
            || self.args_profile.is_some()
    }
}

/// The pod's namespace when the pod may choose its profile by annotation
/// (`allow.annotationNamespaces`) but the runtime delivered no annotations
/// at all (no `runtimeConfig` capability: the entry does not ask for it, or
/// the runtime does not fill it), so a choice it made cannot be seen.
pub fn annotations_missing(cfg: &RouterConfig, env: &Env, conf: &NetConf) -> Option<String> {
    let ns = env.arg("K8S_POD_NAMESPACE")?;
    let allowed = cfg.allow.annotation_namespaces.iter().any(|a| a == ns);
    let delivered = !matches!(
        conf.runtime_config.get(ANNOTATIONS_CAPABILITY),
        None | Some(Value::Null)
    );
    (allowed && !delivered).then(|| ns.to_string())
}

/// The outcome of policy: which profile, and the pools in force. The
/// profile is looked up once, here; everything after reads it through
/// `profile` and names it by `name`.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection<'c> {
    /// The profile's name, for records and messages.
    pub name: &'c str,
    pub profile: &'c Profile,
    pub source: Source,
    pub masquerade: Vec<IpNet>,
    pub return_routes: Vec<IpNet>,
}

/// Decide; Ok(None) means the pod has no profile and passes through untouched.
pub fn select<'c>(
    cfg: &'c RouterConfig,
    intent: &PodIntent,
) -> Result<Option<Selection<'c>>, CniError> {
    let ns = intent.namespace.as_deref();
    let assigned = cfg
        .assign
        .iter()
        .enumerate()
        .find(|(_, a)| a.matches(ns, intent.name.as_deref()));

    // Anything the pod itself asks for needs its namespace on the allow list.
    if intent.asks_anything() {
        let allowed = ns.is_some_and(|n| cfg.allow.annotation_namespaces.iter().any(|a| a == n));
        if !allowed {
            return Err(Refusal::AnnotationNamespace(ns.map(str::to_string)).into());
        }
    }

    let requested = match (&intent.ann_profile, &intent.args_profile) {
        (Some(a), Some(b)) if a != b => {
            return Err(Refusal::ProfilesDisagree {
                ann: ANN_PROFILE,
                annotation: a.clone(),
                args: b.clone(),
            }
            .into())
        }
        (Some(a), _) => Some((a.clone(), Source::Annotation)),
        (None, Some(b)) => Some((b.clone(), Source::Args)),
        (None, None) => None,
    };

    let (profile, source) = match (assigned, requested) {
        (Some((i, a)), Some((r, src))) if r != a.profile => {
            return Err(Refusal::Assigned {
                index: i,
                assigned: a.profile.clone(),
                asked_by: src.to_string(),
                asked: r,
            }
            .into())
        }
        (Some((i, a)), _) => (a.profile.clone(), Source::Assign(i)),
        (None, Some((r, src))) => (r, src),
        (None, None) => {
            if intent.ann_masquerade.is_some() || intent.ann_return_routes.is_some() {
                return Err(Refusal::PoolsWithoutProfile.into());
            }
            return Ok(None);
        }
    };
    let Some((name, p)) = cfg.profiles.get_key_value(&profile) else {
        return Err(Refusal::UnknownProfile {
            asked_by: source.to_string(),
            profile,
        }
        .into());
    };

    let masquerade = match &intent.ann_masquerade {
        Some(s) => allowed_pools(cfg, ANN_MASQUERADE, s)?,
        None => p.masquerade.iter().map(|m| m.source.trunc()).collect(),
    };
    let return_routes = match &intent.ann_return_routes {
        Some(s) => allowed_pools(cfg, ANN_RETURN_ROUTES, s)?,
        None => p.return_routes.iter().map(|r| r.dst.trunc()).collect(),
    };
    Ok(Some(Selection {
        name,
        profile: p,
        source,
        masquerade,
        return_routes,
    }))
}

/// One pool of an annotation, read as the Kubernetes API server reads a
/// CIDR (Go's `netip.ParsePrefix` and its CEL `cidr()`), so that the
/// admission policy rendered from this policy (`podgate admission render`)
/// and this check agree: no leading zeros in an IPv4 octet (`010.8.0.0`
/// reads as 10.8.0.0 to some tools and 8.8.0.0 to others) or in the prefix
/// length, no sign, no IPv6 zone, and no IPv4-mapped IPv6 address (an IPv6
/// route to `::ffff:10.8.0.0/120` never carries the IPv4 traffic it names).
pub fn parse_pool(s: &str) -> Option<IpNet> {
    let (addr, len) = s.split_once('/')?;
    let digits = !len.is_empty() && len.bytes().all(|b| b.is_ascii_digit());
    if !digits || (len.len() > 1 && len.starts_with('0')) {
        return None;
    }
    let addr: IpAddr = addr.parse().ok()?;
    if let IpAddr::V6(v6) = addr {
        if v6.to_ipv4_mapped().is_some() {
            return None;
        }
    }
    IpNet::new(addr, len.parse().ok()?).ok()
}

/// Parse a comma-separated CIDR list and keep it inside `allow.pools`.
pub fn allowed_pools(
    cfg: &RouterConfig,
    ann: &'static str,
    s: &str,
) -> Result<Vec<IpNet>, CniError> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if out.len() == MAX_ANNOTATION_POOLS {
            let max = MAX_ANNOTATION_POOLS;
            return Err(Refusal::TooManyPools { ann, max }.into());
        }
        let net = parse_pool(part).ok_or_else(|| Refusal::NotCidr {
            ann,
            text: part.chars().take(64).collect(),
        })?;
        if net.trunc() != net {
            return Err(Refusal::HostBits { ann, net }.into());
        }
        if !cfg.allow.pools.iter().any(|p| p.contains(&net)) {
            let allowed = cfg.allow.pools.clone();
            return Err(Refusal::PoolNotAllowed { ann, net, allowed }.into());
        }
        if !out.contains(&net) {
            out.push(net);
        }
    }
    if out.is_empty() {
        return Err(Refusal::NoPool(ann).into());
    }
    Ok(out)
}
