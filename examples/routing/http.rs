//! The daemon's HTTP API as a router calls it: one kept-alive HTTP/1.1 connection, JSON
//! bodies; and one-shot GETs of the metrics listener.

use std::fmt::Write as _;
use std::net::SocketAddr;

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::StatusCode;
use serde::Deserialize;

/// One pod's entry in a `/v1/score` answer.
#[derive(Debug, Deserialize)]
pub struct PodScore {
    /// `{pod}.{namespace}`.
    pub pod: String,
    /// Leading blocks the index says the pod holds.
    pub matched_blocks: u32,
}

/// A `/v1/score` answer.
#[derive(Debug, Deserialize)]
pub struct ScoreAnswer {
    /// The prompt's blocks the score looked at.
    pub total_blocks: usize,
    /// Pods holding block 0, best first.
    pub scores: Vec<PodScore>,
}

/// A connection to the API.
pub struct Api {
    sender: SendRequest<Full<Bytes>>,
    authority: String,
    model: String,
    /// Every pod, as candidates.
    pods_json: String,
}

fn tokens_json(tokens: &[u32]) -> String {
    let mut out = String::with_capacity(tokens.len() * 6 + 2);
    out.push('[');
    for (i, t) in tokens.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{t}");
    }
    out.push(']');
    out
}

async fn handshake<B>(addr: SocketAddr) -> anyhow::Result<SendRequest<B>>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true)?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

impl Api {
    /// Connects to the API at `addr`, for `model` and these candidate `pods`.
    ///
    /// # Errors
    /// When the connection fails.
    pub async fn connect(addr: SocketAddr, model: &str, pods: &[String]) -> anyhow::Result<Api> {
        Ok(Api {
            sender: handshake(addr).await?,
            authority: addr.to_string(),
            model: model.to_owned(),
            pods_json: serde_json::to_string(pods)?,
        })
    }

    async fn post(&mut self, path: &str, body: String) -> anyhow::Result<(StatusCode, Bytes)> {
        self.sender.ready().await?;
        let request = hyper::Request::post(path)
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))?;
        let response = self.sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }

    /// `POST /v1/score` in `prefix` mode over every pod.
    ///
    /// # Errors
    /// A transport error or any answer but 200.
    pub async fn score(
        &mut self,
        tokens: &[u32],
        max_blocks: Option<usize>,
    ) -> anyhow::Result<ScoreAnswer> {
        let mut body = format!(
            "{{\"model\":{},\"match\":\"prefix\",\"pods\":{},",
            serde_json::to_string(&self.model)?,
            self.pods_json
        );
        if let Some(n) = max_blocks {
            let _ = write!(body, "\"max_blocks\":{n},");
        }
        let _ = write!(body, "\"tokens\":{}}}", tokens_json(tokens));
        let (status, answer) = self.post("/v1/score", body).await?;
        if status != StatusCode::OK {
            bail!(
                "/v1/score answered {status}: {}",
                String::from_utf8_lossy(&answer)
            );
        }
        Ok(serde_json::from_slice(&answer)?)
    }

    /// `POST /v1/routed`: the prompt's blocks become speculative residents of `pod`.
    ///
    /// # Errors
    /// A transport error or any answer but 204 (a daemon without the route answers 404).
    pub async fn routed(
        &mut self,
        tokens: &[u32],
        pod: &str,
        request_id: &str,
    ) -> anyhow::Result<()> {
        let body = format!(
            "{{\"model\":{},\"pod\":{},\"request_id\":{},\"tokens\":{}}}",
            serde_json::to_string(&self.model)?,
            serde_json::to_string(pod)?,
            serde_json::to_string(request_id)?,
            tokens_json(tokens)
        );
        let (status, answer) = self.post("/v1/routed", body).await?;
        if status == StatusCode::NOT_FOUND {
            bail!("this kvindex has no POST /v1/routed (404): the kvindex+speculative router needs a daemon with speculative entries");
        }
        if status != StatusCode::NO_CONTENT {
            bail!(
                "/v1/routed answered {status}: {}",
                String::from_utf8_lossy(&answer)
            );
        }
        Ok(())
    }

    /// `POST /v1/feedback`: the engine's cached tokens for a routed request. Returns false
    /// when the daemon did not know the request (404).
    ///
    /// # Errors
    /// A transport error or an answer other than 204 and 404.
    pub async fn feedback(
        &mut self,
        request_id: &str,
        cached_tokens: usize,
    ) -> anyhow::Result<bool> {
        let body = format!(
            "{{\"request_id\":{},\"cached_tokens\":{cached_tokens}}}",
            serde_json::to_string(request_id)?
        );
        let (status, answer) = self.post("/v1/feedback", body).await?;
        match status {
            StatusCode::NO_CONTENT => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            _ => bail!(
                "/v1/feedback answered {status}: {}",
                String::from_utf8_lossy(&answer)
            ),
        }
    }
}

/// One GET on a fresh connection; the body as text.
///
/// # Errors
/// A transport error or any answer but 200.
pub async fn get_text(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut sender = handshake::<Empty<Bytes>>(addr).await?;
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, addr.to_string())
        .body(Empty::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    if status != StatusCode::OK {
        bail!("GET {path} answered {status}");
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The sum of every sample of `metric` whose labels contain `label` (`outcome="exact"`), in
/// Prometheus text; 0 when absent.
pub fn metric_sum(text: &str, metric: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(metric)?;
            let (labels, value) = rest.rsplit_once(' ')?;
            let ok = if label.is_empty() {
                labels.is_empty() || labels.starts_with('{')
            } else {
                labels.starts_with('{') && labels.contains(label)
            };
            ok.then(|| value.trim().parse::<f64>().ok()).flatten()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sums_pick_the_label() {
        let text = "# HELP x\nkvindex_route_predictions_total{outcome=\"exact\"} 5\n\
                    kvindex_route_predictions_total{outcome=\"over\"} 2\n\
                    kvindex_route_predictions_total_other 9\nkvindex_speculative_entries 3\n";
        let m = "kvindex_route_predictions_total";
        assert_eq!(metric_sum(text, m, "outcome=\"exact\""), 5.0);
        assert_eq!(metric_sum(text, m, "outcome=\"under\""), 0.0);
        assert_eq!(metric_sum(text, "kvindex_speculative_entries", ""), 3.0);
        assert_eq!(tokens_json(&[1, 22, 333]), "[1,22,333]");
    }
}
