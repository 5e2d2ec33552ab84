//! The fast path for a request's `tokens` array: found in the body and read in one tight
//! loop, the rest of the body left to serde.
//!
//! serde_json reads each number through its sequence and visitor plumbing, which makes a long
//! prompt's parse the largest share of a `POST /v1/score`'s cost beyond the floor of any
//! request (docs/benchmarks.md, score_load). Here the top-level `"tokens"` key is found by
//! a scan that follows JSON's strings and brackets, its array of plain integers is read
//! directly, and serde parses the body with `null` in its place.
//!
//! Exactness: only what serde would read the same way is taken — an array of JSON integers
//! (no sign, fraction, exponent or leading zero) up to `u32::MAX`, under the key spelled
//! `"tokens"` without escapes, at the top level. Anything else (an escaped key, `-0`, a
//! float, a second `tokens` key, a syntax error anywhere) gives `None`, or makes serde refuse
//! the rest, and the caller parses the original body as before: same value, same error.
//! Replacing one JSON value by another (`null`) keeps a body valid or invalid as it was,
//! since the scan agrees with a JSON parser on every valid prefix.

/// A body whose top-level `tokens` array was read: the body with `null` where the array was,
/// and the array's values.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct SplitBody {
    /// The body with `"tokens": null`, for serde.
    pub(super) rest: Vec<u8>,
    /// The array's values, in order.
    pub(super) tokens: Vec<u32>,
}

/// Cuts the top-level `"tokens"` array of integers out of a JSON object `body` and reads it;
/// `None` when the body has no such array or anything is not plainly as expected (the caller
/// then lets serde read the whole body).
pub(super) fn split_tokens(body: &[u8]) -> Option<SplitBody> {
    let mut at = skip_ws(body, 0);
    if body.get(at) != Some(&b'{') {
        return None;
    }
    at += 1;
    loop {
        at = skip_ws(body, at);
        let key_end = skip_string(body, at)?;
        let key = &body[at..key_end];
        at = skip_ws(body, key_end);
        if body.get(at) != Some(&b':') {
            return None;
        }
        at = skip_ws(body, at + 1);
        if key == b"\"tokens\"" {
            return read_array(body, at).map(|(tokens, end)| {
                let mut rest = Vec::with_capacity(body.len() - (end - at) + 4);
                rest.extend_from_slice(&body[..at]);
                rest.extend_from_slice(b"null");
                rest.extend_from_slice(&body[end..]);
                SplitBody { rest, tokens }
            });
        }
        at = skip_ws(body, skip_value(body, at)?);
        match body.get(at)? {
            b',' => at += 1,
            _ => return None,
        }
    }
}

/// The index after the JSON whitespace (space, tab, LF, CR) at `at`.
#[inline]
fn skip_ws(body: &[u8], mut at: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = body.get(at) {
        at += 1;
    }
    at
}

/// The index after the string that starts at `at` (its closing quote included), following
/// backslash escapes; `None` when no string starts there or it does not end.
fn skip_string(body: &[u8], at: usize) -> Option<usize> {
    if body.get(at) != Some(&b'"') {
        return None;
    }
    let mut i = at + 1;
    loop {
        match body.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
}

/// The index after the JSON value that starts at `at`: a string, an object or array (its
/// brackets counted, strings inside skipped whole) or a scalar (a run of the bytes numbers
/// and `true`/`false`/`null` are made of). `None` where no value can start or it does not
/// end; the value's own grammar is serde's to check.
fn skip_value(body: &[u8], at: usize) -> Option<usize> {
    match body.get(at)? {
        b'"' => skip_string(body, at),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = at;
            loop {
                match body.get(i)? {
                    b'"' => {
                        i = skip_string(body, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
            let len = body[at..]
                .iter()
                .take_while(|b| matches!(b, b'-' | b'+' | b'.' | b'0'..=b'9' | b'a'..=b'z' | b'E'))
                .count();
            Some(at + len)
        }
        _ => None,
    }
}

/// Reads the array of integers that starts at `at`: its values and the index after its
/// closing bracket.
fn read_array(body: &[u8], at: usize) -> Option<(Vec<u32>, usize)> {
    if body.get(at) != Some(&b'[') {
        return None;
    }
    // About one value per 4 bytes in the compact form clients send (most token ids have
    // 4–6 digits); a guess, the vector grows past it.
    let mut tokens = Vec::with_capacity(body.len().saturating_sub(at) / 4);
    let mut i = skip_ws(body, at + 1);
    if body.get(i) == Some(&b']') {
        return Some((tokens, i + 1));
    }
    loop {
        let (value, end) = read_u32(body, i)?;
        tokens.push(value);
        i = end;
        // Compact JSON has no whitespace: testing the byte before the skip (here and after
        // the comma) spares the common case a call.
        if !matches!(body.get(i), Some(b',' | b']')) {
            i = skip_ws(body, i);
        }
        match body.get(i)? {
            b',' => {
                i += 1;
                if !body.get(i).is_some_and(u8::is_ascii_digit) {
                    i = skip_ws(body, i);
                }
            }
            b']' => return Some((tokens, i + 1)),
            _ => return None,
        }
    }
}

/// Reads a JSON integer in `0..=u32::MAX` at `at` (digits only, no leading zero) and the
/// index after it; `None` for anything else, including a digit run followed by a fraction or
/// an exponent (the caller sees `.`, `e` or `E` next and refuses). A byte at a time: reading
/// a word of digits at once (SWAR) is slower, since each number's length then feeds the next
/// load, where the branches are predicted past it.
#[inline]
fn read_u32(body: &[u8], at: usize) -> Option<(u32, usize)> {
    let digit = |i: usize| {
        body.get(i)
            .map(|b| b.wrapping_sub(b'0'))
            .filter(|&d| d <= 9)
    };
    let first = digit(at)?;
    if first == 0 {
        // JSON has no leading zeros: "0" alone, never "01".
        return digit(at + 1).is_none().then_some((0, at + 1));
    }
    let mut value = u64::from(first);
    let mut i = at + 1;
    // u32::MAX has 10 digits: an 11th means the value is out of range.
    while let Some(d) = digit(i) {
        if i - at == 10 {
            return None;
        }
        value = value * 10 + u64::from(d);
        i += 1;
    }
    Some((u32::try_from(value).ok()?, i))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Request {
        #[serde(default)]
        model: Option<String>,
        #[serde(default)]
        tokens: Option<Vec<u32>>,
        #[serde(default)]
        pods: Option<Vec<String>>,
        #[serde(default)]
        nested: Option<serde_json::Value>,
    }

    /// What the fast path gives for `body`: the split read back into a request, or serde's
    /// reading of the whole body when there is no split or serde refuses the rest (what the
    /// API does).
    fn fast(body: &[u8]) -> Result<Request, String> {
        if let Some(split) = split_tokens(body) {
            if let Ok(mut request) = serde_json::from_slice::<Request>(&split.rest) {
                assert!(request.tokens.is_none(), "the rest keeps a null");
                request.tokens = Some(split.tokens);
                return Ok(request);
            }
        }
        slow(body)
    }

    fn slow(body: &[u8]) -> Result<Request, String> {
        serde_json::from_slice(body).map_err(|e| e.to_string())
    }

    #[test]
    fn integers_read_as_serde_reads_them() {
        let numbers = (0..10).flat_map(|e| [10u64.pow(e) - 1, 10u64.pow(e), 10u64.pow(e) + 1]);
        for n in numbers.chain([u64::from(u32::MAX), u64::from(u32::MAX) + 1, 10u64.pow(12)]) {
            for tail in ["", ",", "]", " "] {
                let text = format!("{n}{tail}");
                let serde = serde_json::from_str::<u32>(&format!("{n}")).ok();
                let read = read_u32(text.as_bytes(), 0).map(|(value, end)| {
                    assert_eq!(end, n.to_string().len(), "{text:?}");
                    value
                });
                assert_eq!(read, serde, "{text:?}");
            }
        }
        for text in ["01", "00", "-1", "+1", "", "a"] {
            assert_eq!(read_u32(text.as_bytes(), 0), None, "{text:?}");
        }
    }

    #[test]
    fn a_compact_body_is_split() {
        let body = br#"{"model":"m","tokens":[0,1,22,4294967295],"pods":["a"]}"#;
        let split = split_tokens(body).expect("splits");
        assert_eq!(split.tokens, [0, 1, 22, u32::MAX]);
        assert_eq!(split.rest, br#"{"model":"m","tokens":null,"pods":["a"]}"#);
    }

    #[test]
    fn whitespace_anywhere_json_allows_it_is_split() {
        let body = b" {\n \"model\" : \"m\" ,\t\"tokens\" :\r [ 7 , 8\n,9 ] , \"pods\": [] }\n";
        let split = split_tokens(body).expect("splits");
        assert_eq!(split.tokens, [7, 8, 9]);
        assert_eq!(fast(body), slow(body));
    }

    #[test]
    fn an_empty_array_is_split() {
        let split = split_tokens(br#"{"tokens":[ ]}"#).expect("splits");
        assert!(split.tokens.is_empty());
        assert_eq!(split.rest, br#"{"tokens":null}"#);
    }

    #[test]
    fn what_serde_reads_otherwise_is_left_to_serde() {
        for body in [
            &br#"{"tokens":[01]}"#[..],
            br#"{"tokens":[-0]}"#,
            br#"{"tokens":[-1]}"#,
            br#"{"tokens":[1.0]}"#,
            br#"{"tokens":[1e3]}"#,
            br#"{"tokens":[4294967296]}"#,
            br#"{"tokens":[42949672950]}"#,
            br#"{"tokens":[1,]}"#,
            br#"{"tokens":[,1]}"#,
            br#"{"tokens":["1"]}"#,
            br#"{"tokens":[1"#,
            br#"{"tokens":null}"#,
            br#"{"tok\u0065ns":[1]}"#,
            br#"{"model":"\"tokens\":[1]"}"#,
            br#"{"nested":{"tokens":[1]}}"#,
            br#"[{"tokens":[1]}]"#,
            br#"{"model":}"#,
        ] {
            assert_eq!(
                split_tokens(body),
                None,
                "{}",
                String::from_utf8_lossy(body)
            );
            assert_eq!(fast(body), slow(body), "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn a_second_tokens_key_is_refused_as_serde_refuses_it() {
        let body = br#"{"tokens":[1],"tokens":[2]}"#;
        assert!(split_tokens(body).is_some());
        let refused = fast(body).expect_err("duplicate");
        assert!(refused.contains("duplicate field `tokens`"), "{refused}");
        assert_eq!(fast(body), slow(body));
        let escaped = br#"{"tokens":[1],"tok\u0065ns":[2]}"#;
        assert_eq!(fast(escaped), slow(escaped));
    }

    #[test]
    fn an_error_after_the_array_is_serdes_on_the_whole_body() {
        let body = br#"{"tokens":[1,2],"pods":[1]}"#;
        assert_eq!(fast(body), slow(body));
        let body = br#"{"tokens":[1,2],"model":"m",}"#;
        assert_eq!(fast(body), slow(body));
    }

    /// A JSON text for a request: mostly the fields `Request` has, each once, in any order,
    /// with values of their types; sometimes any keys with any values (duplicates, unknown
    /// and escaped keys, values of the wrong type, unclosed arrays). Token arrays mix the
    /// integers serde reads with spellings it refuses or reads otherwise.
    fn body_strategy() -> impl Strategy<Value = String> {
        fn ws() -> impl Strategy<Value = &'static str> {
            prop::sample::select(vec!["", "", "", " ", "\n", "\t", " \r\n "])
        }
        fn field(key: &'static str, value: BoxedStrategy<String>) -> impl Strategy<Value = String> {
            (ws(), value, ws()).prop_map(move |(a, v, b)| format!("{a}\"{key}\"{b}:{a}{v}{b}"))
        }
        let number = prop_oneof![
            16 => (0u32..200_000).prop_map(|n| n.to_string()),
            8 => any::<u32>().prop_map(|n| n.to_string()),
            1 => prop::sample::select(vec![
                "0",
                "4294967295",
                "4294967296",
                "01",
                "-0",
                "-3",
                "1.5",
                "2e3",
                "1E3",
                "\"7\"",
                "null",
                "99999999999",
                "1-",
                "true",
            ])
            .prop_map(str::to_owned),
        ];
        let tokens = prop::collection::vec((number, ws(), ws()), 0..12)
            .prop_map(|items| {
                let inner: Vec<String> = items
                    .into_iter()
                    .map(|(n, a, b)| format!("{a}{n}{b}"))
                    .collect();
                format!("[{}]", inner.join(","))
            })
            .boxed();
        let other = || {
            prop::sample::select(vec![
                "null",
                r#""m""#,
                r#""a \"quoted\" \\ \"tokens\":[1]""#,
                r#"["p1","p\"2",{"tokens":[3]}]"#,
                r#"{"tokens":[4],"x":[[],{}]}"#,
                "[1,2",
                "-1.5e3",
                "true",
            ])
            .prop_map(str::to_owned)
        };
        let pods = prop::sample::select(vec![r#"[]"#, r#"["a"]"#, r#"["a","b\"c","\u0064"]"#]);
        let well_formed = (
            prop::option::of(field("model", Just(r#""m\"odel""#.to_owned()).boxed())),
            prop::option::of(field("tokens", tokens.clone().boxed())),
            prop::option::of(field("pods", pods.prop_map(str::to_owned).boxed())),
            prop::option::of(field("nested", other().boxed())),
        )
            .prop_map(|(a, b, c, d)| vec![a, b, c, d].into_iter().flatten().collect::<Vec<_>>())
            .prop_shuffle();
        let key = prop::sample::select(vec![
            "model",
            "tokens",
            "tokens",
            "pods",
            "nested",
            r#"tok\u0065ns"#,
            "other",
        ]);
        let value = prop_oneof![3 => tokens, 1 => other()];
        let messy =
            prop::collection::vec((key, value.boxed()), 0..5).prop_flat_map(move |fields| {
                fields
                    .into_iter()
                    .map(|(k, v)| field(k, Just(v).boxed()))
                    .collect::<Vec<_>>()
            });
        prop_oneof![3 => well_formed, 1 => messy]
            .prop_map(|fields| format!("{{{}}}", fields.join(",")))
    }

    /// The generated bodies go both ways: many taken whole by the fast path, many left to
    /// serde (so the properties below test both).
    #[test]
    fn generated_bodies_take_both_paths() {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let strategy = body_strategy();
        let (mut taken, mut left) = (0, 0);
        for _ in 0..1_000 {
            let body = strategy.new_tree(&mut runner).expect("a body").current();
            match split_tokens(body.as_bytes()) {
                Some(split) if serde_json::from_slice::<Request>(&split.rest).is_ok() => taken += 1,
                _ => left += 1,
            }
        }
        assert!(taken >= 100 && left >= 100, "taken {taken}, left {left}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// The fast path reads every body as serde reads it: the same request or the same
        /// error.
        #[test]
        fn the_fast_path_reads_every_body_as_serde_does(body in body_strategy()) {
            prop_assert_eq!(fast(body.as_bytes()), slow(body.as_bytes()), "{}", body);
        }

        /// Any bytes: no panic, and the same reading as serde's.
        #[test]
        fn any_bytes_read_as_serde_reads_them(body in prop::collection::vec(any::<u8>(), 0..64)) {
            prop_assert_eq!(fast(&body), slow(&body));
        }

        /// A body cut short anywhere reads as serde reads it.
        #[test]
        fn a_truncated_body_reads_as_serde_does(body in body_strategy(), cut in any::<prop::sample::Index>()) {
            let bytes = body.as_bytes();
            let cut = &bytes[..cut.index(bytes.len() + 1)];
            prop_assert_eq!(fast(cut), slow(cut));
        }
    }
}
