use super::*;
use proptest::prelude::*;

#[test]
fn normalizes_as_envoy_does_with_base() {
    let cases = [
        // Already normal.
        ("/", "/"),
        ("/xyz", "/xyz"),
        ("/x/y/z", "/x/y/z"),
        ("/A/B/C", "/A/B/C"),
        // Dot segments (RFC 3986 §5.2.4), never above the root.
        ("/a/../b", "/b"),
        ("/a/./b", "/a/b"),
        ("/a/b/../../../../c", "/c"),
        ("/../a/b", "/a/b"),
        ("/./a/b", "/a/b"),
        ("/a/b/..", "/a/"),
        ("/a/b/.", "/a/b/"),
        ("..", "/"),
        ("a/b/../c", "/a/c"),
        ("", "/"),
        // Dots spelled as escapes, in either case, and mixed.
        ("/a/b/%2e%2e/c", "/a/c"),
        ("/a/b/%2E%2E/c", "/a/c"),
        ("/a/b/%2E./c", "/a/c"),
        ("/a/b/%2E/c", "/a/b/c"),
        ("/a/%2e%2e", "/"),
        // Dots inside a name are not segments.
        ("/a/..b/c", "/a/..b/c"),
        ("/a/b../c", "/a/b../c"),
        ("/a/...", "/a/..."),
        // No slash merging in BASE.
        ("//", "//"),
        ("/a//b", "/a//b"),
        ("//a/b/", "//a/b/"),
        ("/a//..", "/a/"),
        // Backslash is a separator, written `/`.
        ("/a/..\\c", "/c"),
        ("\\a\\b", "/a/b"),
        // Escaped slashes stay as written and separate nothing.
        ("/a/%2F%2f/c", "/a/%2F%2f/c"),
        ("/a%2F..%2Fb", "/a%2F..%2Fb"),
        ("/a/..%2fb", "/a/..%2fb"),
        ("/%5c%25", "/%5c%25"),
        ("/a%5C../b", "/a%5C../b"),
        // Unreserved escapes are decoded once.
        ("/some/%61%62%63", "/some/abc"),
        ("/%41%5a%30%39%2d%5f%7e", "/AZ09-_~"),
        ("/%2541", "/%2541"),
        ("/%c0%af", "/%c0%af"),
        // Characters a path may not hold plainly are escaped, upper-case hex.
        ("/a b", "/a%20b"),
        ("/a\"<>^`{|}", "/a%22%3C%3E%5E%60%7B%7C%7D"),
        ("/a#b", "/a%23b"),
        ("/é", "/%C3%A9"),
        ("/a\u{7f}", "/a%7F"),
        // Characters a path may hold stay.
        ("/a:b@c!$&'()*+,;=[]", "/a:b@c!$&'()*+,;=[]"),
        // The query is not part of the path, and is not normalized.
        ("/a/../b?x=/../%zz", "/b"),
        ("/a?", "/a"),
        ("?x", "/"),
    ];
    for (raw, want) in cases {
        assert_eq!(normalize_path(raw), Ok(want.to_owned()), "raw path {raw:?}");
    }
}

#[test]
fn refuses_nul_and_invalid_escapes() {
    let cases = [
        ("/xyz/.%00../abc", PathError::Nul { at: 6 }),
        ("/xyz/%00.%00./abc", PathError::Nul { at: 5 }),
        ("/a\0b", PathError::Nul { at: 2 }),
        ("/xyz/AAAAA%%0000/abc", PathError::InvalidEscape { at: 10 }),
        ("/a%zz", PathError::InvalidEscape { at: 2 }),
        ("/a%4", PathError::InvalidEscape { at: 2 }),
        ("/a%", PathError::InvalidEscape { at: 2 }),
        ("/%%32%65", PathError::InvalidEscape { at: 1 }),
        ("/ok/b%g1/c", PathError::InvalidEscape { at: 5 }),
    ];
    for (raw, want) in cases {
        assert_eq!(normalize_path(raw), Err(want), "raw path {raw:?}");
    }
}

#[test]
fn errors_say_what_is_wrong() {
    assert_eq!(
        PathError::InvalidEscape { at: 3 }.to_string(),
        "request path has an invalid percent escape at byte 3 (a '%' must start %HH)"
    );
    assert_eq!(
        PathError::Nul { at: 1 }.to_string(),
        "request path has a NUL character (raw or %00) at byte 1; such requests are refused"
    );
}

proptest! {
    #[test]
    fn normalization_is_idempotent_and_total(raw in any::<String>()) {
        if let Ok(once) = normalize_path(&raw) {
            prop_assert!(once.starts_with('/'));
            prop_assert_eq!(normalize_path(&once), Ok(once.clone()));
        }
    }

    #[test]
    fn normalization_is_idempotent_on_path_like_input(
        raw in "[/\\\\.a%2eEfF5cC0?#]{0,24}",
    ) {
        if let Ok(once) = normalize_path(&raw) {
            prop_assert!(once.starts_with('/'));
            prop_assert!(!once.contains('\\'));
            prop_assert_eq!(normalize_path(&once), Ok(once.clone()));
        }
    }
}
