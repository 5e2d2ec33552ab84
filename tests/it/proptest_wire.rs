//! Property tests of the wire decoder: random batches are generated as normalized events,
//! encoded with rmpv the way each engine era lays them out (vLLM tagged arrays with trailing
//! defaults omitted or nil, tagged maps with any subset of keys, SGLang's DP rank and its
//! appended `{cache_salt}` map, TensorRT-LLM string token ids), with unknown tags and unknown
//! fields interleaved, then decoded and compared with what was generated. Arbitrary and
//! truncated bytes must give an error or a batch, never a panic.

use proptest::prelude::*;
use rmpv::Value as V;

use kvindex::medium::Medium;
use kvindex::wire::{
    decode_batch, decode_message, BlockHash, BlockRemoved, BlockStored, DecodeOptions, EngineBatch,
    Event, SkipReason, SkippedEvent, StoredExtras,
};

/// Media spellings seen in the wild, plus one no engine sends.
const MEDIA: [&str; 9] = [
    "GPU",
    "CPU",
    "cpu",
    "CPU_PINNED",
    "DISK",
    "STORAGE",
    "FS",
    "EXTERNAL",
    "NVME_X",
];
const UNKNOWN_TAGS: [&str; 3] = ["RequestAccess", "BlockPinned", "KvFutureEvent"];

/// An engine hash as generated; its wire value and decoded form follow from it.
#[derive(Debug, Clone, PartialEq)]
enum GenHash {
    Unsigned(u64),
    Negative(i64),
    Digest([u8; 32]),
}

impl GenHash {
    fn wire(&self) -> V {
        match self {
            GenHash::Unsigned(v) => V::from(*v),
            GenHash::Negative(v) => V::from(*v),
            GenHash::Digest(b) => V::Binary(b.to_vec()),
        }
    }

    fn decoded(&self) -> BlockHash {
        match self {
            GenHash::Unsigned(v) => BlockHash::Int(*v),
            GenHash::Negative(v) => BlockHash::Neg(*v),
            GenHash::Digest(b) => BlockHash::Bytes(b.to_vec().into_boxed_slice()),
        }
    }
}

fn gen_hash() -> impl Strategy<Value = GenHash> {
    prop_oneof![
        any::<u64>().prop_map(GenHash::Unsigned),
        (i64::MIN..0i64).prop_map(GenHash::Negative),
        // The edges of both integer ranges, where sign and width bugs live.
        prop_oneof![
            Just(GenHash::Unsigned(u64::MAX)),
            Just(GenHash::Unsigned(1 << 63)),
            Just(GenHash::Unsigned(0)),
            Just(GenHash::Negative(i64::MIN)),
            Just(GenHash::Negative(-1)),
        ],
        any::<[u8; 32]>().prop_map(GenHash::Digest),
    ]
}

#[derive(Debug, Clone)]
struct GenStored {
    hashes: Vec<GenHash>,
    parent: Option<GenHash>,
    tokens: Vec<u32>,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    medium: Option<&'static str>,
    lora_name: Option<String>,
    extra_keys: Option<V>,
    group_idx: Option<i64>,
    spec_kind: Option<&'static str>,
    sliding_window: Option<i64>,
    locality: Option<&'static str>,
    /// SGLang salt: `Some(None)` is a salt key sent as nil.
    cache_salt: Option<Option<String>>,
}

#[derive(Debug, Clone)]
struct GenRemoved {
    hashes: Vec<GenHash>,
    medium: Option<&'static str>,
    group_idx: Option<i64>,
}

#[derive(Debug, Clone)]
enum GenEvent {
    Stored(Box<GenStored>),
    Removed(GenRemoved),
    Cleared,
    Unknown(&'static str, Vec<V>),
}

/// How one event is laid out on the wire.
#[derive(Debug, Clone)]
enum Layout {
    /// Tagged array; `keep_nils` trailing default fields are sent as nil (SGLang 0.5.17+),
    /// the rest of the trailing run is omitted (msgspec omit_defaults); `extra` values are
    /// appended after the last known position.
    Array { keep_nils: usize, extra: Vec<V> },
    /// SGLang 0.5.18–0.5.19 `BlockStoredWithMetadata`: 7 positional fields, then a map.
    SglangMetadata { unknown_key: bool },
    /// Tagged map: present fields, `nils` of the absent ones as explicit nil, unknown keys
    /// interleaved, every key order shuffled by `order`.
    Map {
        nils: Vec<bool>,
        unknown: Vec<(String, V)>,
        order: Vec<u32>,
        string_tokens: bool,
    },
}

fn small_value() -> impl Strategy<Value = V> {
    let leaf = prop_oneof![
        Just(V::Nil),
        any::<bool>().prop_map(V::from),
        any::<i64>().prop_map(V::from),
        any::<u64>().prop_map(V::from),
        "[a-z]{0,6}".prop_map(V::from),
        proptest::collection::vec(any::<u8>(), 0..6).prop_map(V::Binary),
        (any::<i8>(), proptest::collection::vec(any::<u8>(), 0..4)).prop_map(|(t, d)| V::Ext(t, d)),
    ];
    leaf.prop_recursive(3, 12, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(V::Array),
            proptest::collection::vec(("[a-z]{1,4}".prop_map(V::from), inner), 0..3)
                .prop_map(V::Map),
        ]
    })
}

fn gen_stored() -> impl Strategy<Value = GenStored> {
    let shape = (
        1usize..5,
        1u32..=16,
        1u32..=16,
        any::<bool>(),
        any::<bool>(),
    );
    let shape = shape.prop_flat_map(|(blocks, bs, last, tokenless, send_size)| {
        // Every block is full except possibly the last one.
        let last = last.min(bs);
        let n_tokens = if tokenless {
            0
        } else {
            (blocks as u32 - 1) * bs + last
        };
        (
            proptest::collection::vec(gen_hash(), blocks),
            proptest::collection::vec(any::<u32>(), n_tokens as usize),
            // block_size may only be left out when tokens divide evenly into the blocks.
            Just(if send_size || (!tokenless && last != bs) {
                Some(bs)
            } else {
                None
            }),
        )
    });
    (
        shape,
        proptest::option::of(gen_hash()),
        proptest::option::of(any::<i64>()),
        proptest::option::of(proptest::sample::select(&MEDIA[..])),
        proptest::option::of("[a-z-]{1,12}"),
        proptest::option::of(proptest::collection::vec(
            proptest::option::of("[a-z]{1,5}"),
            1..4,
        )),
        proptest::option::of(any::<i64>()),
        proptest::option::of(proptest::sample::select(
            &["full_attention", "sliding_window", "mamba"][..],
        )),
        proptest::option::of(any::<i64>()),
        proptest::option::of(proptest::sample::select(&["LOCAL", "REMOTE"][..])),
        proptest::option::of(proptest::option::of("[a-z-]{1,10}")),
    )
        .prop_map(
            |(
                (hashes, tokens, block_size),
                parent,
                lora_id,
                medium,
                lora_name,
                extra_keys,
                group_idx,
                spec_kind,
                sliding_window,
                locality,
                cache_salt,
            )| {
                // A parent equal to one of the event's own hashes is a rejected event.
                let parent = parent.filter(|p| !hashes.contains(p));
                let extra_keys = extra_keys.map(|keys| {
                    V::Array(
                        keys.into_iter()
                            .map(|k| k.map_or(V::Nil, |k| V::Array(vec![V::from(k)])))
                            .collect(),
                    )
                });
                GenStored {
                    hashes,
                    parent,
                    tokens,
                    block_size,
                    lora_id,
                    medium,
                    lora_name,
                    extra_keys,
                    group_idx,
                    spec_kind,
                    sliding_window,
                    locality,
                    cache_salt,
                }
            },
        )
}

fn gen_event() -> impl Strategy<Value = GenEvent> {
    prop_oneof![
        5 => gen_stored().prop_map(|s| GenEvent::Stored(Box::new(s))),
        3 => (
            proptest::collection::vec(gen_hash(), 1..4),
            proptest::option::of(proptest::sample::select(&MEDIA[..])),
            proptest::option::of(any::<i64>()),
        )
            .prop_map(|(hashes, medium, group_idx)| GenEvent::Removed(GenRemoved {
                hashes,
                medium,
                group_idx,
            })),
        1 => Just(GenEvent::Cleared),
        1 => (
            proptest::sample::select(&UNKNOWN_TAGS[..]),
            proptest::collection::vec(small_value(), 0..4),
        )
            .prop_map(|(tag, fields)| GenEvent::Unknown(tag, fields)),
    ]
}

fn gen_layout() -> impl Strategy<Value = Layout> {
    prop_oneof![
        (0usize..12, proptest::collection::vec(small_value(), 0..3))
            .prop_map(|(keep_nils, extra)| Layout::Array { keep_nils, extra }),
        any::<bool>().prop_map(|unknown_key| Layout::SglangMetadata { unknown_key }),
        (
            proptest::collection::vec(any::<bool>(), 16),
            proptest::collection::vec(("x_[a-z]{1,6}", small_value()), 0..3),
            proptest::collection::vec(any::<u32>(), 24),
            any::<bool>(),
        )
            .prop_map(|(nils, unknown, order, string_tokens)| Layout::Map {
                nils,
                unknown,
                order,
                string_tokens,
            }),
    ]
}

fn opt<T: Into<V>>(v: Option<T>) -> V {
    v.map_or(V::Nil, Into::into)
}

fn hashes(h: &[GenHash]) -> V {
    V::Array(h.iter().map(GenHash::wire).collect())
}

fn tokens(t: &[u32], as_strings: bool) -> V {
    V::Array(
        t.iter()
            .map(|t| {
                if as_strings {
                    V::from(t.to_string())
                } else {
                    V::from(*t)
                }
            })
            .collect(),
    )
}

/// `(name, value)` of every field an event carries in its map form, `V::Nil` when absent.
fn map_fields(event: &GenEvent, string_tokens: bool) -> (&'static str, Vec<(&'static str, V)>) {
    match event {
        GenEvent::Stored(s) => (
            "BlockStored",
            vec![
                ("block_hashes", hashes(&s.hashes)),
                (
                    "parent_block_hash",
                    s.parent.as_ref().map_or(V::Nil, GenHash::wire),
                ),
                ("token_ids", tokens(&s.tokens, string_tokens)),
                ("block_size", opt(s.block_size)),
                ("lora_id", opt(s.lora_id)),
                ("medium", opt(s.medium)),
                ("lora_name", opt(s.lora_name.clone())),
                ("extra_keys", s.extra_keys.clone().unwrap_or(V::Nil)),
                ("group_idx", opt(s.group_idx)),
                ("kv_cache_spec_kind", opt(s.spec_kind)),
                ("kv_cache_spec_sliding_window", opt(s.sliding_window)),
                ("locality", opt(s.locality)),
                ("cache_salt", opt(s.cache_salt.clone().flatten())),
            ],
        ),
        GenEvent::Removed(r) => (
            "BlockRemoved",
            vec![
                ("block_hashes", hashes(&r.hashes)),
                ("medium", opt(r.medium)),
                ("group_idx", opt(r.group_idx)),
            ],
        ),
        GenEvent::Cleared => ("AllBlocksCleared", vec![]),
        GenEvent::Unknown(tag, fields) => (
            tag,
            fields
                .iter()
                .enumerate()
                .map(|(i, v)| (["a", "b", "c", "d"][i], v.clone()))
                .collect(),
        ),
    }
}

/// Positional fields after the tag, as vLLM's array eras lay them out.
fn array_fields(event: &GenEvent) -> (&'static str, Vec<V>) {
    match event {
        GenEvent::Stored(s) => (
            "BlockStored",
            vec![
                hashes(&s.hashes),
                s.parent.as_ref().map_or(V::Nil, GenHash::wire),
                tokens(&s.tokens, false),
                opt(s.block_size),
                opt(s.lora_id),
                opt(s.medium),
                opt(s.lora_name.clone()),
                s.extra_keys.clone().unwrap_or(V::Nil),
                opt(s.group_idx),
                opt(s.spec_kind),
                opt(s.sliding_window),
            ],
        ),
        GenEvent::Removed(r) => (
            "BlockRemoved",
            vec![hashes(&r.hashes), opt(r.medium), opt(r.group_idx)],
        ),
        GenEvent::Cleared => ("AllBlocksCleared", vec![]),
        GenEvent::Unknown(tag, fields) => (tag, fields.clone()),
    }
}

/// Encodes one event; returns the wire value and the event as this layout carries it
/// (fields an encoding cannot express are dropped from the expectation).
fn encode_event(event: &GenEvent, layout: &Layout) -> (V, GenEvent) {
    match layout {
        Layout::Array { keep_nils, extra } => {
            let (tag, mut fields) = array_fields(event);
            let full_len = fields.len();
            let last = fields
                .iter()
                .rposition(|v| !v.is_nil())
                .map_or(0, |p| p + 1);
            fields.truncate((last + keep_nils).min(full_len));
            // Extra trailing elements are only legal past every known position.
            if fields.len() == full_len {
                fields.extend(extra.iter().cloned());
            }
            let mut items = vec![V::from(tag)];
            items.extend(fields);
            let mut carried = event.clone();
            if let GenEvent::Stored(s) = &mut carried {
                s.locality = None;
                s.cache_salt = None;
            }
            (V::Array(items), carried)
        }
        Layout::SglangMetadata { unknown_key } => {
            let GenEvent::Stored(s) = event else {
                return encode_event(
                    event,
                    &Layout::Array {
                        keep_nils: 11,
                        extra: vec![],
                    },
                );
            };
            let (_, fields) = array_fields(event);
            let mut items = vec![V::from("BlockStored")];
            items.extend(fields.into_iter().take(6));
            let mut meta = Vec::new();
            if let Some(salt) = &s.cache_salt {
                meta.push((V::from("cache_salt"), opt(salt.clone())));
            }
            if *unknown_key {
                meta.push((V::from("x_future"), V::from(7)));
            }
            items.push(V::Map(meta));
            let mut carried = s.clone();
            carried.lora_name = None;
            carried.extra_keys = None;
            carried.group_idx = None;
            carried.spec_kind = None;
            carried.sliding_window = None;
            carried.locality = None;
            (V::Array(items), GenEvent::Stored(carried))
        }
        Layout::Map {
            nils,
            unknown,
            order,
            string_tokens,
        } => {
            let (tag, fields) = map_fields(event, *string_tokens);
            let mut pairs: Vec<(V, V)> = vec![(V::from("type"), V::from(tag))];
            for (i, (name, value)) in fields.into_iter().enumerate() {
                if !value.is_nil() || nils.get(i).copied().unwrap_or(false) {
                    pairs.push((V::from(name), value));
                }
            }
            pairs.extend(
                unknown
                    .iter()
                    .map(|(k, v)| (V::from(k.as_str()), v.clone())),
            );
            let mut keyed: Vec<(u32, (V, V))> = order.iter().copied().zip(pairs.clone()).collect();
            keyed.extend(pairs.into_iter().skip(order.len()).map(|p| (u32::MAX, p)));
            keyed.sort_by_key(|(k, _)| *k);
            let mut carried = event.clone();
            if let GenEvent::Stored(s) = &mut carried {
                if s.cache_salt == Some(None) {
                    s.cache_salt = None;
                }
            }
            (V::Map(keyed.into_iter().map(|(_, p)| p).collect()), carried)
        }
    }
}

/// The normalized event a correct decoder produces for a carried event.
fn expected_event(event: &GenEvent) -> Result<Event, SkipReason> {
    let medium = |m: Option<&str>| m.map_or(Medium::NONE, Medium::intern);
    match event {
        GenEvent::Stored(s) => {
            let extras = StoredExtras {
                extra_keys: s.extra_keys.clone(),
                cache_salt: s.cache_salt.clone().flatten().map(V::from),
                ..StoredExtras::default()
            };
            Ok(Event::BlockStored(BlockStored {
                block_hashes: s.hashes.iter().map(GenHash::decoded).collect(),
                parent_block_hash: s.parent.as_ref().map(GenHash::decoded),
                token_ids: s.tokens.clone(),
                block_size: s.block_size,
                lora_id: s.lora_id,
                medium: medium(s.medium),
                lora_name: s.lora_name.clone(),
                group_idx: s.group_idx,
                kv_cache_spec_kind: s.spec_kind.map(str::to_owned),
                kv_cache_spec_sliding_window: s.sliding_window,
                locality: s.locality.map(str::to_owned),
                cache_salt: expected_salt(s),
                extras: (!extras.is_empty()).then(|| Box::new(extras)),
            }))
        }
        GenEvent::Removed(r) => Ok(Event::BlockRemoved(BlockRemoved {
            block_hashes: r.hashes.iter().map(GenHash::decoded).collect(),
            medium: medium(r.medium),
            group_idx: r.group_idx,
            locality: None,
            ownership: None,
        })),
        GenEvent::Cleared => Ok(Event::AllBlocksCleared),
        GenEvent::Unknown(tag, _) => Err(SkipReason::UnknownTag((*tag).to_owned())),
    }
}

/// The salt a correct decoder reads: SGLang's `cache_salt`, else the last string of the
/// first block's `extra_keys` that is not the LoRA name; an empty one is none.
fn expected_salt(s: &GenStored) -> Option<String> {
    let from_keys = || {
        let Some(V::Array(blocks)) = &s.extra_keys else {
            return None;
        };
        let Some(V::Array(keys)) = blocks.first() else {
            return None;
        };
        let lora = s.lora_name.as_deref();
        (keys.iter().rev().filter_map(V::as_str))
            .find(|k| Some(*k) != lora)
            .map(str::to_owned)
    };
    (s.cache_salt.clone().flatten())
        .or_else(from_keys)
        .filter(|salt| !salt.is_empty())
}

#[derive(Debug, Clone)]
enum BatchForm {
    /// `[ts, events]` (vLLM 0.9.0, SGLang omit_defaults without a rank).
    Two,
    /// `[ts, events, rank]`, rank nil when `None`.
    Three(Option<i64>),
    /// `{"ts", "events", <rank key>}` with an unknown key.
    Map(&'static str, Option<i64>),
}

fn gen_form() -> impl Strategy<Value = BatchForm> {
    let rank = proptest::option::of(prop_oneof![0i64..8, any::<i64>()]);
    prop_oneof![
        Just(BatchForm::Two),
        rank.clone().prop_map(BatchForm::Three),
        (
            proptest::sample::select(&["data_parallel_rank", "attn_dp_rank"][..]),
            rank
        )
            .prop_map(|(k, r)| BatchForm::Map(k, r)),
    ]
}

struct Case {
    payload: Vec<u8>,
    expected: EngineBatch,
}

fn encode(v: &V) -> Vec<u8> {
    let mut buf = Vec::new();
    rmpv::encode::write_value(&mut buf, v).expect("writing to a Vec cannot fail");
    buf
}

fn gen_case() -> impl Strategy<Value = Case> {
    (
        -1.0e12f64..1.0e12,
        gen_form(),
        proptest::collection::vec((gen_event(), gen_layout()), 0..8),
    )
        .prop_map(|(ts, form, events)| {
            let mut wire_events = Vec::new();
            let mut expected = EngineBatch {
                ts,
                dp_rank: None,
                events: Vec::new(),
                skipped: Vec::new(),
            };
            for (index, (event, layout)) in events.iter().enumerate() {
                let (wire, carried) = encode_event(event, layout);
                wire_events.push(wire);
                match expected_event(&carried) {
                    Ok(e) => expected.events.push(e),
                    Err(reason) => expected.skipped.push(SkippedEvent { index, reason }),
                }
            }
            let events = V::Array(wire_events);
            let batch = match form {
                BatchForm::Two => V::Array(vec![V::F64(ts), events]),
                BatchForm::Three(rank) => {
                    expected.dp_rank = rank;
                    V::Array(vec![V::F64(ts), events, opt(rank)])
                }
                BatchForm::Map(key, rank) => {
                    expected.dp_rank = rank;
                    V::Map(vec![
                        (V::from("x_schema"), V::from(2)),
                        (V::from("events"), events),
                        (V::from(key), opt(rank)),
                        (V::from("ts"), V::F64(ts)),
                    ])
                }
            };
            Case {
                payload: encode(&batch),
                expected,
            }
        })
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case")
            .field("payload_hex", &hex(&self.payload))
            .field("expected", &self.expected)
            .finish()
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the index path sees: the same batch without display-only extras.
fn without_extras(mut batch: EngineBatch) -> EngineBatch {
    for e in &mut batch.events {
        if let Event::BlockStored(s) = e {
            s.extras = None;
        }
    }
    batch
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn generated_batches_decode_to_what_was_encoded(case in gen_case()) {
        let full = decode_batch(&case.payload, DecodeOptions::FULL);
        prop_assert_eq!(full.as_ref(), Ok(&case.expected));
        let lean = decode_batch(&case.payload, DecodeOptions::INDEX);
        prop_assert_eq!(lean, Ok(without_extras(case.expected.clone())));
    }

    #[test]
    fn generated_messages_decode_through_their_frames(case in gen_case(), seq in any::<u64>(), tail in proptest::collection::vec(any::<u8>(), 0..16)) {
        // A seq frame longer than 8 bytes is read from its first 8.
        let mut seq_frame = seq.to_be_bytes().to_vec();
        seq_frame.extend(tail);
        let frames = [b"kv-events".to_vec(), seq_frame, case.payload.clone()];
        let (got_seq, batch) = decode_message(&frames, DecodeOptions::FULL).expect("valid message");
        prop_assert_eq!(got_seq, seq);
        prop_assert_eq!(batch, case.expected);
    }

    #[test]
    fn truncated_batches_are_errors(case in gen_case(), cut in any::<proptest::sample::Index>()) {
        let cut = cut.index(case.payload.len());
        prop_assert!(decode_batch(&case.payload[..cut], DecodeOptions::FULL).is_err());
    }

    #[test]
    fn corrupted_batches_never_panic(case in gen_case(), flips in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..6)) {
        let mut payload = case.payload.clone();
        for (at, byte) in flips {
            let at = at.index(payload.len());
            payload[at] = byte;
        }
        let full = decode_batch(&payload, DecodeOptions::FULL);
        let lean = decode_batch(&payload, DecodeOptions::INDEX);
        // Whatever the bytes, both options agree on success and on everything the index uses.
        prop_assert_eq!(full.map(without_extras), lean);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_batch(&bytes, DecodeOptions::FULL);
        let _ = decode_batch(&bytes, DecodeOptions::INDEX);
        let frames = [&b""[..], &bytes[..bytes.len().min(8)], &bytes[bytes.len().min(8)..]];
        let _ = decode_message(&frames, DecodeOptions::FULL);
    }
}

/// Regression (found by `generated_batches_decode_to_what_was_encoded`): a nil value in
/// SGLang's appended metadata map was eaten in a match guard and then skipped again, which
/// swallowed the next key and turned a valid batch into a "truncated" error.
#[test]
fn sglang_metadata_map_with_nil_values_keeps_the_following_keys() {
    for key in ["cache_salt", "lora_name"] {
        let event = V::Array(vec![
            V::from("BlockStored"),
            V::Array(vec![V::from(7)]),
            V::Nil,
            V::Array(vec![]),
            V::from(16),
            V::Nil,
            V::from("GPU"),
            V::Map(vec![
                (V::from(key), V::Nil),
                (V::from("x_future"), V::from(7)),
            ]),
        ]);
        let payload = encode(&V::Array(vec![V::F64(1.0), V::Array(vec![event]), V::Nil]));
        for options in [DecodeOptions::FULL, DecodeOptions::INDEX] {
            let batch = decode_batch(&payload, options).expect("a valid batch");
            let [Event::BlockStored(stored)] = &batch.events[..] else {
                panic!("expected one BlockStored, got {batch:?}");
            };
            assert_eq!(stored.block_hashes, vec![BlockHash::Int(7)]);
            assert_eq!(stored.lora_name, None);
            assert_eq!(stored.extras, None);
        }
    }
}

/// Records the largest single allocation of the current thread, so a test can bound what a
/// decode reserves (tests run on threads of their own, so others do not interfere).
struct LargestAllocation;

thread_local! {
    static LARGEST: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

unsafe impl std::alloc::GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(layout.size())));
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

/// An array32 header claiming 4 billion events in front of 1 MB of
/// filler used to reserve `min(len, remaining)` events (~200 bytes per input byte).
#[test]
fn a_lying_event_count_reserves_no_more_than_the_bytes_can_hold() {
    let filler = 1 << 20;
    let mut payload = vec![0x92, 0xcb];
    payload.extend_from_slice(&1.0f64.to_be_bytes());
    payload.push(0xdd);
    payload.extend_from_slice(&u32::MAX.to_be_bytes());
    payload.extend(std::iter::repeat_n(0xc0, filler));
    LARGEST.with(|l| l.set(0));
    let decoded = decode_batch(&payload, DecodeOptions::INDEX);
    let largest = LARGEST.with(std::cell::Cell::get);
    assert!(decoded.is_err(), "nil is not an event");
    assert!(
        largest < filler,
        "decoding a {filler}-byte payload reserved {largest} bytes at once"
    );
}
