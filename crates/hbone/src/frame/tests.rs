//! Frame headers, the writers, settings, and the streaming reader fed at every split point.

use super::*;

/// All events of `input` fed in pieces of `step` bytes, DATA pieces joined per frame.
fn events(input: &[u8], step: usize) -> Result<Vec<String>, FrameError> {
    let mut r = Reader::new(1 << 20, 64 * 1024);
    let mut out = Vec::new();
    let mut data: Vec<u8> = Vec::new();
    for piece in input.chunks(step.max(1)) {
        let mut piece = piece;
        while let Some(ev) = r.next(&mut piece) {
            match ev? {
                Event::DataStart { stream, flow } => out.push(format!("data-start {stream} {flow}")),
                Event::Data { bytes, .. } => data.extend_from_slice(bytes),
                Event::DataEnd { stream, undelivered, end_stream } => {
                    out.push(format!(
                        "data {stream} {:?} undelivered {undelivered} end {end_stream}",
                        String::from_utf8_lossy(&data)
                    ));
                    data.clear();
                }
                Event::Frame(h, p) => {
                    out.push(format!("frame {} {:#x} {} {:?}", h.kind, h.flags, h.stream, p))
                }
            }
        }
    }
    assert!(r.at_boundary(), "input ended inside a frame");
    Ok(out)
}

fn data_frame(stream: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8; HEADER_LEN];
    Head { len: payload.len() as u32, kind: kind::DATA, flags, stream }.encode(&mut v);
    v.extend_from_slice(payload);
    v
}

#[test]
fn header_roundtrip_clears_the_reserved_bit() {
    let h = Head { len: 0x12_3456, kind: 7, flags: 0x25, stream: 0x7fff_fffe };
    let mut b = [0u8; HEADER_LEN];
    h.encode(&mut b);
    assert_eq!(b, [0x12, 0x34, 0x56, 7, 0x25, 0x7f, 0xff, 0xff, 0xfe]);
    assert_eq!(Head::parse(&b), h);
    b[5] |= 0x80;
    assert_eq!(Head::parse(&b).stream, 0x7fff_fffe);
}

#[test]
fn the_reader_gives_the_same_events_at_every_split() {
    let mut input = Vec::new();
    settings(&mut input, &[(setting::INITIAL_WINDOW_SIZE, 1 << 20), (setting::MAX_FRAME_SIZE, 1 << 20)]);
    input.extend(data_frame(1, 0, b"hello"));
    // Padded: pad length 3, "abc", 3 bytes of padding; END_STREAM.
    input.extend(data_frame(1, flag::PADDED | flag::END_STREAM, b"\x03abc\0\0\0"));
    ping(&mut input, *b"12345678", false);
    input.extend(data_frame(3, 0, b""));
    // An unknown frame type is skipped whole.
    let mut unknown = vec![0u8; HEADER_LEN];
    Head { len: 4, kind: 0xfa, flags: 0, stream: 0 }.encode(&mut unknown);
    unknown.extend_from_slice(b"skip");
    input.extend(unknown);
    goaway(&mut input, 5, Reason::ENHANCE_YOUR_CALM);
    let want = events(&input, input.len()).expect("whole");
    assert_eq!(
        want,
        vec![
            "frame 4 0x0 0 [0, 4, 0, 16, 0, 0, 0, 5, 0, 16, 0, 0]".to_owned(),
            "data-start 1 5".into(),
            "data 1 \"hello\" undelivered 0 end false".into(),
            "data-start 1 7".into(),
            "data 1 \"abc\" undelivered 4 end true".into(),
            "frame 6 0x0 0 [49, 50, 51, 52, 53, 54, 55, 56]".into(),
            "data-start 3 0".into(),
            "data 3 \"\" undelivered 0 end false".into(),
            "frame 250 0x0 0 []".into(),
            "frame 7 0x0 0 [0, 0, 0, 5, 0, 0, 0, 11]".into(),
        ]
    );
    for step in 1..input.len() {
        assert_eq!(events(&input, step).expect("split"), want, "split every {step} bytes");
    }
}

#[test]
fn the_reader_refuses_what_breaks_the_protocol() {
    let err = |input: Vec<u8>| {
        let mut r = Reader::new(DEFAULT_MAX_FRAME, 32 * 1024);
        let mut slice = input.as_slice();
        loop {
            match r.next(&mut slice) {
                Some(Err(e)) => return Some(e),
                Some(Ok(_)) => {}
                None => return None,
            }
        }
    };
    let mut big = vec![0u8; HEADER_LEN];
    Head { len: DEFAULT_MAX_FRAME + 1, kind: kind::DATA, flags: 0, stream: 1 }.encode(&mut big);
    assert_eq!(
        err(big),
        Some(FrameError {
            reason: Reason::FRAME_SIZE_ERROR,
            what: "frame larger than SETTINGS_MAX_FRAME_SIZE"
        })
    );
    assert_eq!(
        err(data_frame(0, 0, b"x")),
        Some(FrameError { reason: Reason::PROTOCOL_ERROR, what: "DATA on stream 0" })
    );
    assert_eq!(
        err(data_frame(1, flag::PADDED, b"\x03ab")),
        Some(FrameError { reason: Reason::PROTOCOL_ERROR, what: "DATA padding as long as the frame" })
    );
    assert_eq!(
        err(data_frame(1, flag::PADDED, b"")),
        Some(FrameError { reason: Reason::FRAME_SIZE_ERROR, what: "padded DATA without a pad length" })
    );
    // A SETTINGS frame past what a connection buffers for control frames.
    let mut s = vec![0u8; HEADER_LEN];
    Head { len: 16 * 1024 + 6, kind: kind::SETTINGS, flags: 0, stream: 0 }.encode(&mut s);
    s.resize(HEADER_LEN + 16 * 1024 + 6, 0);
    let mut r = Reader::new(1 << 20, 32 * 1024);
    let mut slice = s.as_slice();
    assert_eq!(
        r.next(&mut slice),
        Some(Err(FrameError {
            reason: Reason::FRAME_SIZE_ERROR,
            what: "frame larger than this connection buffers"
        }))
    );
    // A header block fragment up to the block limit is kept whole.
    let mut h = Vec::new();
    headers(&mut h, 1, &vec![0x82; 30 * 1024], false, 1 << 20);
    let mut r = Reader::new(1 << 20, 32 * 1024);
    let mut slice = h.as_slice();
    assert!(
        matches!(r.next(&mut slice), Some(Ok(Event::Frame(head, p))) if head.kind == kind::HEADERS && p.len() == 30 * 1024)
    );
    // A GOAWAY's debug data past the control bound is dropped, not refused.
    let mut g = vec![0u8; HEADER_LEN];
    Head { len: 8 + 40_000, kind: kind::GOAWAY, flags: 0, stream: 0 }.encode(&mut g);
    g.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0]);
    g.resize(HEADER_LEN + 8 + 40_000, b'x');
    let mut r = Reader::new(1 << 20, 32 * 1024);
    let mut slice = g.as_slice();
    assert!(
        matches!(r.next(&mut slice), Some(Ok(Event::Frame(head, p))) if head.kind == kind::GOAWAY && p.len() == 16 * 1024)
    );
}

#[test]
fn header_blocks_split_into_continuation_frames() {
    let block: Vec<u8> = (0..40u8).collect();
    let mut out = Vec::new();
    headers(&mut out, 3, &block, true, 16);
    let mut r = Reader::new(1 << 20, 1 << 16);
    let mut slice = out.as_slice();
    let mut frames = Vec::new();
    while let Some(ev) = r.next(&mut slice) {
        let Ok(Event::Frame(h, p)) = ev else { panic!("{ev:?}") };
        frames.push((h.kind, h.flags, h.stream, p.to_vec()));
    }
    assert_eq!(
        frames,
        vec![
            (kind::HEADERS, flag::END_STREAM, 3, block[..16].to_vec()),
            (kind::CONTINUATION, 0, 3, block[16..32].to_vec()),
            (kind::CONTINUATION, flag::END_HEADERS, 3, block[32..].to_vec()),
        ]
    );
    let mut one = Vec::new();
    headers(&mut one, 5, &block, false, 1 << 14);
    assert_eq!(one[4], flag::END_HEADERS);
    assert_eq!(one.len(), HEADER_LEN + block.len());
}

#[test]
fn settings_are_checked() {
    let entry = |id: u16, v: u32| {
        let mut e = id.to_be_bytes().to_vec();
        e.extend_from_slice(&v.to_be_bytes());
        e
    };
    assert_eq!(parse_settings(&[0; 5]), Err(Reason::FRAME_SIZE_ERROR));
    assert_eq!(parse_settings(&entry(setting::ENABLE_PUSH, 2)), Err(Reason::PROTOCOL_ERROR));
    assert_eq!(
        parse_settings(&entry(setting::INITIAL_WINDOW_SIZE, 1 << 31)),
        Err(Reason::FLOW_CONTROL_ERROR)
    );
    assert_eq!(parse_settings(&entry(setting::MAX_FRAME_SIZE, 16_383)), Err(Reason::PROTOCOL_ERROR));
    assert_eq!(parse_settings(&entry(setting::MAX_FRAME_SIZE, 1 << 24)), Err(Reason::PROTOCOL_ERROR));
    let mut ok = entry(setting::MAX_FRAME_SIZE, (1 << 24) - 1);
    ok.extend(entry(0x99, 7));
    ok.extend(entry(setting::INITIAL_WINDOW_SIZE, (1 << 31) - 1));
    assert_eq!(
        parse_settings(&ok),
        Ok(vec![(setting::MAX_FRAME_SIZE, (1 << 24) - 1), (setting::INITIAL_WINDOW_SIZE, (1 << 31) - 1)])
    );
}

#[test]
fn reasons_print_their_names() {
    assert_eq!(Reason::ENHANCE_YOUR_CALM.to_string(), "ENHANCE_YOUR_CALM");
    assert_eq!(Reason(0x42).to_string(), "unknown error code 0x42");
}

/// Point 4: the buffer a large frame grew goes back once the frame is handled, so a peer that
/// sent one large HEADERS frame does not leave its connection holding it.
#[test]
fn a_large_frames_buffer_is_given_back() {
    let mut r = Reader::new(1 << 20, 256 * 1024);
    let mut input = Vec::new();
    let mut big = vec![0u8; HEADER_LEN];
    Head { len: 200 * 1024, kind: kind::HEADERS, flags: flag::END_HEADERS, stream: 1 }.encode(&mut big);
    big.resize(HEADER_LEN + 200 * 1024, 7);
    input.extend_from_slice(&big);
    ping(&mut input, [1; 8], false);
    let mut rest = &input[..];
    let Some(Ok(Event::Frame(h, p))) = r.next(&mut rest) else { panic!("the HEADERS frame") };
    assert_eq!((h.kind, p.len()), (kind::HEADERS, 200 * 1024));
    let Some(Ok(Event::Frame(h, _))) = r.next(&mut rest) else { panic!("the PING") };
    assert_eq!(h.kind, kind::PING);
    assert!(r.payload.capacity() <= MAX_KEPT_PAYLOAD, "kept {} bytes", r.payload.capacity());
}
