//! The Helm chart (`conf/helm/podgate/`) against the plain manifests and
//! podgate's own admission renderer, with the real `helm` binary
//! (`integration/k8s/build.sh`):
//!
//! * each plain file in `conf/kubernetes/` is a named render of the chart
//!   with its default values: the same objects once Helm's own labels are
//!   stripped (comments and `# Source:` lines are not objects);
//! * the chart's policy digest is the one `podgate admission digest`
//!   prints, and the chart refuses an admission render of another policy;
//! * `values.schema.json` makes a typo or a wrong type fail at
//!   `helm template`, and `helm lint` passes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use podgate_integration::{k8s, output_text, podgate_command, workspace_root};
use serde::Deserialize;
use serde_yaml::Value;
use std::path::Path;
use std::process::{Command, Output};

const CHART: &str = "conf/helm/podgate";

/// Each plain manifest, the chart template it is the render of, and the
/// values that name the render (conf/kubernetes/README.md "With Helm").
const RENDERS: &[(&str, &str, &[&str])] = &[
    (
        "conf/kubernetes/podgate-config.yaml",
        "templates/config.yaml",
        &[],
    ),
    (
        "conf/kubernetes/podgate.yaml",
        "templates/podgate.yaml",
        &["--set", "namespace.create=true"],
    ),
    (
        "conf/kubernetes/podgate-uninstall.yaml",
        "templates/uninstall.yaml",
        &["--set", "uninstall=true"],
    ),
    (
        "conf/kubernetes/podgate-admission.yaml",
        "templates/admission.yaml",
        &[],
    ),
];

/// Labels Helm's conventions add that the plain files do not carry.
const HELM_LABELS: &[&str] = &["helm.sh/chart", "app.kubernetes.io/managed-by"];

fn helm(args: &[&str]) -> Output {
    Command::new(k8s::helm())
        .args(args)
        .current_dir(workspace_root())
        .output()
        .expect("running helm")
}

/// `helm template podgate <chart> -n podgate-system ARGS`; its stdout, or
/// Err with its output.
fn template(args: &[&str]) -> Result<String, String> {
    let mut all = vec![
        "template",
        "podgate",
        CHART,
        "--namespace",
        "podgate-system",
    ];
    all.extend_from_slice(args);
    let out = helm(&all);
    match out.status.success() {
        true => Ok(String::from_utf8(out.stdout).unwrap()),
        false => Err(output_text(&out)),
    }
}

/// The objects of a YAML stream, without Helm's labels.
fn objects(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .map(|mut v| {
            if let Some(labels) = v
                .get_mut("metadata")
                .and_then(|m| m.get_mut("labels"))
                .and_then(Value::as_mapping_mut)
            {
                for l in HELM_LABELS {
                    labels.remove(*l);
                }
            }
            v
        })
        .collect()
}

/// Where two values differ, as paths (`[2].spec.template...`).
fn differences(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Mapping(x), Value::Mapping(y)) => {
            for (k, va) in x {
                let key = format!("{path}.{}", serde_yaml::to_string(k).unwrap().trim());
                match y.get(k) {
                    Some(vb) => differences(&key, va, vb, out),
                    None => out.push(format!("{key}: only in the first")),
                }
            }
            for k in y.keys().filter(|k| !x.contains_key(*k)) {
                out.push(format!(
                    "{path}.{}: only in the second",
                    serde_yaml::to_string(k).unwrap().trim()
                ));
            }
        }
        (Value::Sequence(x), Value::Sequence(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                differences(&format!("{path}[{i}]"), va, vb, out);
            }
        }
        _ if a == b => {}
        _ => out.push(format!(
            "{path}: {} vs {}",
            serde_yaml::to_string(a).unwrap().trim(),
            serde_yaml::to_string(b).unwrap().trim()
        )),
    }
}

/// An object's identity: kind, namespace, name.
fn key(v: &Value) -> String {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    format!(
        "{}/{}/{}",
        s(&v["kind"]),
        s(&v["metadata"]["namespace"]),
        s(&v["metadata"]["name"])
    )
}

/// Differences between a plain file's objects and a render's, object by
/// object (Helm orders a render's objects by kind).
fn compare(plain: &[Value], rendered: &[Value]) -> Vec<String> {
    let by_key = |objs: &[Value]| {
        objs.iter()
            .map(|o| (key(o), o.clone()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let (a, b) = (by_key(plain), by_key(rendered));
    assert_eq!(a.len(), plain.len(), "two objects of one name");
    let mut out = Vec::new();
    for (k, va) in &a {
        match b.get(k) {
            Some(vb) => differences(k, va, vb, &mut out),
            None => out.push(format!("{k}: only in the first")),
        }
    }
    for k in b.keys().filter(|k| !a.contains_key(*k)) {
        out.push(format!("{k}: only in the second"));
    }
    out
}

fn plain(path: &str) -> Vec<Value> {
    objects(&std::fs::read_to_string(workspace_root().join(path)).unwrap())
}

fn named_render(tpl: &str, sets: &[&str]) -> Vec<Value> {
    let mut args = vec!["--show-only", tpl];
    args.extend_from_slice(sets);
    objects(&template(&args).unwrap_or_else(|e| panic!("helm template {tpl}: {e}")))
}

#[test]
fn each_plain_manifest_is_a_named_render_of_the_chart() {
    for (file, tpl, sets) in RENDERS {
        let (p, r) = (plain(file), named_render(tpl, sets));
        assert!(!p.is_empty(), "{file}: no objects");
        let diff = compare(&p, &r);
        assert!(
            diff.is_empty(),
            "{file} differs from `helm template {CHART} --show-only {tpl} {}` (plain vs chart; \
             change both, conf/kubernetes/README.md \"With Helm\"):\n  {}",
            sets.join(" "),
            diff.join("\n  ")
        );
    }
}

#[test]
fn a_difference_between_the_chart_and_a_plain_file_is_reported() {
    // A value changed on the chart's side.
    let p = plain("conf/kubernetes/podgate.yaml");
    let r = named_render(
        "templates/podgate.yaml",
        &[
            "--set",
            "namespace.create=true",
            "--set",
            "cni.confDir=/etc/k3s/net.d",
        ],
    );
    let diff = compare(&p, &r);
    assert_eq!(diff.len(), 1, "{diff:?}");
    assert!(diff[0].contains("/etc/k3s/net.d"), "{diff:?}");
    // A field changed on the plain file's side (a comment is no change).
    let text =
        std::fs::read_to_string(workspace_root().join("conf/kubernetes/podgate-uninstall.yaml"))
            .unwrap();
    let r = named_render("templates/uninstall.yaml", &["--set", "uninstall=true"]);
    let commented = text.replace("# Takes podgate off every node.", "# Takes it off.");
    assert!(compare(&objects(&commented), &r).is_empty());
    let edited = text.replacen("--sweep-secs=10", "--sweep-secs=11", 1);
    let diff = compare(&objects(&edited), &r);
    assert!(
        diff.len() == 1 && diff[0].contains("--sweep-secs=11"),
        "{diff:?}"
    );
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = workspace_root().join("target/chart-test");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn podgate(args: &[&str]) -> String {
    let out = podgate_command()
        .args(args)
        .output()
        .expect("running podgate");
    assert!(
        out.status.success(),
        "podgate {args:?}: {}",
        output_text(&out)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The shipped policy with a second profile and an assign rule, and `<`,
/// `>`, `&` and non-ASCII text in it (Go's JSON escapes the first three).
fn other_policy() -> String {
    let mut entries: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("conf/plugins.json")).unwrap(),
    )
    .unwrap();
    let router = entries
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|e| e["type"] == "podgate-router")
        .unwrap();
    router["logFile"] = "/var/log/podgate/r<&>é.log".into();
    router["profiles"]["gw-ü"] = serde_json::json!({"sysctls": {"net.ipv4.ip_forward": "1"}});
    router["assign"] =
        serde_json::json!([{"namespace": "vpn", "podNamePrefix": "gw-", "profile": "gw-ü"}]);
    router["allow"]["pools"] = serde_json::json!(["10.8.0.0/16", "fd00:8::/48"]);
    serde_json::to_string_pretty(&entries).unwrap()
}

fn digest_annotation(objs: &[Value]) -> String {
    objs[0]["metadata"]["annotations"]["podgate.dev/policy-digest"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn the_chart_digests_the_policy_as_podgate_admission_digest_does() {
    let file = scratch("other-plugins.json");
    std::fs::write(&file, other_policy()).unwrap();
    let f = file.to_str().unwrap();
    let want = podgate(&["admission", "digest", "--plugins", f]);
    let policy = format!("policy={f}");
    // (admission off: the chart's own render is of its default policy)
    let cm = named_render(
        "templates/config.yaml",
        &["--set-file", &policy, "--set", "admission.enabled=false"],
    );
    assert_eq!(digest_annotation(&cm), want.trim());
    let shipped = podgate(&[
        "admission",
        "digest",
        "--plugins",
        workspace_root().join("conf/plugins.json").to_str().unwrap(),
    ]);
    let cm = named_render("templates/config.yaml", &[]);
    assert_eq!(
        digest_annotation(&cm),
        shipped.trim(),
        "the chart's default policy is conf/plugins.json's"
    );
}

#[test]
fn the_chart_takes_podgate_admission_render_of_its_policy_and_refuses_another() {
    let file = scratch("render-plugins.json");
    std::fs::write(&file, other_policy()).unwrap();
    let f = file.to_str().unwrap();
    let policy = format!("policy={f}");
    // The chart's own render is of its default policy: refused.
    let err = template(&[
        "--show-only",
        "templates/admission.yaml",
        "--set-file",
        &policy,
    ])
    .unwrap_err();
    assert!(
        err.contains("carries policy digest") && err.contains("podgate admission render --plugins"),
        "{err}"
    );
    // podgate's render of the policy, validationActions from the values.
    let render = podgate(&[
        "admission",
        "render",
        "--plugins",
        f,
        "--validation-actions",
        "Warn,Audit",
    ]);
    let rfile = scratch("render.yaml");
    std::fs::write(&rfile, &render).unwrap();
    let set_render = format!("admission.render={}", rfile.to_str().unwrap());
    let chart = named_render(
        "templates/admission.yaml",
        &[
            "--set-file",
            &policy,
            "--set-file",
            &set_render,
            "--set-json",
            r#"admission.validationActions=["Warn","Audit"]"#,
        ],
    );
    let diff = compare(&objects(&render), &chart);
    assert!(diff.is_empty(), "{diff:?}");
    let deny = named_render(
        "templates/admission.yaml",
        &["--set-file", &policy, "--set-file", &set_render],
    );
    let diff = compare(&objects(&render), &deny);
    assert!(
        !diff.is_empty() && diff.iter().all(|d| d.contains("validationActions")),
        "{diff:?}"
    );
    // Before 1.31 (no CEL IP and CIDR functions): refused, unless off.
    let err = template(&["--kube-version", "1.30.4"]).unwrap_err();
    assert!(err.contains("needs Kubernetes 1.31"), "{err}");
    template(&[
        "--kube-version",
        "1.30.4",
        "--set",
        "admission.enabled=false",
    ])
    .unwrap();
    // Off: no admission objects.
    assert!(template(&[
        "--show-only",
        "templates/admission.yaml",
        "--set",
        "admission.enabled=false"
    ])
    .is_err());
}

#[test]
fn a_typo_or_a_wrong_type_in_the_values_fails_at_template() {
    for (set, names) in [
        ("image.tagg=x", "tagg"),
        ("tolerationz[0].operator=Exists", "tolerationz"),
        ("metrics.port=metrics", "/metrics/port"),
        ("uninstall=yes", "/uninstall"),
        ("cni.binDir=opt/cni/bin", "/cni/binDir"),
    ] {
        let err = template(&["--set", set]).unwrap_err();
        assert!(
            err.contains("values don't meet the specifications") || err.contains(names),
            "{set}: {err}"
        );
        assert!(err.contains(names), "{set}: {err}");
    }
    let out = helm(&["lint", "--strict", CHART]);
    assert!(out.status.success(), "helm lint: {}", output_text(&out));
}

#[test]
fn the_chart_admission_file_is_the_plain_file() {
    let link = workspace_root()
        .join(CHART)
        .join("files/podgate-admission.yaml");
    let target = std::fs::canonicalize(&link).unwrap();
    assert_eq!(
        target,
        std::fs::canonicalize(workspace_root().join("conf/kubernetes/podgate-admission.yaml"))
            .unwrap()
    );
    assert!(Path::new(&link).is_symlink());
}
