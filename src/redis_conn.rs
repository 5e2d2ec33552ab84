//! One connection type for a single Redis or a Redis Cluster, shared by the mirror
//! (`store/redis/`) and the Redis scoring backend (`score/redis_lookup.rs`).
//!
//! | type | job |
//! | --- | --- |
//! | [`RedisTarget`] | where Redis is: one URL, or a cluster's seed URLs |
//! | [`RedisConn`] | a connection to either, as one [`redis::aio::ConnectionLike`] + `Clone` |
//! | [`ClusterConn`] | the cluster client's connection, pipelines split per master |
//! | [`Master`] | one master: where SCAN and `INFO` run, one at a time |
//! | [`connect_single`], [`ConnectFailure`] | the one single-node connect, errors without passwords |
//!
//! Why pipelines are split here: the redis crate's async cluster client sends a pipeline to
//! the node of its first key and refuses one whose keys span slots, and it leaves a
//! `MOVED`/`ASK` answer inside a pipeline to the caller. [`ClusterConn`] groups a pipeline's
//! commands by the master that owns their slot (its own copy of the slot map, from
//! `CLUSTER SLOTS`), sends one sub-pipeline per master concurrently, and re-sends a command
//! answered with a redirect or a transient cluster error on its own, through the client,
//! which follows redirects, refreshes its slot map and waits out a failover. Commands of one
//! key stay in one sub-pipeline, in order, so a write and a later delete of one field are
//! never reordered. Across masters there is no order, except for the commit key (the
//! mirror's watermarks): its commands are sent once every other command of the pipeline is
//! answered, so a watermark never lands ahead of the data it covers, as on a single Redis.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{join_all, BoxFuture, FutureExt};
use parking_lot::Mutex;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Arg, Cmd, FromRedisValue, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use crate::redis_layout::{redact_url, scrub_secrets};

/// Where Redis is. `Debug` and `Display` show the URLs without their passwords.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server: `redis://[user:pass@]host:port/db` or `rediss://…`.
    Single(String),
    /// A Redis Cluster: seed URLs of some of its nodes (same credentials and TLS for all).
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// The URLs (one for a single server).
    pub fn urls(&self) -> &[String] {
        match self {
            RedisTarget::Single(url) => std::slice::from_ref(url),
            RedisTarget::Cluster(urls) => urls,
        }
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisTarget::Cluster(_))
    }

    /// How logs and errors name the target: URLs without their passwords.
    pub fn shown(&self) -> String {
        match self {
            RedisTarget::Single(url) => redact_url(url),
            RedisTarget::Cluster(urls) => {
                let shown: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
                format!("cluster[{}]", shown.join(","))
            }
        }
    }

    /// `message` without any of the URLs' passwords.
    pub fn scrub(&self, message: &str) -> String {
        self.urls()
            .iter()
            .fold(message.to_owned(), |text, url| scrub_secrets(url, &text))
    }
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown())
    }
}

impl fmt::Display for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown())
    }
}

/// What kept a connection from opening.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFailureKind {
    /// The URL does not parse, or names a setting the client refuses.
    BadUrl,
    /// Redis refused the credentials (or wants some and got none).
    Auth,
    /// Redis did not answer (refused, unreachable, timed out, TLS failure).
    Unreachable,
}

/// Why a connection could not be opened; neither the URL nor the reason holds a password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectFailure {
    /// What kept the connection from opening.
    pub kind: ConnectFailureKind,
    /// The target without its passwords.
    pub url: String,
    /// What the client reported, without the passwords.
    pub reason: String,
}

impl ConnectFailure {
    /// The failure `err` of connecting to (or first asking) `target`.
    pub fn of(target: &RedisTarget, err: &RedisError) -> ConnectFailure {
        let kind = if is_auth_error(err) {
            ConnectFailureKind::Auth
        } else if err.kind() == redis::ErrorKind::InvalidClientConfig {
            ConnectFailureKind::BadUrl
        } else {
            ConnectFailureKind::Unreachable
        };
        ConnectFailure {
            kind,
            url: target.shown(),
            reason: target.scrub(&err.to_string()),
        }
    }

    /// A URL the client could not parse.
    fn bad_url(url: &str, err: &RedisError) -> ConnectFailure {
        ConnectFailure {
            kind: ConnectFailureKind::BadUrl,
            url: redact_url(url),
            reason: scrub_secrets(url, &err.to_string()),
        }
    }
}

/// Opens a connection to the single Redis at `url`: the client is made from the URL, and
/// `open` makes the connection the caller wants of it (managed or multiplexed, with its own
/// timeouts). Every error is told without the URL's password.
///
/// # Errors
/// [`ConnectFailure`]: a bad URL, refused credentials, or Redis not answering.
pub async fn connect_single<C, F, Fut>(url: &str, open: F) -> Result<C, ConnectFailure>
where
    F: FnOnce(redis::Client) -> Fut,
    Fut: std::future::Future<Output = RedisResult<C>>,
{
    let client = redis::Client::open(url).map_err(|e| ConnectFailure::bad_url(url, &e))?;
    let target = RedisTarget::Single(url.to_owned());
    open(client)
        .await
        .map_err(|e| ConnectFailure::of(&target, &e))
}

/// Whether Redis refused the credentials (or wants some and got none).
pub fn is_auth_error(e: &RedisError) -> bool {
    let text = e.to_string().to_ascii_uppercase();
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || text.contains("WRONGPASS")
        || text.contains("NOAUTH")
        || text.contains("INVALID PASSWORD")
        || text.contains("INVALID USERNAME")
}

/// Settings of a cluster connection.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// A connection attempt to one node.
    pub connect_timeout: Duration,
    /// One request (the client's retries included).
    pub response_timeout: Duration,
    /// Retries of a request through redirects, reconnects and a failover.
    pub retries: u32,
    /// Commands on this key are sent after the rest of their pipeline is answered.
    pub commit_key: Option<String>,
}

/// One master of the target, where keyless commands (SCAN, `INFO`) run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Master {
    /// The single server.
    Single,
    /// A cluster master.
    Node {
        /// Host as the cluster announces it.
        host: String,
        /// Port.
        port: u16,
    },
}

impl fmt::Display for Master {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Master::Single => f.write_str("single"),
            Master::Node { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

/// A connection to a single Redis or a Redis Cluster.
#[derive(Clone)]
pub enum RedisConn {
    /// One server, reconnecting by itself.
    Single(ConnectionManager),
    /// A cluster.
    Cluster(ClusterConn),
}

impl RedisConn {
    /// How many pipelines a writer may keep on the wire at once, up to `wanted`. One
    /// multiplexed connection keeps pipelines in the order they were queued; a cluster
    /// connection splits each pipeline per master and retries redirected commands on its own,
    /// which keeps order within one pipeline only, so it takes one at a time.
    pub fn pipelines_in_flight(&self, wanted: usize) -> usize {
        match self {
            RedisConn::Single(_) => wanted,
            RedisConn::Cluster(_) => 1,
        }
    }

    /// The masters to SCAN or ask for `INFO`: the server itself, or every cluster master as
    /// the cluster reports them now.
    ///
    /// # Errors
    /// When the cluster cannot tell its slot map.
    pub async fn masters(&mut self) -> RedisResult<Vec<Master>> {
        match self {
            RedisConn::Single(_) => Ok(vec![Master::Single]),
            RedisConn::Cluster(c) => c.masters().await,
        }
    }

    /// One key per master, so something can be kept on every master (the watchdog's
    /// sentinels): `base` itself on a single Redis, `{base}:{n}` with a hash tag `n` that
    /// lands on each master's slots on a cluster (from the slot map the last
    /// [`Self::masters`] read).
    pub fn key_per_master(&self, base: &str) -> Vec<String> {
        match self {
            RedisConn::Single(_) => vec![base.to_owned()],
            RedisConn::Cluster(c) => c.key_per_master(base),
        }
    }

    /// Runs a keyless command on one master.
    ///
    /// # Errors
    /// The command's error (an unknown or dead master is an I/O error).
    pub async fn query_on<T: FromRedisValue>(
        &mut self,
        master: &Master,
        cmd: &Cmd,
    ) -> RedisResult<T> {
        match (self, master) {
            (RedisConn::Cluster(c), Master::Node { host, port }) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                let value = c.inner.route_command(cmd.clone(), routing).await?;
                Ok(redis::from_redis_value(value.extract_error()?)?)
            }
            (conn, _) => cmd.query_async(conn).await,
        }
    }
}

impl fmt::Debug for RedisConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisConn::Single(_) => f.write_str("RedisConn::Single"),
            RedisConn::Cluster(_) => f.write_str("RedisConn::Cluster"),
        }
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(_) => 0,
        }
    }
}

/// The masters and which slots each owns, as `CLUSTER SLOTS` last said.
#[derive(Debug, Default)]
struct SlotMap {
    /// `(first, last, master index)`, sorted by `first`.
    ranges: Vec<(u16, u16, usize)>,
    masters: Vec<Master>,
}

impl SlotMap {
    /// The index of the master owning `slot` (0 when the map does not know it: the
    /// sub-pipeline is then answered with redirects, which are followed).
    fn master_of(&self, slot: u16) -> usize {
        let i = self.ranges.partition_point(|r| r.0 <= slot);
        match i.checked_sub(1).and_then(|i| self.ranges.get(i)) {
            Some(&(_, last, m)) if slot <= last => m,
            _ => 0,
        }
    }

    /// Parses a `CLUSTER SLOTS` reply: `[[first, last, [host, port, id…], replicas…]…]`.
    fn parse(reply: Value) -> Option<SlotMap> {
        let Value::Array(entries) = reply else {
            return None;
        };
        let mut map = SlotMap::default();
        let mut index: HashMap<Master, usize> = HashMap::new();
        for entry in entries {
            let Value::Array(parts) = entry else {
                return None;
            };
            let mut parts = parts.into_iter();
            let first: u16 = redis::from_redis_value(parts.next()?).ok()?;
            let last: u16 = redis::from_redis_value(parts.next()?).ok()?;
            let Value::Array(node) = parts.next()? else {
                return None;
            };
            let mut node = node.into_iter();
            let host: String = redis::from_redis_value(node.next()?).ok()?;
            let port: u16 = redis::from_redis_value(node.next()?).ok()?;
            let master = Master::Node { host, port };
            let next = index.len();
            let m = *index.entry(master.clone()).or_insert(next);
            if m == next {
                map.masters.push(master);
            }
            map.ranges.push((first, last, m));
        }
        map.ranges.sort_unstable();
        Some(map)
    }
}

/// The cluster client's connection with pipelines split per master (see the module header).
#[derive(Clone)]
pub struct ClusterConn {
    inner: ClusterConnection,
    slots: Arc<Mutex<SlotMap>>,
    commit_key: Option<Arc<[u8]>>,
}

impl ClusterConn {
    /// Connects to the cluster through its seed URLs and reads its slot map.
    ///
    /// # Errors
    /// A bad URL (`InvalidClientConfig`), no reachable seed, refused credentials, or a
    /// server that is not in cluster mode.
    pub async fn connect(urls: &[String], settings: ClusterSettings) -> RedisResult<ClusterConn> {
        let client = redis::cluster::ClusterClient::builder(urls.iter().map(String::as_str))
            .connection_timeout(settings.connect_timeout)
            .response_timeout(settings.response_timeout)
            .retries(settings.retries)
            .build()?;
        let inner = client.get_async_connection().await?;
        let mut conn = ClusterConn {
            inner,
            slots: Arc::new(Mutex::new(SlotMap::default())),
            commit_key: settings.commit_key.map(|k| Arc::from(k.into_bytes())),
        };
        conn.refresh_slots().await?;
        Ok(conn)
    }

    /// Reads `CLUSTER SLOTS` again.
    async fn refresh_slots(&mut self) -> RedisResult<()> {
        let reply = self
            .inner
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await?;
        let map = SlotMap::parse(reply.extract_error()?).ok_or_else(|| {
            RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "CLUSTER SLOTS answered something else than a slot map",
            ))
        })?;
        *self.slots.lock() = map;
        Ok(())
    }

    fn key_per_master(&self, base: &str) -> Vec<String> {
        let map = self.slots.lock();
        let mut keys: Vec<Option<String>> = vec![None; map.masters.len()];
        let mut missing = keys.len();
        for n in 0..TAG_SEARCH {
            if missing == 0 {
                break;
            }
            let key = format!("{base}:{{{n}}}");
            let m = map.master_of(slot_of(key.as_bytes()));
            if let Some(slot @ None) = keys.get_mut(m) {
                *slot = Some(key);
                missing -= 1;
            }
        }
        keys.into_iter().flatten().collect()
    }

    /// Every master, from a fresh slot map.
    async fn masters(&mut self) -> RedisResult<Vec<Master>> {
        self.refresh_slots().await?;
        Ok(self.slots.lock().masters.clone())
    }

    /// Sends `pipeline` as one sub-pipeline per master, concurrently, and puts the answers
    /// back in order; commands answered with a redirect or a transient cluster error are
    /// sent again one by one, in order.
    async fn split_pipeline(&mut self, pipeline: &Pipeline) -> RedisResult<Vec<Value>> {
        let (groups, commit) = self.group(pipeline);
        let mut out = vec![Value::Nil; pipeline.len()];
        for wave in [groups, commit.into_iter().collect()] {
            let sends = wave.into_iter().map(|(slot, positions, sub)| {
                let mut inner = self.inner.clone();
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                async move {
                    let n = positions.len();
                    let values = inner.route_pipeline(sub, 0, n, route).await?;
                    Ok::<_, RedisError>((positions, values))
                }
            });
            for result in join_all(sends).await {
                let (positions, values) = result?;
                for (at, value) in positions.into_iter().zip(values) {
                    out[at] = value;
                }
            }
        }
        self.resend_redirected(pipeline, &mut out).await?;
        Ok(out)
    }

    /// The pipeline's commands grouped by master, `(a slot of the master, positions,
    /// sub-pipeline)`, and apart from them those on the commit key.
    fn group(&self, pipeline: &Pipeline) -> (Vec<SubPipeline>, Option<SubPipeline>) {
        let map = self.slots.lock();
        let mut groups: Vec<SubPipeline> = Vec::new();
        let mut commit: Option<SubPipeline> = None;
        let mut by_master: HashMap<usize, usize> = HashMap::new();
        for (at, cmd) in pipeline.cmd_iter().enumerate() {
            let key = first_key(cmd);
            let slot = key.map_or(0, slot_of);
            if key.is_some() && key == self.commit_key.as_deref() {
                let c = commit.get_or_insert_with(|| (slot, Vec::new(), redis::pipe()));
                c.1.push(at);
                c.2.add_command(cmd.clone());
                continue;
            }
            let master = map.master_of(slot);
            let g = *by_master.entry(master).or_insert_with(|| {
                groups.push((slot, Vec::new(), redis::pipe()));
                groups.len() - 1
            });
            groups[g].1.push(at);
            groups[g].2.add_command(cmd.clone());
        }
        (groups, commit)
    }

    /// Sends again, one by one and in order, the commands answered with `MOVED`, `ASK` or a
    /// transient cluster error; the client follows the redirect (or waits out the failover).
    async fn resend_redirected(
        &mut self,
        pipeline: &Pipeline,
        out: &mut [Value],
    ) -> RedisResult<()> {
        let mut moved = false;
        for (at, cmd) in pipeline.cmd_iter().enumerate() {
            let retry = matches!(&out[at], Value::ServerError(e) if is_redirect(e.kind()));
            if retry {
                moved = true;
                out[at] = self.inner.req_packed_command(cmd).await?;
            }
        }
        if moved {
            self.refresh_slots().await?;
        }
        Ok(())
    }
}

/// Whether a command answered with this error goes through the client again.
fn is_redirect(kind: Option<redis::ServerErrorKind>) -> bool {
    use redis::ServerErrorKind as K;
    matches!(
        kind,
        Some(K::Moved | K::Ask | K::TryAgain | K::ClusterDown | K::MasterDown | K::ReadOnly)
    )
}

/// Hash tags tried to find a key on every master (each owns a share of the 16384 slots, so a
/// few dozen suffice).
const TAG_SEARCH: u32 = 100_000;

/// One master's share of a pipeline: a slot it owns, the commands' positions, the commands.
type SubPipeline = (u16, Vec<usize>, Pipeline);

/// A command's first key (every command kvindex pipelines has its key first).
fn first_key(cmd: &Cmd) -> Option<&[u8]> {
    match cmd.args_iter().nth(1)? {
        Arg::Simple(key) => Some(key),
        _ => None,
    }
}

/// Redis Cluster's slot of `key`: CRC16 (XMODEM) of its hash tag (the text between the first
/// `{` and the next `}`, when not empty) or of the whole key, modulo 16384.
pub fn slot_of(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|b| *b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|b| *b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % 16384
}

impl ConnectionLike for ClusterConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.inner.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let fut: BoxFuture<'a, RedisResult<Vec<Value>>> = async move {
            if pipeline.is_transaction() {
                return self
                    .inner
                    .req_packed_commands(pipeline, offset, count)
                    .await;
            }
            let mut all = self.split_pipeline(pipeline).await?;
            Ok(all.drain(..).skip(offset).take(count).collect())
        }
        .boxed();
        fut
    }

    fn get_db(&self) -> i64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_redis_cluster_rules() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot_of(b"123456789"), 0x31C3);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        // An empty tag does not count: the whole key is hashed.
        assert_ne!(slot_of(b"foo{}{bar}"), slot_of(b"bar"));
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
    }

    #[test]
    fn slot_map_finds_the_owner_of_every_slot() {
        let node = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let range = |a: i64, b: i64, port: i64| {
            Value::Array(vec![Value::Int(a), Value::Int(b), node(port)])
        };
        let reply = Value::Array(vec![
            range(5461, 10922, 7001),
            range(0, 5460, 7000),
            range(10923, 16383, 7002),
        ]);
        let map = SlotMap::parse(reply).expect("a slot map");
        assert_eq!(map.masters.len(), 3);
        let port = |slot| match &map.masters[map.master_of(slot)] {
            Master::Node { port, .. } => *port,
            Master::Single => 0,
        };
        assert_eq!((port(0), port(5460), port(5461)), (7000, 7000, 7001));
        assert_eq!((port(10922), port(10923), port(16383)), (7001, 7002, 7002));
        let targets = RedisTarget::Cluster(vec![
            "redis://:s3cret@h:1".into(),
            "redis://:s3cret@h:2".into(),
        ]);
        assert!(!targets.shown().contains("s3cret"));
        assert!(!targets.scrub("auth s3cret failed").contains("s3cret"));
    }
}
