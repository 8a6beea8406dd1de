//! The admission policy: ValidatingAdmissionPolicies and their bindings
//! that refuse, when a pod or a workload is created or its podgate
//! annotations change, what podgate-router's intent check
//! (`plugins/router/src/intent.rs`) refuses at ADD without looking at the
//! node. Rendered from the operator's policy (the podgate-router entry of
//! plugins.json, the file the `podgate-plugins` ConfigMap holds), never
//! written by hand; both carry the policy's digest.
//!
//! Three policies, one per place a pod's metadata lives (a pod, the
//! `spec.template` of Deployments, StatefulSets, DaemonSets, ReplicaSets
//! and Jobs, a CronJob's `spec.jobTemplate.spec.template`): each is
//! type-checked against its kinds' schemas alone. A pod's name is known,
//! so its policy decides exactly as the router; a template's pods get
//! generated names that start with `<workload name>-`, so an `assign` rule
//! on a name or a longer prefix may or may not match them, and a template
//! is refused only when every pod it can make would be.

mod cel;
mod yaml;

use podgate_router::config::{AssignRule, RouterConfig};
use podgate_router::intent::{
    ANN_MASQUERADE, ANN_PROFILE, ANN_RETURN_ROUTES, MAX_ANNOTATION_POOLS,
};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

/// The annotation carrying the policy digest, on every rendered object and
/// on the ConfigMap.
pub const DIGEST_ANNOTATION: &str = "podgate.dev/policy-digest";
/// podgate's ConfigMap (podgate-config.yaml).
const CONFIGMAP: (&str, &str) = ("podgate-system", "podgate-plugins");
/// The annotations the router reads, in the order it checks them.
const ANNOTATIONS: [&str; 3] = [ANN_PROFILE, ANN_MASQUERADE, ANN_RETURN_ROUTES];
/// Pod names made from `generateName` keep this much of it (the API
/// server's name generator adds 5 characters and keeps names to 63).
const GENERATED_PREFIX_MAX: usize = 58;

/// What the binding does with a refusal (`validationActions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Action {
    #[value(name = "Deny")]
    Deny,
    #[value(name = "Warn")]
    Warn,
    #[value(name = "Audit")]
    Audit,
}

impl Action {
    fn as_str(self) -> &'static str {
        match self {
            Action::Deny => "Deny",
            Action::Warn => "Warn",
            Action::Audit => "Audit",
        }
    }
}

/// Why no admission policy was rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("--validation-actions names no action")]
    NoAction,
    #[error("--validation-actions names {0} twice")]
    ActionTwice(&'static str),
    #[error("--validation-actions: Deny and Warn cannot be used together (the API server refuses the binding)")]
    DenyAndWarn,
    /// The plugins file, as the installer would refuse it.
    #[error("{0}")]
    Plugins(#[from] podgate_install::Error),
    #[error("the plugins file has {0} podgate-router entries; the admission policy is rendered from exactly one")]
    Routers(usize),
    #[error("the podgate-router entry: {0}")]
    Entry(#[from] serde_json::Error),
}

/// The actions as the API server accepts them: some, each once, not both
/// Deny and Warn.
pub fn check_actions(actions: &[Action]) -> Result<(), RenderError> {
    if actions.is_empty() {
        return Err(RenderError::NoAction);
    }
    for (i, a) in actions.iter().enumerate() {
        if actions.iter().skip(i + 1).any(|b| b == a) {
            return Err(RenderError::ActionTwice(a.as_str()));
        }
    }
    if actions.contains(&Action::Deny) && actions.contains(&Action::Warn) {
        return Err(RenderError::DenyAndWarn);
    }
    Ok(())
}

/// The operator's policy: the podgate-router entry of a plugins file.
pub struct Policy {
    cfg: RouterConfig,
    digest: String,
}

impl Policy {
    /// The router entry of plugins.json (`text`), checked as the installer
    /// checks it (the plugins' own config code).
    pub fn from_plugins(text: &[u8]) -> Result<Policy, RenderError> {
        let entries = podgate_install::chain::parse_entries(text)?;
        podgate_install::validate::validate_entries(&entries)?;
        let routers: Vec<_> = entries
            .iter()
            .filter(|e| {
                e.as_object().and_then(|o| o.str_field("type"))
                    == Some(podgate_install::validate::ROUTER)
            })
            .collect();
        let [entry] = routers[..] else {
            return Err(RenderError::Routers(routers.len()));
        };
        let entry = entry.to_value()?;
        let cfg = RouterConfig::deserialize(&entry)?;
        Ok(Policy {
            cfg,
            digest: digest(&entry),
        })
    }

    /// `sha256:<hex>` of the router entry's canonical JSON.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The policies and their bindings, as YAML documents after a header
    /// comment; with `configmap` (the plugins file's text), the
    /// `podgate-plugins` ConfigMap holding it first.
    pub fn render(&self, actions: &[Action], configmap: Option<&str>) -> String {
        let mut docs = Vec::new();
        if let Some(text) = configmap {
            docs.push(self.configmap(text));
        }
        for t in &TARGETS {
            docs.push(self.policy(t));
            docs.push(self.binding(t, actions));
        }
        let mut out = format!(
            "# podgate's admission policy: refuses at admission what podgate-router refuses\n\
             # at ADD without looking at the node. Rendered from the operator's policy (the\n\
             # podgate-router entry of plugins.json) by\n\
             #   podgate admission render --plugins plugins.json\n\
             # Do not edit: edit the policy and render again (conf/kubernetes/README.md,\n\
             # \"Refusal at admission\"). Policy digest {}\n",
            self.digest
        );
        for d in &docs {
            out.push_str("---\n");
            out.push_str(&yaml::document(d));
        }
        out
    }

    fn metadata(&self, name: &str, namespace: Option<&str>) -> Value {
        let mut m = json!({
            "name": name,
            "labels": {"app.kubernetes.io/name": "podgate"},
            "annotations": {DIGEST_ANNOTATION: self.digest},
        });
        if let (Some(ns), Some(o)) = (namespace, m.as_object_mut()) {
            o.insert("namespace".into(), ns.into());
        }
        m
    }

    fn configmap(&self, text: &str) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": self.metadata(CONFIGMAP.1, Some(CONFIGMAP.0)),
            "data": {"plugins.json": text},
        })
    }

    fn binding(&self, t: &Target, actions: &[Action]) -> Value {
        let actions: Vec<&str> = actions.iter().map(|a| a.as_str()).collect();
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": self.metadata(t.name, None),
            "spec": {"policyName": t.name, "validationActions": actions},
        })
    }

    fn policy(&self, t: &Target) -> Value {
        let rules: Vec<Value> = t
            .resources
            .iter()
            .map(|(group, resources)| {
                json!({"apiGroups": [group], "apiVersions": ["v1"],
                       "operations": ["CREATE", "UPDATE"], "resources": resources})
            })
            .collect();
        let variables: Vec<Value> = self
            .variables(t)
            .into_iter()
            .map(|(name, expression)| json!({"name": name, "expression": expression}))
            .collect();
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": self.metadata(t.name, None),
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": rules},
                "matchConditions": t.match_conditions(),
                "variables": variables,
                "validations": self.validations(t),
            },
        })
    }

    /// The policy's variables, each from earlier ones: what the pod asks
    /// for, which `assign` rules can pin its profile, and the first thing
    /// wrong with each pool annotation.
    fn variables(&self, t: &Target) -> Vec<(String, String)> {
        let mut v = Vec::new();
        for (name, key) in [
            ("profile", ANN_PROFILE),
            ("masquerade", ANN_MASQUERADE),
            ("returnRoutes", ANN_RETURN_ROUTES),
        ] {
            v.push((name.to_string(), t.annotation("object", key)));
        }
        v.extend(self.assign_variables(t));
        let pools: Vec<String> = self
            .cfg
            .allow
            .pools
            .iter()
            .map(|p| p.trunc())
            .filter(|p| !is_ipv4_mapped(p))
            .map(|p| format!("cidr({})", cel::string(&p.to_string())))
            .collect();
        let pools = format!("[{}]", pools.join(", "));
        for name in ["masquerade", "returnRoutes"] {
            v.extend(pool_variables(name, &pools));
        }
        v
    }

    /// `assigned`: the `assign` rules that can pin this pod's profile, in
    /// order, -1 standing for "no rule" (the router takes the first rule
    /// that matches). A pod's list holds the one outcome; a template's
    /// every outcome a pod of it can meet.
    fn assign_variables(&self, t: &Target) -> Vec<(String, String)> {
        let n = self.cfg.assign.len();
        let mut v = Vec::new();
        if t.pod {
            v.push(("podName".into(), "object.metadata.name".into()));
            let mut chain = String::new();
            for (i, r) in self.cfg.assign.iter().enumerate() {
                chain.push_str(&format!("{} ? {i} : ", pod_match(r)));
            }
            v.push(("assigned".into(), format!("[{chain}-1]")));
            return v;
        }
        v.push((
            "namePrefix".into(),
            format!(
                "size(object.metadata.name) >= {GENERATED_PREFIX_MAX} \
                 ? object.metadata.name.substring(0, {GENERATED_PREFIX_MAX}) : object.metadata.name + '-'"
            ),
        ));
        if n == 0 {
            v.push(("assigned".into(), "[-1]".into()));
            return v;
        }
        let mut first = String::new();
        for (i, r) in self.cfg.assign.iter().enumerate() {
            first.push_str(&format!("{} ? {i} : ", template_match(r, true)));
        }
        v.push(("firstDefinite".into(), format!("{first}{n}")));
        let mut parts: Vec<String> = Vec::new();
        for (i, r) in self.cfg.assign.iter().enumerate() {
            let reachable = if i == 0 {
                String::new()
            } else {
                format!(" && variables.firstDefinite >= {i}")
            };
            parts.push(format!(
                "({}{reachable} ? [{i}] : [])",
                template_match(r, false)
            ));
        }
        parts.push(format!("(variables.firstDefinite == {n} ? [-1] : [])"));
        v.push(("assigned".into(), parts.join("\n+ ")));
        v
    }

    fn validations(&self, t: &Target) -> Vec<Value> {
        let subject = t.subject;
        let namespaces = cel::strings(&self.cfg.allow.annotation_namespaces);
        let mut out = vec![validation(
            &format!("request.namespace in {namespaces}"),
            "refused by allow.annotationNamespaces: this namespace may not choose podgate profiles or pools \
             (annotations podgate.dev/profile, podgate.dev/masquerade, podgate.dev/return-routes); fix: remove \
             those annotations, or ask the operator to add the namespace to allow.annotationNamespaces",
            Some(
                "'refused by allow.annotationNamespaces: namespace ' + request.namespace\n\
                 + ' may not choose podgate profiles or pools (annotations podgate.dev/profile, \
                 podgate.dev/masquerade, podgate.dev/return-routes);'\n\
                 + ' fix: remove those annotations, or ask the operator to add ' + request.namespace\n\
                 + ' to allow.annotationNamespaces'",
            ),
        )];
        if !self.cfg.assign.is_empty() {
            let pinned: Vec<&str> = self.cfg.assign.iter().map(|a| a.profile.as_str()).collect();
            let pinned = cel::strings(&pinned);
            let rule = "string(variables.assigned[0])";
            out.push(validation(
                &format!(
                    "size(variables.profile) == 0\n|| variables.assigned.exists(i, i < 0 || {pinned}[i] == variables.profile[0])"
                ),
                &format!(
                    "refused by assign: the operator assigns a profile to {subject} and annotation \
                     podgate.dev/profile asks for another; fix: remove the annotation (the assigned profile \
                     applies), or ask the operator to change the assign rule"
                ),
                Some(&format!(
                    "'refused by assign[' + {rule} + ']: the operator assigns profile '\n\
                     + {}\n\
                     + ' to {subject}; annotation podgate.dev/profile asks for '\n\
                     + {}\n\
                     + '; fix: remove the annotation (the assigned profile applies), or ask the operator to change \
                     assign[' + {rule} + ']'",
                    cel::shown(&format!("{pinned}[variables.assigned[0]]")),
                    cel::shown("variables.profile[0]")
                )),
            ));
        }
        let names: Vec<&str> = self.cfg.profiles.keys().map(String::as_str).collect();
        let defined = if names.is_empty() {
            "none (the operator defines no profile)".to_string()
        } else {
            names
                .iter()
                .map(|n| format!("{n:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push(validation(
            "size(variables.profile) > 0 || size(variables.masquerade) + size(variables.returnRoutes) == 0\n\
             || variables.assigned.exists(i, i >= 0)",
            &format!(
                "pool annotations given but no podgate profile is selected for {subject}; fix: add the \
                 annotation podgate.dev/profile (defined: {defined}), or remove podgate.dev/masquerade and \
                 podgate.dev/return-routes"
            ),
            None,
        ));
        out.push(validation(
            &format!(
                "size(variables.profile) == 0 || variables.profile[0] in {}",
                cel::strings(&names)
            ),
            &format!(
                "refused by profiles: annotation podgate.dev/profile names a profile the operator did not \
                 define; fix: use one of {defined}, or ask the operator to define it"
            ),
            Some(&format!(
                "'refused by profiles: annotation podgate.dev/profile names profile '\n\
                 + {}\n\
                 + ', which the operator did not define; fix: use one of ' + {} + ', or ask the operator to \
                 define it'",
                cel::shown("variables.profile[0]"),
                cel::string(&defined)
            )),
        ));
        let pools = self
            .cfg
            .allow
            .pools
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        for (name, key) in [
            ("masquerade", ANN_MASQUERADE),
            ("returnRoutes", ANN_RETURN_ROUTES),
        ] {
            out.push(pool_validation(name, key, &pools));
        }
        out
    }
}

/// Where a pod's metadata lives in the objects of one policy.
struct Target {
    /// The policy's and its binding's name.
    name: &'static str,
    /// Who the refusal is about, in messages.
    subject: &'static str,
    /// API groups (at v1) and their resources.
    resources: &'static [(&'static str, &'static [&'static str])],
    /// From the object to the pod's metadata.
    meta: &'static [&'static str],
    /// The object is the pod (its name is known), not a template.
    pod: bool,
}

const TARGETS: [Target; 3] = [
    Target {
        name: "podgate-pods",
        subject: "this pod",
        resources: &[("", &["pods"])],
        meta: &["metadata"],
        pod: true,
    },
    Target {
        name: "podgate-pod-templates",
        subject: "the pods of this template",
        resources: &[
            (
                "apps",
                &["deployments", "statefulsets", "daemonsets", "replicasets"],
            ),
            ("batch", &["jobs"]),
        ],
        meta: &["spec", "template", "metadata"],
        pod: false,
    },
    Target {
        name: "podgate-cronjob-templates",
        subject: "the pods of this template",
        resources: &[("batch", &["cronjobs"])],
        meta: &["spec", "jobTemplate", "spec", "template", "metadata"],
        pod: false,
    },
];

impl Target {
    /// `root`'s pod metadata has annotations (every step guarded: a
    /// template's metadata and a CronJob's job spec are optional).
    fn has_annotations(&self, root: &str) -> String {
        let mut path = root.to_string();
        let mut terms = Vec::new();
        for step in self.meta.iter().chain(&["annotations"]) {
            path = format!("{path}.{step}");
            terms.push(format!("has({path})"));
        }
        terms.join(" && ")
    }

    fn annotations(&self, root: &str) -> String {
        format!("{root}.{}.annotations", self.meta.join("."))
    }

    /// The annotation `key` of `root`'s pod as a list of zero or one value.
    fn annotation(&self, root: &str, key: &str) -> String {
        let a = self.annotations(root);
        let k = cel::string(key);
        format!(
            "{} && {k} in {a}\n? [{a}[{k}]] : []",
            self.has_annotations(root)
        )
    }

    /// The policy applies to objects whose pods carry one of the
    /// annotations the router reads, on CREATE and on an UPDATE that
    /// changes one of them (any other update of an object admitted before
    /// a policy change passes: finalizers, labels and scaling go on).
    fn match_conditions(&self) -> Value {
        let keys = cel::strings(&ANNOTATIONS);
        let values = |root: &str| {
            let a = self.annotations(root);
            format!(
                "{keys}.map(k, {} && k in {a} ? 'set ' + {a}[k] : 'unset')",
                self.has_annotations(root)
            )
        };
        json!([
            {"name": "podgate-annotations",
             "expression": format!("{}\n&& {keys}.exists(k, k in {})",
                                   self.has_annotations("object"), self.annotations("object"))},
            {"name": "created-or-podgate-annotations-changed",
             "expression": format!("request.operation != 'UPDATE'\n|| {}\n!= {}",
                                   values("object"), values("oldObject"))},
        ])
    }
}

/// A pod's `assign` rule match, as `AssignRule::matches`.
fn pod_match(r: &AssignRule) -> String {
    let mut terms = Vec::new();
    if let Some(ns) = &r.namespace {
        terms.push(format!("request.namespace == {}", cel::string(ns)));
    }
    if let Some(p) = &r.pod_name_prefix {
        terms.push(format!("variables.podName.startsWith({})", cel::string(p)));
    }
    if let Some(n) = &r.pod_name {
        terms.push(format!("variables.podName == {}", cel::string(n)));
    }
    format!("({})", cel::all(&terms))
}

/// A template's pods and an `assign` rule: whether every pod of it
/// matches (`definite`), or some may (names start with
/// `variables.namePrefix` and go on with generated characters).
fn template_match(r: &AssignRule, definite: bool) -> String {
    let mut terms = Vec::new();
    if let Some(ns) = &r.namespace {
        terms.push(format!("request.namespace == {}", cel::string(ns)));
    }
    if let Some(p) = &r.pod_name_prefix {
        let p = cel::string(p);
        terms.push(if definite {
            format!("variables.namePrefix.startsWith({p})")
        } else {
            format!(
                "(variables.namePrefix.startsWith({p}) || {p}.startsWith(variables.namePrefix))"
            )
        });
    }
    if let Some(n) = &r.pod_name {
        terms.push(if definite {
            "false".into()
        } else {
            format!("{}.startsWith(variables.namePrefix)", cel::string(n))
        });
    }
    format!("({})", cel::all(&terms))
}

/// The first thing wrong with the pool annotation `name` (a list of zero or
/// one value), as the router's loop finds it: the items (split at commas,
/// trimmed, empty ones dropped), each a canonical CIDR inside `pools` or a
/// `!` marker saying what is wrong; the distinct values in the order they
/// first appear, up to the sixteenth (`Heads`, each `Rest<k>` the items
/// left after dropping the first k of them; a marker ends the chain); then
/// `Error`: '' (fine), `!none`, `!many` (an item after the sixteenth
/// distinct pool) or the first marker.
fn pool_variables(name: &str, pools: &str) -> Vec<(String, String)> {
    let var = |s: &str| format!("variables.{name}{s}");
    let mut v = vec![
        (
            format!("{name}Parts"),
            format!(
                "size(variables.{name}) == 0 ? []\n: variables.{name}[0].split(',').map(p, p.trim()).filter(p, p != '')"
            ),
        ),
        (
            format!("{name}Items"),
            format!(
                "{}.map(p,\n  !isCIDR(p) ? '!cidr ' + {}\n  : cidr(p) != cidr(p).masked() \
                 ? '!host ' + string(cidr(p)) + ' has host bits set; fix: write ' + string(cidr(p).masked())\n  \
                 : {pools}.exists(q, q.containsCIDR(cidr(p))) ? string(cidr(p))\n  : '!pools ' + string(cidr(p)))",
                var("Parts"),
                cel::shown("p")
            ),
        ),
    ];
    let mut lists = vec![var("Items")];
    for k in 1..MAX_ANNOTATION_POOLS {
        let prev = lists.last().cloned().unwrap_or_default();
        v.push((
            format!("{name}Rest{k}"),
            format!(
                "size({prev}) == 0 || {prev}[0].startsWith('!') ? []\n: {prev}.filter(c, c != {prev}[0])"
            ),
        ));
        lists.push(var(&format!("Rest{k}")));
    }
    v.push((
        format!("{name}Heads"),
        format!("[{}].filter(r, size(r) > 0).map(r, r[0])", lists.join(", ")),
    ));
    let last = MAX_ANNOTATION_POOLS - 1;
    v.push((
        format!("{name}Error"),
        format!(
            "size(variables.{name}) == 0 ? ''\n\
             : size({parts}) == 0 ? '!none'\n\
             : {heads}.exists(h, h.startsWith('!')) ? {heads}.filter(h, h.startsWith('!'))[0]\n\
             : size({heads}) == {MAX_ANNOTATION_POOLS} && {items}.indexOf({heads}[{last}]) < size({items}) - 1 ? '!many'\n\
             : ''",
            parts = var("Parts"),
            heads = var("Heads"),
            items = var("Items"),
        ),
    ));
    v
}

/// The validation of the pool annotation `name` (`key`); `pools` as the
/// operator wrote allow.pools, for messages.
fn pool_validation(name: &str, key: &str, pools: &str) -> Value {
    let e = format!("variables.{name}Error");
    let fix_cidr =
        "fix: write each pool as a CIDR such as 10.8.0.0/24 or fd00:8::/64 (no leading zeros, \
                    no IPv4-mapped IPv6), separated by commas";
    let message = format!(
        "annotation {key}: a pool is not a CIDR, has host bits set or lies outside allow.pools [{pools}], \
         the annotation names no pool or more than {MAX_ANNOTATION_POOLS}; {fix_cidr}, inside allow.pools"
    );
    let expression = format!(
        "{e} == '!none' ? {none}\n\
         : {e} == '!many' ? {many}\n\
         : {e}.startsWith('!cidr ') ? {cidr_a} + {e}.substring(6) + {cidr_b}\n\
         : {e}.startsWith('!host ') ? {host} + {e}.substring(6)\n\
         : {pools_a} + {e}.substring(7) + {pools_b}",
        none = cel::string(&format!(
            "annotation {key} names no pool; fix: name at least one pool inside allow.pools [{pools}], or remove \
             the annotation (then the pools of the profile apply)"
        )),
        many = cel::string(&format!(
            "annotation {key}: more than {MAX_ANNOTATION_POOLS} pools; fix: name at most {MAX_ANNOTATION_POOLS} \
             pools, each once"
        )),
        cidr_a = cel::string(&format!("annotation {key}: ")),
        cidr_b = cel::string(&format!(" is not a CIDR; {fix_cidr}")),
        host = cel::string(&format!("annotation {key}: ")),
        pools_a = cel::string("refused by allow.pools: "),
        pools_b = cel::string(&format!(
            " from annotation {key} is not inside [{pools}]; fix: name a pool inside them, or ask the operator to \
             add it to allow.pools"
        )),
    );
    validation(&format!("{e} == ''"), &message, Some(&expression))
}

fn validation(expression: &str, message: &str, message_expression: Option<&str>) -> Value {
    let mut v = Map::new();
    v.insert("expression".into(), expression.into());
    v.insert("message".into(), message.into());
    if let Some(m) = message_expression {
        v.insert("messageExpression".into(), m.into());
    }
    v.insert("reason".into(), "Forbidden".into());
    Value::Object(v)
}

/// The API server's CIDR library refuses IPv4-mapped IPv6 addresses; a
/// pool of them can hold no pool an annotation may name (the router
/// refuses those spellings too), so it is left out of the CEL list.
fn is_ipv4_mapped(p: &ipnet::IpNet) -> bool {
    matches!(p.addr(), std::net::IpAddr::V6(a) if a.to_ipv4_mapped().is_some())
}

/// `sha256:<hex>` of `v` as canonical JSON: object keys sorted, no
/// whitespace, strings and numbers as serde_json writes them.
fn digest(v: &Value) -> String {
    let mut text = String::new();
    canonical(v, &mut text);
    let hash = Sha256::digest(text.as_bytes());
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(x) = m.get(k) {
                    canonical(x, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn conf(path: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../conf")
            .join(path)
    }

    fn plugins(router: Value) -> String {
        json!([{"type": "podgate-tunnel-guard", "protectionDir": "/run/x"}, router]).to_string()
    }

    /// Every document of a YAML stream, as `kubectl apply -f` reads it.
    fn documents(yaml: &str) -> Vec<serde_yaml::Value> {
        serde_yaml::Deserializer::from_str(yaml)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect()
    }

    fn router() -> Value {
        json!({
            "type": "podgate-router",
            "profiles": {"vpn-gateway": {"sysctls": {"net.ipv4.ip_forward": "1"}},
                         "relay": {"sysctls": {"net.ipv4.ip_forward": "1"}}},
            "assign": [{"namespace": "vpn", "podName": "gw-0", "profile": "relay"}],
            "allow": {"annotationNamespaces": ["vpn"], "pools": ["10.8.0.0/16"]}
        })
    }

    /// conf/kubernetes/podgate-admission.yaml is what `podgate admission
    /// render` prints for the policy podgate-config.yaml's ConfigMap
    /// holds, and that ConfigMap carries the same digest.
    #[test]
    fn the_shipped_admission_policy_is_the_render_of_the_shipped_policy() {
        let cm: serde_yaml::Value = serde_yaml::from_str(
            &std::fs::read_to_string(conf("kubernetes/podgate-config.yaml")).unwrap(),
        )
        .unwrap();
        let text = cm["data"]["plugins.json"].as_str().unwrap();
        let policy = Policy::from_plugins(text.as_bytes()).unwrap();
        let shipped = std::fs::read_to_string(conf("kubernetes/podgate-admission.yaml")).unwrap();
        assert!(
            policy.render(&[Action::Deny], None) == shipped,
            "conf/kubernetes/podgate-admission.yaml differs from the render of podgate-config.yaml's \
             policy: run `podgate admission render --plugins conf/plugins.json > \
             conf/kubernetes/podgate-admission.yaml`"
        );
        assert_eq!(
            cm["metadata"]["annotations"][DIGEST_ANNOTATION].as_str(),
            Some(policy.digest()),
            "podgate-config.yaml's {DIGEST_ANNOTATION}"
        );
    }

    /// The digest is the router entry's content: not its spelling, not
    /// the other entries.
    #[test]
    fn the_digest_is_the_router_entrys_content() {
        let d = |text: &str| {
            Policy::from_plugins(text.as_bytes())
                .unwrap()
                .digest()
                .to_string()
        };
        let base = d(&plugins(router()));
        assert!(
            base.starts_with("sha256:") && base.len() == 7 + 64,
            "{base}"
        );
        let respelled = serde_json::to_string_pretty(&json!([router()]))
            .unwrap()
            .replace(
                "\"type\": \"podgate-router\",",
                "\"type\":\"podgate-router\",\n\n",
            );
        assert_eq!(d(&respelled), base);
        // Keys in another order.
        let reordered = r#"[{"allow": {"pools": ["10.8.0.0/16"], "annotationNamespaces": ["vpn"]},
            "assign": [{"profile": "relay", "podName": "gw-0", "namespace": "vpn"}],
            "profiles": {"relay": {"sysctls": {"net.ipv4.ip_forward": "1"}},
                         "vpn-gateway": {"sysctls": {"net.ipv4.ip_forward": "1"}}},
            "type": "podgate-router"}]"#;
        assert_eq!(d(reordered), base);
        let mut other = router();
        other["allow"]["annotationNamespaces"] = json!(["vpn", "edge"]);
        assert_ne!(d(&plugins(other)), base);
        // The same digest on every rendered object.
        let p = Policy::from_plugins(plugins(router()).as_bytes()).unwrap();
        let yaml = p.render(&[Action::Deny], Some("[]"));
        assert_eq!(
            yaml.matches(&format!("{DIGEST_ANNOTATION}: \"{base}\""))
                .count(),
            7,
            "{yaml}"
        );
    }

    #[test]
    fn a_policy_renders_only_from_one_valid_router_entry() {
        let err = |text: String| {
            Policy::from_plugins(text.as_bytes())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let guard_only =
            json!([{"type": "podgate-tunnel-guard", "protectionDir": "/run/x"}]).to_string();
        assert!(err(guard_only).contains("has 0 podgate-router entries"));
        assert!(
            err(json!([router(), router()]).to_string()).contains("has 2 podgate-router entries")
        );
        let mut undefined = router();
        undefined["assign"][0]["profile"] = json!("nope");
        assert!(err(plugins(undefined)).contains("assign[0] names profile \"nope\""));
        assert!(err("{".into()).contains("JSON"), "{}", err("{".into()));
    }

    /// `--configmap`: the ConfigMap the DaemonSet mounts, holding the
    /// plugins file byte for byte, first, with the same digest.
    #[test]
    fn the_configmap_holds_the_plugins_file_as_it_is() {
        let text = std::fs::read_to_string(conf("plugins.json")).unwrap();
        let p = Policy::from_plugins(text.as_bytes()).unwrap();
        let yaml = p.render(&[Action::Deny], Some(&text));
        let first = &documents(&yaml)[0];
        assert_eq!(first["kind"], "ConfigMap");
        assert_eq!(first["metadata"]["name"], "podgate-plugins");
        assert_eq!(first["metadata"]["namespace"], "podgate-system");
        assert_eq!(first["data"]["plugins.json"].as_str(), Some(text.as_str()));
        assert_eq!(
            first["metadata"]["annotations"][DIGEST_ANNOTATION].as_str(),
            Some(p.digest())
        );
    }

    #[test]
    fn validation_actions_are_those_the_api_server_accepts() {
        use Action::*;
        for ok in [
            &[Deny][..],
            &[Warn],
            &[Audit],
            &[Deny, Audit],
            &[Warn, Audit],
        ] {
            assert!(check_actions(ok).is_ok(), "{ok:?}");
        }
        for bad in [&[][..], &[Deny, Warn], &[Audit, Audit]] {
            assert!(check_actions(bad).is_err(), "{bad:?}");
        }
        let p = Policy::from_plugins(plugins(router()).as_bytes()).unwrap();
        let docs = documents(&p.render(&[Warn, Audit], None));
        let bindings: Vec<_> = docs
            .iter()
            .filter(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
            .collect();
        assert_eq!(bindings.len(), 3);
        for b in bindings {
            assert_eq!(
                b["spec"]["validationActions"],
                serde_yaml::from_str::<serde_yaml::Value>("[Warn, Audit]").unwrap()
            );
            assert_eq!(b["spec"]["policyName"], b["metadata"]["name"]);
        }
    }

    /// Every `cidr('...')` literal the policy holds is one the API server's
    /// CIDR library reads (the router's own reading of an annotation pool
    /// is that library's): pools with host bits are written masked, and
    /// IPv4-mapped IPv6 ones (which no annotation pool can lie in) are left
    /// out.
    #[test]
    fn allow_pools_become_cidr_literals_the_api_server_reads() {
        let mut r = router();
        r["allow"]["pools"] = json!([
            "10.8.0.1/16",
            "::ffff:0:0/96",
            "::ffff:0:0/95",
            "fd00:8::/32"
        ]);
        let p = Policy::from_plugins(plugins(r).as_bytes()).unwrap();
        let yaml = p.render(&[Action::Deny], None);
        let literals: Vec<&str> = yaml
            .split("cidr('")
            .skip(1)
            .filter_map(|s| s.split_once("')").map(|(l, _)| l))
            .collect();
        assert!(!literals.is_empty());
        for l in &literals {
            assert!(podgate_router::intent::parse_pool(l).is_some(), "{l}");
        }
        for want in ["10.8.0.0/16", "::fffe:0:0/95", "fd00:8::/32"] {
            assert!(literals.contains(&want), "{want} not in {literals:?}");
        }
        assert!(!literals.iter().any(|l| l.contains("ffff")), "{literals:?}");
    }

    /// Each variable uses only those before it (the API server evaluates
    /// them in order), in every policy.
    #[test]
    fn variables_use_only_earlier_variables() {
        let p = Policy::from_plugins(plugins(router()).as_bytes()).unwrap();
        for t in &TARGETS {
            let vars = p.variables(t);
            for (i, (name, expr)) in vars.iter().enumerate() {
                for used in expr.split("variables.").skip(1) {
                    let used: String = used
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric())
                        .collect();
                    assert!(
                        vars.iter().take(i).any(|(n, _)| *n == used),
                        "{}: {name} uses {used} before it is defined",
                        t.name
                    );
                }
            }
        }
    }
}
