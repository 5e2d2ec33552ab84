//! A stand-in Kubernetes API server on 127.0.0.1 for the real kube-rs client: pods in
//! Kubernetes' JSON, `list` with a `resourceVersion`, `watch` streams of ADDED / MODIFIED /
//! DELETED from a resource version, BOOKMARK events, 410 Gone for a compacted resource
//! version (the watcher must relist), 403 Forbidden, and stop/start on the same port.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

/// One pod's facts; [`FakePod::json`] renders it as the API server would.
#[derive(Debug, Clone)]
pub struct FakePod {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
    /// `Running`, `Pending`, …
    pub phase: String,
    /// The Ready condition.
    pub ready: bool,
    /// Pod IP (127.0.0.1 in tests).
    pub ip: Option<String>,
    /// Restart count of the engine container.
    pub restarts: i32,
    /// Unix second the engine container started.
    pub started_at: i64,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

impl FakePod {
    /// A Running, Ready pod at 127.0.0.1 labelled `app=engine`, publishing on `port`.
    pub fn new(name: &str, namespace: &str, port: u16) -> FakePod {
        FakePod {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            uid: format!("uid-{name}-1"),
            phase: "Running".to_owned(),
            ready: true,
            ip: Some("127.0.0.1".to_owned()),
            restarts: 0,
            started_at: 1_796_000_000,
            annotations: [("kvindex.io/port".to_owned(), port.to_string())].into(),
            labels: [("app".to_owned(), "engine".to_owned())].into(),
        }
    }

    /// Adds or replaces an annotation.
    pub fn annotate(mut self, key: &str, value: &str) -> FakePod {
        self.annotations.insert(key.to_owned(), value.to_owned());
        self
    }

    /// The pod identifier `{name}.{namespace}`.
    pub fn id(&self) -> String {
        format!("{}.{}", self.name, self.namespace)
    }

    /// The pod object in Kubernetes' JSON (without a resource version).
    pub fn json(&self) -> Value {
        let started = jiff_like(self.started_at);
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "uid": self.uid,
                "labels": self.labels,
                "annotations": self.annotations,
                "creationTimestamp": started,
            },
            "spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai"}]},
            "status": {
                "phase": self.phase,
                "podIP": self.ip,
                "conditions": [{"type": "Ready", "status": if self.ready { "True" } else { "False" }}],
                "containerStatuses": [{
                    "name": "engine",
                    "image": "vllm/vllm-openai",
                    "imageID": "",
                    "ready": self.ready,
                    "restartCount": self.restarts,
                    "state": {"running": {"startedAt": started}}
                }]
            }
        })
    }
}

/// RFC 3339 UTC text of a unix second (what the API server writes for times).
fn jiff_like(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[derive(Default)]
struct Inner {
    rv: u64,
    pods: BTreeMap<(String, String), Value>,
    /// (resource version, namespace, watch event line).
    log: Vec<(u64, String, Value)>,
    /// A watch from a resource version below this gets 410 Gone.
    compacted_below: u64,
    forbidden: bool,
    lists: u64,
    watch_rvs: Vec<String>,
}

struct Shared {
    inner: Mutex<Inner>,
    events: broadcast::Sender<(u64, String, Value)>,
    /// Bumped to end every open watch stream.
    generation: watch::Sender<u64>,
}

/// The running stand-in server.
pub struct FakeApiServer {
    /// Where it listens.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    serving: Option<(JoinHandle<()>, tokio::sync::oneshot::Sender<()>)>,
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PodQuery {
    watch: Option<String>,
    resource_version: Option<String>,
    label_selector: Option<String>,
}

impl FakeApiServer {
    /// Starts on an ephemeral port of 127.0.0.1.
    pub async fn start() -> FakeApiServer {
        let (events, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                rv: 100,
                ..Inner::default()
            }),
            events,
            generation: watch::channel(0).0,
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut server = FakeApiServer {
            addr,
            shared,
            serving: None,
        };
        server.serve(listener);
        server
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let app = axum::Router::new()
            .route("/api/v1/pods", get(all_pods))
            .route("/api/v1/namespaces/{ns}/pods", get(namespaced_pods))
            .with_state(self.shared.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await;
        });
        self.serving = Some((task, tx));
    }

    /// `http://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig file naming this server, written into `dir`.
    pub fn kubeconfig(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\nusers:\n- name: tester\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: tester\n    namespace: default\ncurrent-context: fake\n",
            self.url()
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    fn record(&self, kind: &str, namespace: &str, mut object: Value) {
        let mut inner = self.shared.inner.lock();
        inner.rv += 1;
        let rv = inner.rv;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let name = object["metadata"]["name"].as_str().unwrap().to_owned();
        let key = (namespace.to_owned(), name);
        if kind == "DELETED" {
            inner.pods.remove(&key);
        } else {
            inner.pods.insert(key, object.clone());
        }
        let line = json!({"type": kind, "object": object});
        inner.log.push((rv, namespace.to_owned(), line.clone()));
        let _ = self.shared.events.send((rv, namespace.to_owned(), line));
    }

    /// Creates or updates a pod (ADDED or MODIFIED on open watches).
    pub fn apply(&self, pod: &FakePod) {
        let exists = self
            .shared
            .inner
            .lock()
            .pods
            .contains_key(&(pod.namespace.clone(), pod.name.clone()));
        let kind = if exists { "MODIFIED" } else { "ADDED" };
        self.record(kind, &pod.namespace, pod.json());
    }

    /// Deletes a pod (DELETED on open watches).
    pub fn delete(&self, pod: &FakePod) {
        self.record("DELETED", &pod.namespace, pod.json());
    }

    /// Moves the resource version on (as changes to other objects do in etcd) and sends a
    /// BOOKMARK with it on every open watch; returns it.
    pub fn bookmark(&self) -> u64 {
        let rv = {
            let mut inner = self.shared.inner.lock();
            inner.rv += 1;
            inner.rv
        };
        let line = json!({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": rv.to_string()}}});
        let _ = self.shared.events.send((rv, String::new(), line));
        rv
    }

    /// Moves the resource version on and forgets the history before it: a watch resuming
    /// from any earlier resource version gets 410 Gone and must list again. Open watches
    /// are closed so the client has to resume.
    pub fn compact(&self) {
        {
            let mut inner = self.shared.inner.lock();
            inner.rv += 1;
            inner.compacted_below = inner.rv;
            inner.log.clear();
        }
        self.close_watches();
    }

    /// Ends every open watch stream (the client resumes from its last resource version).
    pub fn close_watches(&self) {
        self.shared.generation.send_modify(|g| *g += 1);
    }

    /// Answers every request with 403 Forbidden while `on`.
    pub fn set_forbidden(&self, on: bool) {
        self.shared.inner.lock().forbidden = on;
        if on {
            self.close_watches();
        }
    }

    /// Full lists served so far.
    pub fn lists(&self) -> u64 {
        self.shared.inner.lock().lists
    }

    /// The resource version every watch asked for, in order.
    pub fn watch_rvs(&self) -> Vec<String> {
        self.shared.inner.lock().watch_rvs.clone()
    }

    /// Stops listening and drops every connection (the port stays reserved for `resume`).
    pub async fn stop(&mut self) {
        self.close_watches();
        if let Some((task, tx)) = self.serving.take() {
            let _ = tx.send(());
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }

    /// Listens again on the same port, with the same pods and history.
    pub async fn resume(&mut self) {
        let mut tries = 0;
        let listener = loop {
            match tokio::net::TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if tries < 100 => {
                    tries += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("rebind {}: {e}", self.addr),
            }
        };
        self.serve(listener);
    }
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn matches_selector(object: &Value, selector: Option<&str>) -> bool {
    let Some(selector) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    selector.split(',').all(|term| match term.split_once('=') {
        Some((k, v)) => object["metadata"]["labels"][k.trim()].as_str() == Some(v.trim()),
        None => false,
    })
}

async fn all_pods(State(s): State<Arc<Shared>>, Query(q): Query<PodQuery>) -> Response {
    pods(s, None, q)
}

async fn namespaced_pods(
    State(s): State<Arc<Shared>>,
    Path(ns): Path<String>,
    Query(q): Query<PodQuery>,
) -> Response {
    pods(s, Some(ns), q)
}

fn pods(s: Arc<Shared>, ns: Option<String>, q: PodQuery) -> Response {
    if s.inner.lock().forbidden {
        let body = status(403, "Forbidden", "pods is forbidden: User \"system:serviceaccount:kvindex:kvindex\" cannot list resource \"pods\"");
        return (StatusCode::FORBIDDEN, axum::Json(body)).into_response();
    }
    if matches!(q.watch.as_deref(), Some("true") | Some("1")) {
        return watch_pods(s, ns, q);
    }
    let mut inner = s.inner.lock();
    inner.lists += 1;
    let items: Vec<Value> = inner
        .pods
        .iter()
        .filter(|((pns, _), _)| ns.as_ref().is_none_or(|n| n == pns))
        .map(|(_, v)| v.clone())
        .filter(|v| matches_selector(v, q.label_selector.as_deref()))
        .collect();
    let body = json!({"apiVersion": "v1", "kind": "PodList",
                      "metadata": {"resourceVersion": inner.rv.to_string()}, "items": items});
    axum::Json(body).into_response()
}

fn watch_pods(s: Arc<Shared>, ns: Option<String>, q: PodQuery) -> Response {
    let from: u64 = q
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut live = s.events.subscribe();
    let mut generation = s.generation.subscribe();
    let (backlog, gone) = {
        let mut inner = s.inner.lock();
        inner
            .watch_rvs
            .push(q.resource_version.clone().unwrap_or_default());
        let gone = from < inner.compacted_below;
        let backlog: Vec<(u64, String, Value)> = inner
            .log
            .iter()
            .filter(|(rv, _, _)| *rv > from)
            .cloned()
            .collect();
        (backlog, gone)
    };
    let selector = q.label_selector.clone();
    let wanted = move |event_ns: &str, line: &Value| {
        let bookmark = line["type"] == "BOOKMARK";
        bookmark
            || (ns.as_deref().is_none_or(|n| n == event_ns)
                && matches_selector(&line["object"], selector.as_deref()))
    };
    let stream = async_stream_lines(move |tx| async move {
        if gone {
            let line = json!({"type": "ERROR", "object": status(410, "Expired", "too old resource version")});
            let _ = tx.send(line).await;
            return;
        }
        let mut last = from;
        for (rv, event_ns, line) in backlog {
            if wanted(&event_ns, &line) && tx.send(line).await.is_err() {
                return;
            }
            last = rv;
        }
        loop {
            tokio::select! {
                _ = generation.changed() => return,
                got = live.recv() => match got {
                    Ok((rv, event_ns, line)) => {
                        let bookmark = line["type"] == "BOOKMARK";
                        let send = (bookmark || rv > last) && wanted(&event_ns, &line);
                        if send && tx.send(line).await.is_err() {
                            return;
                        }
                        if !bookmark {
                            last = last.max(rv);
                        }
                    }
                    Err(_) => return,
                },
            }
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(stream)
        .unwrap()
}

/// A streaming body of newline-terminated JSON lines produced by `produce`.
fn async_stream_lines<F, Fut>(produce: F) -> Body
where
    F: FnOnce(tokio::sync::mpsc::Sender<Value>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Value>(64);
    tokio::spawn(produce(tx));
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).map_ok_lines();
    Body::from_stream(stream)
}

trait LinesExt {
    fn map_ok_lines(self) -> impl futures::Stream<Item = Result<String, Infallible>> + Send;
}

impl<S: futures::Stream<Item = Value> + Send + 'static> LinesExt for S {
    fn map_ok_lines(self) -> impl futures::Stream<Item = Result<String, Infallible>> + Send {
        use futures::StreamExt;
        self.map(|v| Ok(format!("{v}\n")))
    }
}
