//! The `discovery.kubernetes` section: engine pods found through the Kubernetes API.
//!
//! Every field is a default that a pod can override with an annotation (the table in the
//! README and in `schemas/config.schema.json`). Access to the API server: `kubeconfig`, else
//! the `KUBECONFIG` environment variable, else the in-cluster service account.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::types::{Env, Issues};
use crate::settings::kubernetes::{
    check_port_ranges, port_number, ClusterAccess, KubernetesConfig, PodDefaults,
    DEFAULT_NOT_READY_GRACE,
};
use crate::settings::target::MAX_DP_RANKS;
use crate::wire::Engine;

/// `discovery:` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDiscovery {
    /// Engine pods from the Kubernetes API.
    #[serde(default)]
    pub kubernetes: Option<RawKubernetes>,
}

/// `discovery.kubernetes:` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKubernetes {
    /// Path of a kubeconfig file (else `KUBECONFIG`, else in-cluster).
    pub kubeconfig: Option<String>,
    /// Namespaces to watch; absent = every namespace.
    pub namespaces: Option<Vec<String>>,
    /// Label selector of engine pods (`app=vllm,tier!=test`).
    pub label_selector: Option<String>,
    /// Default engine family (`kvindex.io/engine`).
    pub engine: Option<String>,
    /// Default served model (`kvindex.io/model`).
    pub model: Option<String>,
    /// Default PUB port of DP rank 0 (`kvindex.io/port`).
    pub port: Option<u32>,
    /// Default replay ROUTER port of DP rank 0 (`kvindex.io/replay-port`).
    pub replay_port: Option<u32>,
    /// Default subscription filter (`kvindex.io/topic`).
    pub topic: Option<String>,
    /// Default DP ranks (`kvindex.io/dp-ranks`).
    pub dp_ranks: Option<u32>,
    /// Seconds a pod may be not Ready before it is forgotten (default 30).
    pub not_ready_grace_s: Option<u64>,
}

/// Validates the section, pushing every problem to `issues`.
pub(super) fn validate_kubernetes(
    raw: RawKubernetes,
    env: &impl Env,
    issues: &mut Issues,
) -> Option<KubernetesConfig> {
    let before = issues.count();
    let at = |f: &str| format!("discovery.kubernetes.{f}");
    let access = match (raw.kubeconfig, env.get("KUBECONFIG")) {
        (Some(path), _) if path.is_empty() => {
            issues.add(at("kubeconfig"), None, "must not be empty");
            ClusterAccess::InCluster
        }
        (Some(path), _) => ClusterAccess::Kubeconfig(PathBuf::from(path)),
        (None, Some(v)) if !v.is_empty() => ClusterAccess::KubeconfigEnv,
        (None, _) => ClusterAccess::InCluster,
    };
    let namespaces = validate_namespaces(raw.namespaces, issues);
    let label_selector = raw.label_selector.filter(|s| !s.trim().is_empty());
    let engine = match raw.engine.as_deref().map(str::parse::<Engine>) {
        Some(Ok(e)) => Some(e),
        Some(Err(what)) => {
            issues.add(at("engine"), None, what);
            None
        }
        None => None,
    };
    let mut port_of = |field: &str, value: Option<u32>| match value.map(port_number) {
        Some(Ok(p)) => Some(p),
        Some(Err(e)) => {
            issues.add(at(field), None, e.to_string());
            None
        }
        None => None,
    };
    let port = port_of("port", raw.port);
    let replay_port = port_of("replay_port", raw.replay_port);
    let dp_ranks = raw.dp_ranks.unwrap_or(1);
    if dp_ranks == 0 || dp_ranks > MAX_DP_RANKS {
        issues.add(
            at("dp_ranks"),
            None,
            format!("must lie in 1..={MAX_DP_RANKS}"),
        );
    } else if let Some(port) = port {
        if let Err(e) = check_port_ranges(port, replay_port, dp_ranks) {
            issues.add(at("replay_port"), None, e.to_string());
        }
    }
    if raw.model.as_deref() == Some("") {
        issues.add(at("model"), None, "must not be empty (omit it instead)");
    }
    let defaults = PodDefaults {
        engine,
        model: raw.model.filter(|m| !m.is_empty()),
        port,
        replay_port,
        topic: raw.topic.unwrap_or_default(),
        dp_ranks,
    };
    let not_ready_grace = raw
        .not_ready_grace_s
        .map_or(DEFAULT_NOT_READY_GRACE, Duration::from_secs);
    (issues.count() == before).then_some(KubernetesConfig {
        access,
        namespaces,
        label_selector,
        defaults,
        not_ready_grace,
    })
}

fn validate_namespaces(raw: Option<Vec<String>>, issues: &mut Issues) -> Vec<String> {
    let Some(list) = raw else {
        return Vec::new();
    };
    if list.is_empty() {
        issues.add(
            "discovery.kubernetes.namespaces",
            None,
            "is empty; omit it to watch every namespace",
        );
    }
    let mut seen = BTreeSet::new();
    for (i, ns) in list.iter().enumerate() {
        let valid = !ns.is_empty()
            && ns.len() <= 63
            && ns
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !ns.starts_with('-')
            && !ns.ends_with('-');
        if !valid {
            issues.add(
                format!("discovery.kubernetes.namespaces[{i}]"),
                None,
                format!("`{ns}` is not a namespace name (a DNS label)"),
            );
        } else if !seen.insert(ns.as_str()) {
            issues.add(
                format!("discovery.kubernetes.namespaces[{i}]"),
                None,
                format!("`{ns}` is listed twice"),
            );
        }
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, ConfigError};
    use crate::settings::kubernetes::PortsError;

    fn section(body: &str) -> Result<Config, ConfigError> {
        Config::from_str(&format!("discovery:\n  kubernetes:\n{body}"))
    }

    #[test]
    fn defaults_and_overrides_parse() {
        let c = section("    namespaces: [llm, llm-b]\n    label_selector: app=vllm\n    engine: sglang\n    model: m\n    port: 5557\n    replay_port: 6557\n    dp_ranks: 2\n    not_ready_grace_s: 5\n    kubeconfig: /k\n").unwrap();
        let k = c.discovery.unwrap();
        assert_eq!(k.access, ClusterAccess::Kubeconfig("/k".into()));
        assert_eq!(k.namespaces, ["llm", "llm-b"]);
        assert_eq!(k.label_selector.as_deref(), Some("app=vllm"));
        assert_eq!(k.defaults.engine, Some(Engine::Sglang));
        assert_eq!(
            (k.defaults.port, k.defaults.replay_port, k.defaults.dp_ranks),
            (Some(5557), Some(6557), 2)
        );
        assert_eq!(k.not_ready_grace, Duration::from_secs(5));
    }

    #[test]
    fn an_empty_section_watches_everything_in_cluster() {
        let k = section("    {}\n").unwrap().discovery.unwrap();
        assert_eq!(k.access, ClusterAccess::InCluster);
        assert!(k.namespaces.is_empty());
        assert_eq!(k.not_ready_grace, DEFAULT_NOT_READY_GRACE);
        assert_eq!(k.defaults.dp_ranks, 1);
        let json = section("    {}\n").unwrap().to_json();
        let shown = &json["discovery"]["kubernetes"];
        assert_eq!(shown["namespaces"], "all");
        assert_eq!(shown["access"], "in-cluster service account");
        assert_eq!(shown["not_ready_grace_s"], 30);
    }

    #[test]
    fn kubeconfig_env_is_used_when_the_file_names_none() {
        let env: std::collections::HashMap<String, String> =
            [("KUBECONFIG".to_owned(), "/a:/b".to_owned())].into();
        let c = Config::from_str_with_env("discovery:\n  kubernetes: {}\n", &env).unwrap();
        assert_eq!(c.discovery.unwrap().access, ClusterAccess::KubeconfigEnv);
    }

    #[test]
    fn every_bad_field_is_reported() {
        let ConfigError::Invalid(issues) = section(
            "    namespaces: [Bad_NS, ok, ok]\n    engine: tgi\n    port: 70000\n    dp_ranks: 0\n",
        )
        .unwrap_err() else {
            panic!("expected issues");
        };
        let fields: Vec<_> = issues.iter().map(|i| i.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "discovery.kubernetes.namespaces[0]",
                "discovery.kubernetes.namespaces[2]",
                "discovery.kubernetes.engine",
                "discovery.kubernetes.port",
                "discovery.kubernetes.dp_ranks"
            ]
        );
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = section("    label-selector: x\n").unwrap_err();
        assert!(err.to_string().contains("label-selector"), "{err}");
    }

    #[test]
    fn port_ranges_must_not_overlap_or_overflow() {
        assert_eq!(check_port_ranges(5557, Some(5558), 1), Ok(()));
        assert!(matches!(
            check_port_ranges(5557, Some(5558), 2),
            Err(PortsError::Overlap { .. })
        ));
        assert!(matches!(
            check_port_ranges(65535, None, 2),
            Err(PortsError::RanksOverflow { .. })
        ));
        assert_eq!(check_port_ranges(5557, Some(6557), 8), Ok(()));
        assert!(section("    port: 5557\n    replay_port: 5558\n    dp_ranks: 2\n").is_err());
    }
}
