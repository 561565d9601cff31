//! Our encoder against the decoder, and the checks on decoded heads.

use super::*;

fn map(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut m = HeaderMap::new();
    for (k, v) in pairs {
        m.append(*k, HeaderValue::from_str(v).expect("value"));
    }
    m
}

#[test]
fn requests_and_responses_round_trip() {
    let mut enc = Encoder::default();
    let mut dec = Decoder::default();
    let long = "x".repeat(300);
    let headers =
        map(&[("baggage", "k8s.namespace.name=ns"), ("forwarded", "for=\"10.0.0.1:5\""), ("x-long", &long)]);
    let mut block = Vec::new();
    enc.connect(&mut block, "10.0.0.2:8080", &headers);
    assert_eq!(block[0], 0x20, "the first block restates the table size");
    let head = dec.decode(&block, 64 * 1024).expect("decodes");
    assert_eq!(head.method.as_deref(), Some("CONNECT"));
    assert_eq!(head.authority.as_deref(), Some("10.0.0.2:8080"));
    assert_eq!(head.headers, headers);
    // Later blocks carry no size update.
    let mut again = Vec::new();
    enc.connect(&mut again, "[fd00::1]:80", &HeaderMap::new());
    assert_ne!(again[0], 0x20);
    assert_eq!(dec.decode(&again, 64 * 1024).expect("decodes").authority.as_deref(), Some("[fd00::1]:80"));
    enc.table_size_changed();
    for status in [200u16, 401, 503, 100] {
        let mut block = Vec::new();
        enc.response(&mut block, status, &map(&[("baggage", "a=b")]));
        let head = dec.decode(&block, 64 * 1024).expect("decodes");
        assert_eq!(head.status, Some(status));
        assert_eq!(head.headers, map(&[("baggage", "a=b")]));
    }
}

#[test]
fn integers_cross_their_prefix() {
    for n in [0usize, 14, 15, 16, 126, 127, 128, 255, 16_383, 16_384, 100_000] {
        let mut out = Vec::new();
        int(&mut out, 4, 0x00, n);
        let mut v = out[0] as usize & 0x0f;
        if v == 15 {
            let mut shift = 0;
            for b in &out[1..] {
                v += (*b as usize & 0x7f) << shift;
                shift += 7;
            }
        }
        assert_eq!(v, n, "{out:?}");
    }
}

#[test]
fn heads_that_break_the_rules_are_refused() {
    let lit = |name: &[u8], value: &[u8]| {
        let mut b = vec![0u8];
        string(&mut b, name);
        string(&mut b, value);
        b
    };
    let decode = |block: Vec<u8>| Decoder::default().decode(&block, 4096);
    assert_eq!(decode(lit(b"Upper", b"x")).err(), Some(HeaderError::Malformed("uppercase field name")));
    assert_eq!(
        decode(lit(b"connection", b"close")).err(),
        Some(HeaderError::Malformed("connection-specific field"))
    );
    assert_eq!(decode(lit(b"te", b"gzip")).err(), Some(HeaderError::Malformed("connection-specific field")));
    assert!(decode(lit(b"te", b"trailers")).is_ok());
    let mut after = lit(b"a", b"b");
    after.extend(lit(b":method", b"CONNECT"));
    assert_eq!(decode(after).err(), Some(HeaderError::Malformed("pseudo-header after a regular field")));
    let mut twice = lit(b":authority", b"a:1");
    twice.extend(lit(b":authority", b"b:1"));
    assert_eq!(decode(twice).err(), Some(HeaderError::Malformed("repeated pseudo-header")));
    assert_eq!(decode(lit(b":status", b"20")).err(), Some(HeaderError::Malformed(":status")));
    assert_eq!(decode(lit(b":nope", b"x")).err(), Some(HeaderError::Malformed("unknown pseudo-header")));
    assert_eq!(decode(lit(b"x", &[b'a'; 5000])).err(), Some(HeaderError::TooLarge(4096)));
    // An index past both tables breaks the compression state: a connection error.
    assert!(matches!(decode(vec![0xff, 0x7f]), Err(HeaderError::Compression(_))));
    // A size update above our table size too.
    assert!(matches!(decode(vec![0x3f, 0xe2, 0x1f]), Err(HeaderError::Compression(_))));
}

#[test]
fn a_refused_head_still_updates_the_table() {
    // The peer indexes a field in a block we refuse; its next block refers to it.
    let mut dec = Decoder::default();
    let mut first = vec![0x40u8];
    string(&mut first, b"x-indexed");
    string(&mut first, &[b'v'; 100]);
    let mut big = vec![0u8];
    string(&mut big, b"x-big");
    string(&mut big, &[b'b'; 500]);
    first.extend(big);
    assert_eq!(dec.decode(&first, 400).err(), Some(HeaderError::TooLarge(400)));
    // Dynamic index 62 is the field the refused block added.
    let head = dec.decode(&[0x80 | 62], 4096).expect("the table has the field");
    assert_eq!(head.headers.get("x-indexed").map(|v| v.len()), Some(100));
}
