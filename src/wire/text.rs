//! The stable JSON text form of decoded batches (`kvindex decode`, tests, operators).

use serde_json::{json, Map, Value};

use super::event::{BlockHash, EngineBatch, Event, Passthrough, SkipReason};
use crate::medium::Medium;

/// A hash's text form as a JSON string (decimal as sent, lowercase hex for bytes).
pub fn hash_to_json(hash: &BlockHash) -> Value {
    Value::String(hash.to_string())
}

fn medium_to_json(medium: Medium) -> Value {
    if medium.is_none() {
        Value::Null
    } else {
        Value::String(medium.spelling().to_owned())
    }
}

fn passthrough_to_json(value: &Passthrough) -> Value {
    value.as_ref().map_or(Value::Null, msgpack_to_json)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Converts a msgpack value to JSON: byte strings become lowercase hex, ext values null.
fn msgpack_to_json(value: &rmpv::Value) -> Value {
    use rmpv::Value as V;
    match value {
        V::Nil | V::Ext(..) => Value::Null,
        V::Boolean(b) => Value::Bool(*b),
        V::Integer(i) => i
            .as_u64()
            .map(Value::from)
            .or_else(|| i.as_i64().map(Value::from))
            .unwrap_or(Value::Null),
        V::F32(f) => json!(f),
        V::F64(f) => json!(f),
        V::String(s) => Value::String(s.as_str().map_or_else(|| hex(s.as_bytes()), str::to_owned)),
        V::Binary(b) => Value::String(hex(b)),
        V::Array(items) => Value::Array(items.iter().map(msgpack_to_json).collect()),
        V::Map(pairs) => Value::Object(
            pairs
                .iter()
                .map(|(k, v)| {
                    let key = match k {
                        V::String(s) => s.as_str().unwrap_or_default().to_owned(),
                        other => other.to_string(),
                    };
                    (key, msgpack_to_json(v))
                })
                .collect(),
        ),
    }
}

fn event_to_json(event: &Event) -> Value {
    let mut obj = Map::new();
    obj.insert("type".into(), Value::String(event.kind().as_str().into()));
    match event {
        Event::BlockStored(s) => {
            let extras = s.extras.as_deref().cloned().unwrap_or_default();
            obj.insert(
                "block_hashes".into(),
                s.block_hashes.iter().map(hash_to_json).collect(),
            );
            obj.insert(
                "parent_block_hash".into(),
                s.parent_block_hash
                    .as_ref()
                    .map_or(Value::Null, hash_to_json),
            );
            obj.insert("token_ids".into(), json!(s.token_ids));
            obj.insert("block_size".into(), json!(s.block_size));
            obj.insert("lora_id".into(), json!(s.lora_id));
            obj.insert("medium".into(), medium_to_json(s.medium));
            obj.insert("lora_name".into(), json!(s.lora_name));
            obj.insert("extra_keys".into(), passthrough_to_json(&extras.extra_keys));
            obj.insert("group_idx".into(), json!(s.group_idx));
            obj.insert("kv_cache_spec_kind".into(), json!(s.kv_cache_spec_kind));
            obj.insert(
                "kv_cache_spec_sliding_window".into(),
                json!(s.kv_cache_spec_sliding_window),
            );
            obj.insert("locality".into(), json!(s.locality));
            obj.insert("ownership".into(), passthrough_to_json(&extras.ownership));
            obj.insert("session_id".into(), passthrough_to_json(&extras.session_id));
            obj.insert(
                "lookahead_token_ids".into(),
                passthrough_to_json(&extras.lookahead_token_ids),
            );
            obj.insert("cache_salt".into(), passthrough_to_json(&extras.cache_salt));
            obj.insert("mm_keys".into(), passthrough_to_json(&extras.mm_keys));
        }
        Event::BlockRemoved(r) => {
            obj.insert(
                "block_hashes".into(),
                r.block_hashes.iter().map(hash_to_json).collect(),
            );
            obj.insert("medium".into(), medium_to_json(r.medium));
            obj.insert("group_idx".into(), json!(r.group_idx));
            obj.insert("locality".into(), json!(r.locality));
            obj.insert("ownership".into(), passthrough_to_json(&r.ownership));
        }
        Event::AllBlocksCleared => {}
    }
    Value::Object(obj)
}

fn skipped_reason(reason: &SkipReason) -> Value {
    match reason {
        SkipReason::UnknownTag(tag) => json!({"reason": "unknown_tag", "tag": tag}),
        SkipReason::Invalid(e) => json!({"reason": e.reason(), "error": e.to_string()}),
    }
}

/// One decoded message as the `decode` command prints it.
pub fn batch_to_json(seq: u64, endpoint_index: u32, batch: &EngineBatch) -> Value {
    let skipped: Vec<Value> = batch
        .skipped
        .iter()
        .map(|s| {
            let mut v = skipped_reason(&s.reason);
            v["index"] = json!(s.index);
            v
        })
        .collect();
    json!({
        "seq": seq,
        "endpoint_index": endpoint_index,
        "ts": batch.ts,
        "dp_rank": batch.dp_rank,
        "events": batch.events.iter().map(event_to_json).collect::<Vec<_>>(),
        "skipped": skipped,
    })
}

/// A message that could not be decoded, as the `decode` command prints it.
pub fn error_to_json(seq: Option<u64>, error: &dyn std::fmt::Display) -> Value {
    json!({"seq": seq, "error": error.to_string()})
}
