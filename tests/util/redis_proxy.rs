//! A TCP proxy on 127.0.0.1 in front of a test's Redis that can cut what it forwards: every
//! connection at once (an outage: open connections dropped, new ones closed at once), or one
//! connection part-way through what it sends (a cut inside a pipeline).

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// What the proxy cuts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Nothing: every connection forwards both ways.
    None,
    /// Every connection: open ones dropped, new ones closed at once.
    All,
    /// Connection `n` (0 = the first opened), after `bytes` more bytes towards Redis.
    After { n: usize, bytes: usize },
}

/// The proxy; it stops with the test's runtime.
pub struct RedisProxy {
    /// The port clients connect to instead of Redis's.
    port: u16,
    cut: watch::Sender<Cut>,
    _task: tokio::task::JoinHandle<()>,
}

impl RedisProxy {
    /// Listens on a free port, forwarding to Redis on `upstream`.
    pub async fn start(upstream: u16) -> RedisProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, _) = watch::channel(Cut::None);
        let cuts = cut.clone();
        let task = tokio::spawn(async move {
            let mut opened = 0usize;
            while let Ok((inbound, _)) = listener.accept().await {
                let this = opened;
                opened += 1;
                let rx = cuts.subscribe();
                if *rx.borrow() == Cut::All {
                    continue;
                }
                tokio::spawn(forward(inbound, upstream, this, rx));
            }
        });
        RedisProxy {
            port,
            cut,
            _task: task,
        }
    }

    /// The URL that reaches Redis through the proxy (db 0, as `OwnRedis::url`).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Cuts every connection (`true`) until called with `false`.
    pub fn set_cut(&self, cut: bool) {
        self.cut
            .send_replace(if cut { Cut::All } else { Cut::None });
    }

    /// Cuts connection `n` (0 = the first opened) after `bytes` more bytes towards Redis.
    pub fn cut_after(&self, n: usize, bytes: usize) {
        self.cut.send_replace(Cut::After {
            n,
            bytes: bytes.max(1),
        });
    }
}

/// Forwards one connection both ways; towards Redis byte by count, so a cut can fall inside
/// a pipeline.
async fn forward(inbound: TcpStream, upstream: u16, this: usize, mut cut: watch::Receiver<Cut>) {
    let Ok(out) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let (mut from_client, mut to_client) = inbound.into_split();
    let (mut from_redis, mut to_redis) = out.into_split();
    let replies = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_redis, &mut to_client).await;
    });
    let mut left = bytes_left(*cut.borrow_and_update(), this);
    let mut buf = vec![0u8; 16 * 1024];
    while left != Some(0) {
        tokio::select! {
            read = from_client.read(&mut buf) => {
                let n = match read {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let pass = left.map_or(n, |l| l.min(n));
                if to_redis.write_all(&buf[..pass]).await.is_err() {
                    break;
                }
                if let Some(l) = &mut left {
                    *l -= pass;
                }
            }
            Ok(()) = cut.changed() => {
                // A connection already counting down keeps its count, unless everything is cut.
                let now = *cut.borrow_and_update();
                if left.is_none() || now == Cut::All {
                    left = bytes_left(now, this);
                }
            }
        }
    }
    replies.abort();
}

/// How many more bytes connection `this` may send under `cut`: `None` for no limit.
fn bytes_left(cut: Cut, this: usize) -> Option<usize> {
    match cut {
        Cut::None => None,
        Cut::All => Some(0),
        Cut::After { n, bytes } if n == this => Some(bytes),
        Cut::After { .. } => None,
    }
}
