//! Frames split from the input, through the live and the replay-reply paths.
//!
//! Input layout: byte 0 % 5 = frame count n; then n-1 frames each prefixed by a one-byte
//! length (cut short when the input ends); the last frame is the rest of the input.
#![no_main]

use kvindex::wire::{decode_batch, decode_message, split_replay_reply, DecodeOptions};
use libfuzzer_sys::fuzz_target;

fn split(data: &[u8]) -> Vec<&[u8]> {
    let Some((&first, mut rest)) = data.split_first() else {
        return Vec::new();
    };
    let n = usize::from(first % 5);
    let mut frames = Vec::with_capacity(n);
    for i in 0..n {
        if i + 1 == n {
            frames.push(rest);
            break;
        }
        let Some((&len, tail)) = rest.split_first() else {
            frames.push(&[][..]);
            rest = &[];
            continue;
        };
        let len = usize::from(len).min(tail.len());
        frames.push(&tail[..len]);
        rest = &tail[len..];
    }
    frames
}

fuzz_target!(|data: &[u8]| {
    let frames = split(data);
    match decode_message(&frames, DecodeOptions::FULL) {
        Ok((_, batch)) => {
            let _ = kvindex::wire::batch_to_json(0, 0, &batch);
        }
        Err(e) => {
            // Every error has a fixed metric label and a message.
            assert!(!e.reason().is_empty());
            let _ = e.to_string();
        }
    }
    if let Ok(reply) = split_replay_reply(&frames) {
        let _ = decode_batch(reply.payload, DecodeOptions::INDEX);
    }
});
