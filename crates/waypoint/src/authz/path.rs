//! Request path normalization before path matching, as Istio's default `pathNormalization: BASE`.
//!
//! BASE is Envoy's `normalize_path: true` with nothing else: no slash merging, and
//! `path_with_escaped_slashes_action` left at Envoy's default `KEEP_UNCHANGED`, so `%2F` and `%5C`
//! stay as written (in either hex case) and never separate segments (Istio docs, "Authorization
//! Policy Normalization": decoding them needs `DECODE_AND_MERGE_SLASHES`). Envoy normalizes with
//! its copy of Chromium's `url::CanonicalizePath` (`source/common/chromium_url/url_canon_path.cc`,
//! called from `PathUtil::canonicalPath`); this follows it byte class by byte class:
//! * the query (from the first `?`) is not part of the path (RBAC matches the path without it);
//! * `/` and `\` both end a segment, and every separator is written `/`;
//! * `%XX` of an unreserved character (`A-Z a-z 0-9 - . _ ~`) is decoded once, never twice; any
//!   other valid `%XX` is kept with its hex case as written;
//! * `.` and `..` segments (also spelled `%2e`, `%2E`) are removed as RFC 3986 §5.2.4 says,
//!   `..` never climbing above the root; a path not starting with a separator gets a `/`;
//! * control characters, space, `"`, `#`, `<`, `>`, `^`, `` ` ``, `{`, `|`, `}`, DEL and every
//!   byte above 0x7F are percent-encoded (upper-case hex);
//! * NUL, raw or as `%00`, makes the request invalid (Envoy answers 400).
//!
//! One deliberate difference: Chromium passes a `%` that does not start a valid escape
//! (`%zz`, `%4`, a trailing `%`) through unchanged. That makes normalization not idempotent
//! (`/%%32%65` becomes `/%2e`, which a second decoder reads as `.`), so a backend that decodes
//! again could see a different path than the policy did. RFC 3986 §2.1 allows `%` only as the
//! start of `%HH`, so such paths are refused here instead, like NUL.

use thiserror::Error;

/// Why a request path cannot be normalized; the request is answered 400 Bad Request.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PathError {
    /// A NUL byte, raw or percent-encoded (`%00`).
    #[error("request path has a NUL character (raw or %00) at byte {at}; such requests are refused")]
    Nul {
        /// Byte offset in the raw path.
        at: usize,
    },
    /// A `%` not followed by two hex digits.
    #[error("request path has an invalid percent escape at byte {at} (a '%' must start %HH)")]
    InvalidEscape {
        /// Byte offset of the `%` in the raw path.
        at: usize,
    },
}

/// Normalizes a raw `:path` (with or without a query) into the path policies match against.
pub fn normalize_path(raw: &str) -> Result<String, PathError> {
    let path = raw.split('?').next().unwrap_or_default().as_bytes();
    let mut out = String::with_capacity(path.len() + 1);
    out.push('/');
    let mut pieces: Vec<(usize, &[u8])> = Vec::new();
    let mut start = 0;
    for (i, &b) in path.iter().enumerate() {
        if is_separator(b) {
            pieces.push((start, &path[start..i]));
            start = i + 1;
        }
    }
    pieces.push((start, &path[start..]));
    // A leading separator is the root `out` already holds, not an empty first segment.
    let skip = usize::from(path.first().is_some_and(|&b| is_separator(b)));
    let last = pieces.len() - 1;
    let mut segment = String::new();
    for (index, &(offset, piece)) in pieces.iter().enumerate().skip(skip) {
        segment.clear();
        canonical_segment(piece, offset, &mut segment)?;
        match segment.as_str() {
            // The current directory: nothing is written, and its separator is consumed.
            "." => {}
            ".." => up_one(&mut out),
            _ => {
                out.push_str(&segment);
                if index != last {
                    out.push('/');
                }
            }
        }
    }
    Ok(out)
}

/// What Chromium's path table does with one byte, written or decoded from `%XX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Kept as is.
    Pass,
    /// Unreserved: written plain, also when it arrived percent-encoded.
    Unescape,
    /// Percent-encoded in the output.
    Escape,
    /// Makes the path invalid.
    Invalid,
}

fn class(b: u8) -> Class {
    match b {
        0 => Class::Invalid,
        b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => Class::Unescape,
        0x01..=0x20 | b'"' | b'#' | b'%' | b'<' | b'>' | b'?' | b'\\' | b'^' | b'`' | b'{' | b'|' | b'}' => {
            Class::Escape
        }
        0x7f..=0xff => Class::Escape,
        _ => Class::Pass,
    }
}

fn is_separator(b: u8) -> bool {
    b == b'/' || b == b'\\'
}

/// Appends the canonical form of one segment's bytes; `offset` places errors in the raw path.
fn canonical_segment(piece: &[u8], offset: usize, out: &mut String) -> Result<(), PathError> {
    let mut i = 0;
    while i < piece.len() {
        let b = piece[i];
        if b == b'%' {
            let at = offset + i;
            let (Some(hi), Some(lo)) = (piece.get(i + 1), piece.get(i + 2)) else {
                return Err(PathError::InvalidEscape { at });
            };
            let (Some(h), Some(l)) = (hex(*hi), hex(*lo)) else {
                return Err(PathError::InvalidEscape { at });
            };
            let decoded = h << 4 | l;
            match class(decoded) {
                Class::Invalid => return Err(PathError::Nul { at }),
                Class::Unescape => out.push(char::from(decoded)),
                // Kept escaped with the hex case as written: a backend may care about it.
                Class::Pass | Class::Escape => {
                    out.push('%');
                    out.push(char::from(*hi));
                    out.push(char::from(*lo));
                }
            }
            i += 3;
            continue;
        }
        match class(b) {
            Class::Invalid => return Err(PathError::Nul { at: offset + i }),
            Class::Pass | Class::Unescape => out.push(char::from(b)),
            Class::Escape => {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                out.push('%');
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 0x0f)]));
            }
        }
        i += 1;
    }
    Ok(())
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Removes the last segment of `out` (which ends with `/`), never the root.
fn up_one(out: &mut String) {
    if out.len() > 1 {
        let keep = out[..out.len() - 1].rfind('/').map_or(1, |slash| slash + 1);
        out.truncate(keep);
    }
}

#[cfg(test)]
#[path = "path_tests.rs"]
mod tests;
