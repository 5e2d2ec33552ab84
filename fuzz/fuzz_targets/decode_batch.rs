//! Raw bytes as one msgpack payload: the decoder must return a batch or a typed error,
//! never panic, and both decode options must agree on everything the index uses.
#![no_main]

use kvindex::wire::{batch_to_json, decode_batch, DecodeOptions, Event};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let full = decode_batch(data, DecodeOptions::FULL);
    let lean = decode_batch(data, DecodeOptions::INDEX);
    match (&full, &lean) {
        (Ok(full), Ok(lean)) => {
            // Keeping display-only extras must not change what is decoded for the index.
            assert_eq!(full.events.len(), lean.events.len());
            assert_eq!(full.skipped, lean.skipped);
            assert_eq!(full.dp_rank, lean.dp_rank);
            for (f, l) in full.events.iter().zip(&lean.events) {
                match (f, l) {
                    (Event::BlockStored(f), Event::BlockStored(l)) => {
                        assert_eq!(f.block_hashes, l.block_hashes);
                        assert_eq!(f.token_ids, l.token_ids);
                        assert_eq!(f.medium, l.medium);
                        assert_eq!(f.lora_name, l.lora_name);
                    }
                    (f, l) => assert_eq!(f.kind(), l.kind()),
                }
            }
            // The text form of `kvindex decode` must render whatever decoded.
            let _ = batch_to_json(0, 0, full);
        }
        (Err(f), Err(l)) => assert_eq!(f.reason(), l.reason()),
        _ => panic!("decode options disagree: full {full:?} vs index {lean:?}"),
    }
});
