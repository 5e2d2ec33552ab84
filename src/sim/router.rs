//! The replay ROUTER of one simulated rank: answers `["", start_seq]` with every buffered
//! message from `start_seq` on as `["", seq, payload]` (vLLM's reply shape), then the end
//! marker `["", u64::MAX, ""]`.

use bytes::Bytes;
use zeromq::{RouterSocket, SocketRecv, SocketSend, ZmqMessage};

use super::Buffer;
use kvindex::wire::END_MARKER_SEQ;

/// Serves replay requests until the socket fails (or the task is aborted).
pub(super) async fn serve(mut socket: RouterSocket, buffer: Buffer) {
    loop {
        let Ok(request) = socket.recv().await else {
            return;
        };
        let frames = request.into_vec();
        // [identity, "", start_seq]; anything else is ignored, as an engine would.
        let (Some(identity), Some(start)) = (frames.first(), frames.get(2)) else {
            continue;
        };
        let Ok(start) = kvindex::wire::read_seq(start) else {
            continue;
        };
        let replies: Vec<Vec<Bytes>> = buffer
            .lock()
            .iter()
            .filter(|(seq, _)| *seq >= start)
            .map(|(_, m)| vec![identity.clone(), Bytes::new(), m[1].clone(), m[2].clone()])
            .collect();
        for reply in replies {
            if send(&mut socket, reply).await.is_err() {
                return;
            }
        }
        let end = vec![
            identity.clone(),
            Bytes::new(),
            Bytes::copy_from_slice(&END_MARKER_SEQ.to_be_bytes()),
            Bytes::new(),
        ];
        if send(&mut socket, end).await.is_err() {
            return;
        }
    }
}

async fn send(socket: &mut RouterSocket, frames: Vec<Bytes>) -> Result<(), ()> {
    let message = ZmqMessage::try_from(frames).map_err(drop)?;
    socket.send(message).await.map_err(drop)
}
