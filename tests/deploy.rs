//! deploy/: every example configuration passes `walrelay check-config` (the real binary),
//! and the Kubernetes manifests parse and hang together (names, ports, probes, Secrets,
//! hardening, resources). The systemd units are in `deploy_systemd.rs`.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml::Value;

mod common;
use common::deploy::{deploy, files, longest_stop_secs};

/// Absolute paths the examples use, moved under a test directory.
const PREFIXES: &[&str] = &["/etc/walrelay/", "/run/credentials/"];

/// Rewrites the example's absolute paths into `root` and returns the rewritten text and the
/// files it names outside comments (the path as the example has it → the path under `root`).
fn relocate(text: &str, root: &Path) -> (String, BTreeMap<String, PathBuf>) {
    let mut named = BTreeMap::new();
    let mut out = text.to_string();
    let toml: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    for prefix in PREFIXES {
        let mut from = 0;
        while let Some(i) = toml[from..].find(prefix) {
            let start = from + i;
            let end = toml[start..]
                .find(|c: char| c == '"' || c == '\'' || c.is_whitespace())
                .map_or(toml.len(), |n| start + n);
            let path = &toml[start..end];
            named.insert(path.to_string(), root.join(path.trim_start_matches('/')));
            from = end;
        }
        out = out.replace(prefix, &format!("{}{prefix}", root.display()));
    }
    (out, named)
}

/// Runs `walrelay check-config` on `toml` (with its files relocated to `root`, which the
/// caller filled); asserts success and returns its output.
fn check_config(name: &str, toml: &str, root: &Path) -> String {
    // check-config checks that the spool's directory can be made: under `root`, its parent
    // there as systemd's `StateDirectory=walrelay` (or the pod's volume) makes it.
    let state = root.join("var/lib/walrelay");
    std::fs::create_dir_all(&state).unwrap();
    let toml = toml.replace("/var/lib/walrelay/", &format!("{}/", state.display()));
    let path = root.join(name);
    std::fs::write(&path, toml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(["check-config", "--config"])
        .arg(&path)
        .env_clear()
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{name} fails check-config: {text}");
    text
}

/// TLS material that check-config accepts (it parses every file and matches each key to its
/// certificate), for a file the examples name: a CA for `.pem`, a certificate signed by it for
/// `.crt`, that certificate's key for `.key`; None for other files.
fn tls_material(name: &str) -> Option<String> {
    use std::sync::OnceLock;
    static PEMS: OnceLock<(String, String, String)> = OnceLock::new();
    let (ca, crt, key) = PEMS.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let ca = walrelay_harness::certs::Ca::new("deploy test CA").unwrap();
        let leaf = ca.issue(dir.path(), "leaf", &["localhost"]).unwrap();
        let read = |p: &Path| std::fs::read_to_string(p).unwrap();
        (ca.cert_pem.clone(), read(&leaf.cert), read(&leaf.key))
    });
    let ext = Path::new(name).extension()?.to_str()?;
    match ext {
        "pem" => Some(ca.clone()),
        "crt" => Some(crt.clone()),
        "key" => Some(key.clone()),
        _ => None,
    }
}

fn write(path: &Path, contents: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, contents).unwrap();
}

#[test]
fn example_tomls_pass_check_config() {
    let tomls = files(&deploy(), "toml");
    assert_eq!(tomls.len(), 2, "{tomls:?}");
    for f in tomls {
        let root = tempfile::tempdir().unwrap();
        let (text, named) = relocate(&std::fs::read_to_string(&f).unwrap(), root.path());
        assert!(!named.is_empty(), "{}: no files named", f.display());
        for (orig, path) in &named {
            let contents = if orig.ends_with(".scram") {
                walrelay_pgwire::scram::new_verifier("dummy")
            } else {
                tls_material(orig).unwrap_or_else(|| "dummy".into())
            };
            write(path, &contents);
        }
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let out = check_config(&name, &text, root.path());
        let half = name.trim_end_matches(".toml");
        assert!(out.contains(&format!("OK ({half})")), "{name}: {out}");
    }
}

/// Every document of every manifest under deploy/k8s.
fn manifests() -> Vec<(String, Value)> {
    let mut docs = Vec::new();
    for f in files(&deploy().join("k8s"), "yaml") {
        let text = std::fs::read_to_string(&f).unwrap();
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        for d in serde_yaml::Deserializer::from_str(&text) {
            let v = Value::deserialize(d).unwrap_or_else(|e| panic!("{name}: {e}"));
            docs.push((name.clone(), v));
        }
    }
    docs
}

use serde::Deserialize;

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    get(v, path)
        .as_str()
        .unwrap_or_else(|| panic!("{path:?} is not a string in {v:?}"))
}

fn get<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(v, |v, k| &v[*k])
}

fn of_kind<'a>(docs: &'a [(String, Value)], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|(_, d)| d["kind"].as_str() == Some(kind))
        .map(|(_, d)| d)
        .collect()
}

/// The Kubernetes objects every Deployment refers to.
fn shared(docs: &[(String, Value)]) -> Shared<'_> {
    let cms = of_kind(docs, "ConfigMap");
    assert_eq!(cms.len(), 1);
    Shared {
        cm: cms[0],
        secrets: of_kind(docs, "Secret"),
        services: of_kind(docs, "Service"),
    }
}

#[test]
fn k8s_configs_pass_check_config_with_their_secret_mounted() {
    let docs = manifests();
    let shared = shared(&docs);
    let mut checked = BTreeSet::new();
    for dep in of_kind(&docs, "Deployment") {
        let name = s(dep, &["metadata", "name"]);
        let pod = get(dep, &["spec", "template", "spec"]);
        let (key, toml, secret) = mounted_config(name, pod, &pod["containers"][0], &shared);
        check_with_secret(key, toml, secret);
        checked.insert(key);
    }
    assert_eq!(checked.len(), 2);
}

/// Runs check-config on the ConfigMap's `key` with the files it names taken from `secret`,
/// mounted at /etc/walrelay/secrets; the Secret holds no key the config does not read (each
/// half's pod holds only its own keys: one Secret for both gave the downstream's datacenter
/// the primary's password and the upstream's link key).
fn check_with_secret(key: &str, toml: &str, secret: &Value) {
    let secret_name = s(secret, &["metadata", "name"]);
    let data = get(secret, &["stringData"]).as_mapping().unwrap();
    assert!(key.ends_with(".toml"), "{key}");
    let root = tempfile::tempdir().unwrap();
    let (text, named) = relocate(toml, root.path());
    let mut read = BTreeSet::new();
    for (orig, path) in &named {
        let k = orig
            .strip_prefix("/etc/walrelay/secrets/")
            .unwrap_or_else(|| panic!("{key}: {orig} is not in the mounted Secret"));
        let v = data
            .get(k)
            .unwrap_or_else(|| panic!("{key}: the Secret {secret_name} has no key {k}"));
        let contents = if k.ends_with(".scram") {
            // The Secret holds a placeholder; it must at least be in the right form.
            let v = v.as_str().unwrap();
            v.parse::<walrelay_pgwire::scram::ScramVerifier>()
                .unwrap_or_else(|e| panic!("Secret key {k}: {e}"));
            v.to_string()
        } else {
            // The Secret holds placeholders for TLS material; check-config needs real PEM.
            tls_material(k).unwrap_or_else(|| v.as_str().unwrap().to_string())
        };
        write(path, &contents);
        read.insert(k);
    }
    for k in data.keys().map(|k| k.as_str().unwrap()) {
        assert!(
            read.contains(k),
            "the Secret {secret_name} mounted for {key} holds {k}, which {key} does not read"
        );
    }
    let out = check_config(key, &text, root.path());
    assert!(
        out.contains(&format!("OK ({})", key.trim_end_matches(".toml"))),
        "{key}: {out}"
    );
    // The probes and the metrics Services need the metrics listener on 9187.
    let parsed: toml::Value = toml::from_str(toml).unwrap();
    assert_eq!(
        parsed
            .get("metrics")
            .and_then(|m| m.get("listen"))
            .and_then(|l| l.as_str()),
        Some("0.0.0.0:9187"),
        "{key}: [metrics] listen must serve the probes"
    );
}

#[test]
fn k8s_manifests_are_consistent_and_hardened() {
    let docs = manifests();
    assert_every_document_is_named(&docs);
    assert_the_kustomization_lists_every_manifest(&docs);
    let deployments = of_kind(&docs, "Deployment");
    assert_eq!(deployments.len(), 2);
    let shared = shared(&docs);
    let mut halves = Vec::new();
    for dep in &deployments {
        halves.push(check_deployment(dep, &shared));
    }
    halves.sort();
    assert_eq!(halves, ["downstream", "upstream"]);
}

/// What the Deployments refer to: the ConfigMap, the Secrets and the Services.
struct Shared<'a> {
    cm: &'a Value,
    secrets: Vec<&'a Value>,
    services: Vec<&'a Value>,
}

/// Checks that every document has an apiVersion and a kind, and a name but for the
/// Kustomization.
fn assert_every_document_is_named(docs: &[(String, Value)]) {
    for (file, d) in docs {
        for k in ["apiVersion", "kind"] {
            assert!(d[k].as_str().is_some(), "{file}: no {k}");
        }
        if d["kind"].as_str() != Some("Kustomization") {
            assert!(d["metadata"]["name"].as_str().is_some(), "{file}: no name");
        }
    }
}

/// Checks that the kustomization lists every manifest under deploy/k8s.
fn assert_the_kustomization_lists_every_manifest(docs: &[(String, Value)]) {
    // The kustomization lists every manifest.
    let kust = of_kind(docs, "Kustomization");
    let listed: Vec<&str> = kust[0]["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    for f in files(&deploy().join("k8s"), "yaml") {
        let n = f.file_name().unwrap().to_str().unwrap();
        assert!(
            n == "kustomization.yaml" || listed.contains(&n),
            "{n} not in the kustomization"
        );
    }
}

/// Checks one Deployment (hardening, probes, mounts, grace period, Services); returns the
/// half it runs.
fn check_deployment(dep: &Value, shared: &Shared) -> String {
    let name = s(dep, &["metadata", "name"]);
    let pod = get(dep, &["spec", "template", "spec"]);
    let labels = get(dep, &["spec", "template", "metadata", "labels"]);
    assert_eq!(&dep["spec"]["selector"]["matchLabels"], labels, "{name}");
    assert_pod_runs_as_non_root(name, pod);
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    let c = &pod["containers"][0];
    assert_container_is_hardened(name, c);
    // Ports by name; probes on GET /livez of the metrics port 9187.
    let ports: BTreeMap<&str, u64> = c["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| (s(p, &["name"]), p["containerPort"].as_u64().unwrap()))
        .collect();
    assert_eq!(ports.get("metrics"), Some(&9187), "{name}");
    assert_probes_on_livez(name, c, &ports);
    let (key, toml, _) = mounted_config(name, pod, c, shared);
    assert_memory_holds_a_stream(name, c, toml);
    let drain: toml::Table = toml::from_str(toml).unwrap();
    let drain = drain["limits"]["drain_timeout_secs"].as_integer().unwrap() as u64;
    assert!(
        grace > longest_stop_secs(drain),
        "{name}: terminationGracePeriodSeconds {grace} <= {} s, the longest a stop takes with drain_timeout_secs {drain}",
        longest_stop_secs(drain)
    );
    // Each listener of the config has a Service selecting this pod.
    let cfg: toml::Table = toml::from_str(toml).unwrap();
    let half = key.trim_end_matches(".toml");
    let listen = cfg[half]["listen"].as_str().unwrap();
    let port: u64 = listen.rsplit_once(':').unwrap().1.parse().unwrap();
    for want in [port, 9187] {
        assert_a_service_selects(name, want, labels, &ports, &shared.services);
    }
    half.to_string()
}

/// Checks the pod's security context: not root, a user id above 0.
fn assert_pod_runs_as_non_root(name: &str, pod: &Value) {
    let psc = &pod["securityContext"];
    assert_eq!(psc["runAsNonRoot"].as_bool(), Some(true), "{name}");
    assert!(
        psc["runAsUser"].as_u64().is_some_and(|u| u > 0),
        "{name}: runAsUser"
    );
}

/// Checks the container's security context (read-only root, no escalation, no capabilities)
/// and its resource limits and requests.
fn assert_container_is_hardened(name: &str, c: &Value) {
    let csc = &c["securityContext"];
    assert_eq!(
        csc["readOnlyRootFilesystem"].as_bool(),
        Some(true),
        "{name}"
    );
    assert_eq!(
        csc["allowPrivilegeEscalation"].as_bool(),
        Some(false),
        "{name}"
    );
    assert_eq!(csc["capabilities"]["drop"][0].as_str(), Some("ALL"));
    for r in ["cpu", "memory"] {
        assert!(
            c["resources"]["limits"][r].as_str().is_some()
                && c["resources"]["requests"][r].as_str().is_some(),
            "{name}: resources {r}"
        );
    }
}

/// Checks that the memory request holds one link stream's caches once full (about 1.4 ×
/// `link.block_cache_bytes`, README: the request was 512 MiB against 1.4 GiB at the default),
/// and the limit at least the request.
fn assert_memory_holds_a_stream(name: &str, c: &Value, toml: &str) {
    let cfg: toml::Table = toml::from_str(toml).unwrap();
    let cache = cfg
        .get("link")
        .and_then(|l| l.get("block_cache_bytes"))
        .map(|v| v.as_integer().unwrap() as u64)
        .unwrap_or(walrelay::config::LinkConfig::default().block_cache_bytes);
    let mem = |kind: &str| quantity(s(c, &["resources", kind, "memory"]));
    let (request, limit) = (mem("requests"), mem("limits"));
    assert!(
        request >= cache / 2 * 3,
        "{name}: memory request {request} < 1.5 x link.block_cache_bytes {cache}"
    );
    assert!(limit >= request, "{name}: memory limit below the request");
}

/// A Kubernetes quantity of bytes: `2Gi`, `512Mi`, `1G`, `1000`.
fn quantity(q: &str) -> u64 {
    let units = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    let (n, mult) = units
        .iter()
        .find_map(|(u, m)| q.strip_suffix(u).map(|n| (n, *m)))
        .unwrap_or((q, 1));
    n.parse::<u64>()
        .unwrap_or_else(|e| panic!("quantity {q:?}: {e}"))
        * mult
}

/// Checks that both probes GET /livez on the metrics port 9187. Not /healthz: it answers 503
/// while the downstream's spool is failed, which the process mends by itself while it serves
/// standbys what the spool holds; a liveness probe there restarted it for nothing (a full
/// disk stays full) and a readiness probe unrouted the only replica.
fn assert_probes_on_livez(name: &str, c: &Value, ports: &BTreeMap<&str, u64>) {
    for probe in ["livenessProbe", "readinessProbe"] {
        let h = &c[probe]["httpGet"];
        assert_eq!(h["path"].as_str(), Some("/livez"), "{name} {probe}");
        let port = match &h["port"] {
            Value::String(n) => ports[n.as_str()],
            p => p.as_u64().unwrap(),
        };
        assert_eq!(port, 9187, "{name} {probe}");
    }
}

/// Finds the ConfigMap key the container runs with and the one Secret mounted at
/// /etc/walrelay/secrets; returns the key, its TOML and the Secret.
fn mounted_config<'a>(
    name: &str,
    pod: &'a Value,
    c: &'a Value,
    shared: &Shared<'a>,
) -> (&'a str, &'a str, &'a Value) {
    // The config it runs is a key of the ConfigMap, mounted where the args say, and a
    // Secret is mounted where the configs look for it.
    let args: Vec<&str> = c["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let config = args[args.iter().position(|a| *a == "--config").unwrap() + 1];
    let mounts: BTreeMap<&str, &str> = c["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|m| (s(m, &["name"]), s(m, &["mountPath"])))
        .collect();
    let volumes = pod["volumes"].as_sequence().unwrap();
    let vol = |kind: &str, field: &str, target: &Value| -> &str {
        let v = volumes
            .iter()
            .find(|v| v[kind][field] == target["metadata"]["name"])
            .unwrap_or_else(|| panic!("{name}: no {kind} volume"));
        mounts[s(v, &["name"])]
    };
    let cm_dir = vol("configMap", "name", shared.cm);
    let key = config
        .strip_prefix(&format!("{cm_dir}/"))
        .unwrap_or_else(|| panic!("{name}: {config} is not under {cm_dir}"));
    let toml = shared.cm["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key}"));
    let mut mounted = shared.secrets.iter().filter(|sec| {
        volumes
            .iter()
            .any(|v| v["secret"]["secretName"] == sec["metadata"]["name"])
    });
    let secret = mounted
        .next()
        .unwrap_or_else(|| panic!("{name}: no Secret volume"));
    assert!(mounted.next().is_none(), "{name}: more than one Secret");
    assert_eq!(vol("secret", "secretName", secret), "/etc/walrelay/secrets");
    (key, toml, secret)
}

/// Checks that a Service selects the pod with `labels` and targets its port `want`.
fn assert_a_service_selects(
    name: &str,
    want: u64,
    labels: &Value,
    ports: &BTreeMap<&str, u64>,
    services: &[&Value],
) {
    let found =
        services.iter().any(|svc| {
            let sel = svc["spec"]["selector"].as_mapping().unwrap();
            sel.iter().all(|(k, v)| &labels[k] == v)
                && svc["spec"]["ports"].as_sequence().unwrap().iter().any(|p| {
                    match &p["targetPort"] {
                        Value::String(n) => ports.get(n.as_str()) == Some(&want),
                        t => t.as_u64() == Some(want),
                    }
                })
        });
    assert!(found, "{name}: no Service for port {want}");
}
