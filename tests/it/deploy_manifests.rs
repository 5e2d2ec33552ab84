//! `deploy/`: every manifest parses as YAML and has the shape the README promises, the
//! ConfigMap's config passes config validation and the JSON Schema, and the annotation table
//! of the README and the schema name exactly the annotations the code reads.

use std::path::{Path, PathBuf};

use kvindex::config::Config;
use kvindex::ingest::discovery::{
    ANNOTATION_DP_RANKS, ANNOTATION_ENGINE, ANNOTATION_MODEL, ANNOTATION_PORT,
    ANNOTATION_REPLAY_PORT, ANNOTATION_TOPIC,
};
use serde_json::Value;

const ANNOTATIONS: [&str; 6] = [
    ANNOTATION_ENGINE,
    ANNOTATION_MODEL,
    ANNOTATION_PORT,
    ANNOTATION_REPLAY_PORT,
    ANNOTATION_DP_RANKS,
    ANNOTATION_TOPIC,
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn manifest_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("deploy/kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 8, "{files:?}");
    files
}

/// Every YAML document of a file (split on `---` lines).
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut docs = Vec::new();
    let mut current = String::new();
    for line in text.lines().chain(std::iter::once("---")) {
        if line.trim_end() == "---" {
            let body: String = current
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .collect();
            if !body.trim().is_empty() {
                let doc: Value = serde_saphyr::from_str(&current)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                docs.push(doc);
            }
            current.clear();
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    docs
}

fn all_objects() -> Vec<(PathBuf, Value)> {
    manifest_files()
        .into_iter()
        .flat_map(|p| documents(&p).into_iter().map(move |d| (p.clone(), d)))
        .collect()
}

fn object<'a>(all: &'a [(PathBuf, Value)], kind: &str, file: &str) -> &'a Value {
    all.iter()
        .find(|(p, d)| d["kind"] == kind && p.ends_with(file))
        .map(|(_, d)| d)
        .unwrap_or_else(|| panic!("no {kind} in {file}"))
}

#[test]
fn every_manifest_parses_and_names_its_kind() {
    for (path, doc) in all_objects() {
        let what = path.display();
        assert!(doc["apiVersion"].is_string(), "{what}: {doc}");
        assert!(doc["kind"].is_string(), "{what}: {doc}");
        if doc["kind"] != "Kustomization" {
            assert!(doc["metadata"]["name"].is_string(), "{what}: {doc}");
        }
    }
}

#[test]
fn the_kustomization_lists_existing_files() {
    let all = all_objects();
    let k = object(&all, "Kustomization", "kustomization.yaml");
    for r in k["resources"].as_array().unwrap() {
        let file = root().join("deploy/kubernetes").join(r.as_str().unwrap());
        assert!(file.exists(), "{}", file.display());
    }
}

#[test]
fn the_configmap_config_is_valid_and_matches_the_schema() {
    let all = all_objects();
    let cm = object(&all, "ConfigMap", "configmap.yaml");
    let text = cm["data"]["kvindex.yaml"].as_str().unwrap();
    let config = Config::from_str(text).unwrap_or_else(|e| panic!("{e}"));
    let k = config.discovery.expect("the shipped config discovers pods");
    assert!(k.label_selector.is_some());
    assert_eq!(config.api.unwrap().listen.port(), 8080);
    assert_eq!(config.metrics_listen.port(), 9090);
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("schemas/config.schema.json")).unwrap(),
    )
    .unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let instance: Value = serde_saphyr::from_str(text).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&instance)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
}

#[test]
fn rbac_grants_get_list_watch_on_pods_only() {
    let all = all_objects();
    for (kind, file) in [
        ("ClusterRole", "rbac.yaml"),
        ("Role", "rbac-namespaced.yaml"),
    ] {
        let role = object(&all, kind, file);
        let rules = role["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 1, "{role}");
        assert_eq!(rules[0]["resources"], serde_json::json!(["pods"]));
        assert_eq!(rules[0]["apiGroups"], serde_json::json!([""]));
        assert_eq!(
            rules[0]["verbs"],
            serde_json::json!(["get", "list", "watch"])
        );
    }
    let sa = object(&all, "ServiceAccount", "rbac.yaml");
    let binding = object(&all, "ClusterRoleBinding", "rbac.yaml");
    assert_eq!(binding["subjects"][0]["name"], sa["metadata"]["name"]);
}

/// The pod template's checks shared by the Deployment and the StatefulSet.
fn check_pod_template(workload: &Value, all: &[(PathBuf, Value)]) -> Value {
    let pod = &workload["spec"]["template"]["spec"];
    let sa = object(all, "ServiceAccount", "rbac.yaml");
    assert_eq!(pod["serviceAccountName"], sa["metadata"]["name"]);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let c = &pod["containers"][0];
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(c["resources"]["requests"]["memory"].is_string());
    assert!(c["resources"]["requests"]["cpu"].is_string());
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    let cm = object(all, "ConfigMap", "configmap.yaml");
    assert_eq!(
        pod["volumes"][0]["configMap"]["name"],
        cm["metadata"]["name"]
    );
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let mount = c["volumeMounts"][0]["mountPath"].as_str().unwrap();
    assert_eq!(
        args[..3],
        ["serve", "--config", &format!("{mount}/kvindex.yaml")]
    );
    c.clone()
}

#[test]
fn the_workloads_probe_health_run_unprivileged_and_mount_the_config() {
    let all = all_objects();
    let deployment = object(&all, "Deployment", "deployment.yaml");
    assert_eq!(deployment["spec"]["replicas"], 1);
    check_pod_template(deployment, &all);
    let sts = object(&all, "StatefulSet", "statefulset.yaml");
    let c = check_pod_template(sts, &all);
    let shard = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "KVINDEX_SHARD_INDEX")
        .expect("the StatefulSet passes its ordinal as the shard index");
    assert_eq!(
        shard["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.labels['apps.kubernetes.io/pod-index']"
    );
    let service = object(&all, "Service", "service.yaml");
    let ports: Vec<&str> = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(ports, ["api", "metrics"]);
    let monitor = object(&all, "ServiceMonitor", "servicemonitor.yaml");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
}

#[test]
fn the_dockerfile_is_multi_stage_and_runs_as_non_root() {
    let text = std::fs::read_to_string(root().join("deploy/Dockerfile")).unwrap();
    let froms = text.lines().filter(|l| l.starts_with("FROM ")).count();
    assert!(froms >= 2, "multi-stage: {froms} FROM lines");
    assert!(
        text.contains("COPY --from=build"),
        "the runtime stage copies the binary only"
    );
    let user = text
        .lines()
        .rfind(|l| l.starts_with("USER "))
        .expect("a USER line");
    assert!(!user.contains("root") && !user.contains(" 0"), "{user}");
}

#[test]
fn readme_and_schema_list_every_annotation_the_code_reads() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let table: Vec<&str> = readme
        .lines()
        .filter(|l| l.starts_with("| `kvindex.io/"))
        .filter_map(|l| l.split('`').nth(1))
        .collect();
    assert_eq!(table, ANNOTATIONS);
    let schema = std::fs::read_to_string(root().join("schemas/config.schema.json")).unwrap();
    for a in ANNOTATIONS {
        assert!(schema.contains(a), "{a} missing from the config schema");
    }
}

/// The `PodDisruptionBudget`s of `file`.
fn budgets<'a>(all: &'a [(PathBuf, Value)], file: &str) -> Vec<&'a Value> {
    all.iter()
        .filter(|(p, d)| d["kind"] == "PodDisruptionBudget" && p.ends_with(file))
        .map(|(_, d)| d)
        .collect()
}

/// Whether `selector` picks pods with `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector["matchLabels"]
        .as_object()
        .unwrap()
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v) || k == "apps.kubernetes.io/pod-index")
}

#[test]
fn the_ha_variants_run_two_replicas_per_writer_under_disruption_budgets() {
    let all = all_objects();
    let cm = object(&all, "ConfigMap", "configmap.yaml");
    let config = Config::from_str(cm["data"]["kvindex.yaml"].as_str().unwrap()).unwrap();
    assert!(config.ha.is_some(), "the shipped config elects one writer");

    let deployment = object(&all, "Deployment", "deployment-ha.yaml");
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(deployment["spec"]["strategy"]["type"], "RollingUpdate");
    assert_eq!(
        deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        0
    );
    check_pod_template(deployment, &all);
    let pdb = budgets(&all, "deployment-ha.yaml");
    assert_eq!(pdb.len(), 1);
    assert_eq!(pdb[0]["spec"]["minAvailable"], 1);
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    assert!(selects(&pdb[0]["spec"]["selector"], labels));

    let sets: Vec<&Value> = all
        .iter()
        .filter(|(p, d)| d["kind"] == "StatefulSet" && p.ends_with("statefulset-ha.yaml"))
        .map(|(_, d)| d)
        .collect();
    assert_eq!(sets.len(), 2, "two replicas of every shard");
    assert_ne!(
        sets[0]["spec"]["selector"], sets[1]["spec"]["selector"],
        "each set selects its own pods"
    );
    let mut shards = None;
    for set in &sets {
        let c = check_pod_template(set, &all);
        let count = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "KVINDEX_SHARD_COUNT")
            .and_then(|e| e["value"].as_str()?.parse::<u64>().ok())
            .expect("the shard count is set");
        assert_eq!(set["spec"]["replicas"], count, "one replica per shard");
        assert_eq!(*shards.get_or_insert(count), count, "both sets split alike");
        let labels = &set["spec"]["template"]["metadata"]["labels"];
        assert!(selects(&set["spec"]["selector"], labels));
    }
    let pdbs = budgets(&all, "statefulset-ha.yaml");
    let mut indexes: Vec<&str> = pdbs
        .iter()
        .map(|p| {
            assert_eq!(p["spec"]["maxUnavailable"], 1);
            p["spec"]["selector"]["matchLabels"]["apps.kubernetes.io/pod-index"]
                .as_str()
                .unwrap()
        })
        .collect();
    indexes.sort_unstable();
    let want: Vec<String> = (0..shards.unwrap()).map(|i| i.to_string()).collect();
    assert_eq!(indexes, want, "one budget per shard");
}
