//! What ingest subscribes to: one engine pod (its endpoints, engine, model, DP ranks).
//!
//! Targets come from the config file's `targets:` and from Kubernetes discovery; both build
//! this one type, so the supervisor never knows where a target came from.

use std::fmt;

use serde::Serialize;

use crate::wire::Engine;

/// Highest DP rank count per target (ranks are `u8` in the index).
pub const MAX_DP_RANKS: u32 = 256;

/// Default cap on one ZMQ frame (`ingest.max_frame_bytes`).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 64 << 20;

/// One engine pod to subscribe to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Target {
    /// Pod name.
    pub pod: String,
    /// Namespace.
    pub namespace: String,
    /// Served model.
    pub model: String,
    /// Engine family.
    pub engine: Engine,
    /// DP rank 0's PUB endpoint.
    pub endpoint: TcpEndpoint,
    /// DP rank 0's replay endpoint.
    pub replay_endpoint: Option<TcpEndpoint>,
    /// Subscription filter.
    pub topic: String,
    /// DP ranks.
    pub dp_ranks: u32,
    /// This target's cap on one ZMQ frame, in place of `ingest.max_frame_bytes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_frame_bytes: Option<usize>,
}

impl Target {
    /// The pod identifier written to Redis: `{pod}.{namespace}`.
    pub fn pod_id(&self) -> String {
        format!("{}.{}", self.pod, self.namespace)
    }
}

/// A `tcp://host:port` endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TcpEndpoint {
    /// Host name or address.
    pub host: String,
    /// Port of DP rank 0.
    pub port: u16,
}

impl TcpEndpoint {
    /// Parses `tcp://host:port`.
    ///
    /// # Errors
    /// A sentence saying what is wrong.
    pub fn parse(text: &str) -> Result<TcpEndpoint, String> {
        let rest = text
            .strip_prefix("tcp://")
            .ok_or_else(|| format!("`{text}` is not a tcp://host:port endpoint"))?;
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| format!("`{text}` has no port"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| format!("`{text}` has an invalid port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || port == 0 {
            return Err(format!("`{text}` needs a host and a non-zero port"));
        }
        Ok(TcpEndpoint {
            host: host.to_owned(),
            port,
        })
    }

    /// The endpoint of DP rank `rank` (port + rank), `None` past port 65535.
    pub fn for_rank(&self, rank: u32) -> Option<String> {
        let port = u16::try_from(u32::from(self.port) + rank).ok()?;
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        Some(format!("tcp://{host}:{port}"))
    }
}

impl fmt::Display for TcpEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.for_rank(0).unwrap_or_default())
    }
}
