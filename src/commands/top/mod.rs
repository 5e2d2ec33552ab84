//! `kvindex top`: a terminal dashboard of a running daemon, polled from its `/metrics` and
//! `GET /v1/pods`. A daemon that goes away is shown as unreachable (with the last figures),
//! never a crash; `q` quits.
//!
//! | file | job |
//! | --- | --- |
//! | `mod.rs` | arguments, the poll loop, HTTP, keys, the terminal |
//! | `model.rs` | pure: Prometheus text parser, `/v1/pods` body, rates |
//! | `view.rs` | drawing a [`view::Screen`] with ratatui |

pub mod model;
pub mod view;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use self::model::{parse_metrics, parse_pods, rate, PodRates, Totals};
use self::view::{Reach, Screen, TotalRates};
use kvindex::ingest::{PodCounters, PodStatus};

/// How long one HTTP request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// Arguments of `kvindex top`.
#[derive(Debug, Clone, clap::Args)]
pub struct TopArgs {
    /// The daemon's metrics listener (`/metrics`).
    #[arg(long, default_value = "http://127.0.0.1:9090")]
    pub url: String,
    /// The daemon's API listener (`GET /v1/pods`).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub api_url: String,
    /// Seconds between polls.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Bearer token of the API, when it has one.
    #[arg(long, env = "KVINDEX_API_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// Runs the dashboard until `q`.
///
/// # Errors
/// An interval that is not a positive number, or a terminal that cannot be set up.
pub async fn run(args: TopArgs) -> anyhow::Result<()> {
    if !(args.interval.is_finite() && args.interval > 0.0) {
        return Err(
            super::UsageError("--interval must be a positive number of seconds".into()).into(),
        );
    }
    let mut terminal = ratatui::try_init().context("cannot set up the terminal")?;
    let result = dashboard(&mut terminal, args).await;
    ratatui::restore();
    result
}

/// What the key reader asks for.
enum Key {
    Quit,
    Redraw,
}

async fn dashboard(terminal: &mut ratatui::DefaultTerminal, args: TopArgs) -> anyhow::Result<()> {
    let (tx, mut keys) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || read_keys(&tx));
    let mut poller = Poller::new(args.clone());
    let mut tick = tokio::time::interval(Duration::from_secs_f64(args.interval));
    let mut screen = poller.blank();
    loop {
        tokio::select! {
            _ = tick.tick() => screen = poller.poll().await,
            key = keys.recv() => match key {
                Some(Key::Redraw) => {}
                Some(Key::Quit) | None => return Ok(()),
            },
        }
        terminal
            .draw(|f| view::draw(f, &screen))
            .context("cannot draw")?;
    }
}

/// Reads terminal events on their own thread (crossterm's reads block) until `q`, Esc or
/// Ctrl-C, or until the dashboard is gone.
fn read_keys(tx: &tokio::sync::mpsc::UnboundedSender<Key>) {
    loop {
        if tx.is_closed() {
            return;
        }
        match event::poll(Duration::from_millis(100)) {
            Ok(false) => continue,
            Ok(true) => {}
            Err(_) => return,
        }
        let key = match event::read() {
            Ok(Event::Key(k)) if k.kind == KeyEventKind::Press => match k.code {
                KeyCode::Char('q') | KeyCode::Esc => Key::Quit,
                KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => Key::Quit,
                _ => continue,
            },
            Ok(Event::Resize(..)) => Key::Redraw,
            Ok(_) => continue,
            Err(_) => return,
        };
        if tx.send(key).is_err() {
            return;
        }
    }
}

/// Polls the daemon and keeps what rates need.
struct Poller {
    args: TopArgs,
    started: Instant,
    last_good: Option<(Instant, Totals)>,
    last_pods: HashMap<String, (Instant, PodCounters)>,
    last_rates: TotalRates,
}

impl Poller {
    fn new(args: TopArgs) -> Poller {
        Poller {
            args,
            started: Instant::now(),
            last_good: None,
            last_pods: HashMap::new(),
            last_rates: TotalRates::default(),
        }
    }

    fn blank(&self) -> Screen {
        Screen {
            url: self.args.url.clone(),
            api_url: self.args.api_url.clone(),
            interval: self.args.interval,
            reach: Reach::Starting,
            totals: None,
            rates: TotalRates::default(),
            pods: Err("not polled yet".to_owned()),
            writer: None,
        }
    }

    async fn poll(&mut self) -> Screen {
        let (metrics, pods) = tokio::join!(
            get(&self.args.url, "/metrics", None),
            get(&self.args.api_url, "/v1/pods", self.args.token.as_deref())
        );
        let now = Instant::now();
        let mut screen = self.blank();
        match metrics {
            Ok(text) => {
                let totals = Totals::from_samples(&parse_metrics(&text));
                if let Some((at, before)) = &self.last_good {
                    let dt = now.duration_since(*at).as_secs_f64();
                    let commands = |t: &Totals| t.mirror.as_ref().map_or(0.0, |m| m.commands);
                    self.last_rates = TotalRates {
                        messages: rate(before.messages, totals.messages, dt),
                        events: rate(before.events, totals.events, dt),
                        api_requests: rate(before.api_requests, totals.api_requests, dt),
                        mirror_writes: rate(commands(before), commands(&totals), dt),
                    };
                }
                screen.reach = Reach::Up;
                self.last_good = Some((now, totals));
            }
            Err(error) => {
                let since = self.last_good.as_ref().map_or(self.started, |(at, _)| *at);
                screen.reach = Reach::Gone {
                    error,
                    for_seconds: now.duration_since(since).as_secs_f64(),
                };
            }
        }
        screen.totals = self.last_good.as_ref().map(|(_, t)| t.clone());
        screen.rates = self.last_rates;
        let body = pods
            .and_then(|body| parse_pods(&body).map_err(|e| format!("not the /v1/pods body: {e}")));
        screen.writer = body.as_ref().ok().and_then(|b| b.writer.clone());
        screen.pods = body.map(|b| self.pod_rates(now, b.pods));
        screen
    }

    fn pod_rates(&mut self, now: Instant, pods: Vec<PodStatus>) -> Vec<(PodStatus, PodRates)> {
        let mut seen = HashMap::new();
        let out = pods
            .into_iter()
            .map(|p| {
                let rates =
                    self.last_pods
                        .get(&p.pod)
                        .map_or_else(PodRates::default, |(at, before)| {
                            PodRates::between(
                                before,
                                &p.counters,
                                now.duration_since(*at).as_secs_f64(),
                            )
                        });
                seen.insert(p.pod.clone(), (now, p.counters));
                (p, rates)
            })
            .collect();
        self.last_pods = seen;
        out
    }
}

/// One HTTP/1.1 GET; the body as text, or a short reason it failed.
async fn get(base: &str, path: &str, token: Option<&str>) -> Result<String, String> {
    let fetched = tokio::time::timeout(REQUEST_TIMEOUT, fetch(base, path, token)).await;
    fetched.unwrap_or_else(|_| Err(format!("no answer within {} s", REQUEST_TIMEOUT.as_secs())))
}

async fn fetch(base: &str, path: &str, token: Option<&str>) -> Result<String, String> {
    let uri: hyper::Uri = format!("{}{path}", base.trim_end_matches('/'))
        .parse()
        .map_err(|e| format!("bad URL {base}: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!("{base}: only http:// URLs are supported"));
    }
    let host = uri.host().ok_or_else(|| format!("{base} has no host"))?;
    let authority = uri.authority().map(|a| a.to_string()).unwrap_or_default();
    let port = uri.port_u16().unwrap_or(80);
    let stream = tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port))
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let mut request = hyper::Request::get(uri.path()).header(hyper::header::HOST, authority);
    if let Some(token) = token {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if !status.is_success() {
        return Err(format!("{path} answered {status}"));
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}
