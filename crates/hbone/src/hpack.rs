//! Header blocks (RFC 7541 over RFC 9113 §8): our encoder, and the peer's blocks decoded with
//! `loona-hpack` into a checked request or response head.
//!
//! The encoder never adds to the decoder's dynamic table: every field is a static-table
//! reference or a literal "without indexing". So it needs no table of its own, and it opens its
//! first block (and the first after the peer changes SETTINGS_HEADER_TABLE_SIZE) with a table size
//! update to 0, which every decoder accepts. HBONE's header blocks are a handful of short fields
//! sent once per tunnel, where indexing would save little.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, HeaderValue};

/// Our SETTINGS_HEADER_TABLE_SIZE (the protocol default; never advertised otherwise).
pub const TABLE_SIZE: usize = 4096;

/// Static table indices (RFC 7541 Appendix A).
const IDX_AUTHORITY: usize = 1;
const IDX_METHOD: usize = 2;
const IDX_STATUS: usize = 8;
const IDX_STATUS_200: usize = 8;

/// Writes header blocks.
#[derive(Debug)]
pub struct Encoder {
    size_update: bool,
}

impl Default for Encoder {
    fn default() -> Encoder {
        Encoder { size_update: true }
    }
}

impl Encoder {
    /// The peer changed SETTINGS_HEADER_TABLE_SIZE: the next block restates our table size (0).
    pub fn table_size_changed(&mut self) {
        self.size_update = true;
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        if std::mem::take(&mut self.size_update) {
            int(out, 5, 0x20, 0);
        }
    }

    /// A CONNECT request to `authority` with `headers`.
    pub fn connect(&mut self, out: &mut Vec<u8>, authority: &str, headers: &HeaderMap) {
        self.start(out);
        literal_indexed_name(out, IDX_METHOD, b"CONNECT");
        literal_indexed_name(out, IDX_AUTHORITY, authority.as_bytes());
        fields(out, headers);
    }

    /// A response with `status` and `headers`.
    pub fn response(&mut self, out: &mut Vec<u8>, status: u16, headers: &HeaderMap) {
        self.start(out);
        if status == 200 {
            int(out, 7, 0x80, IDX_STATUS_200);
        } else {
            let digits = [
                b'0' + (status / 100 % 10) as u8,
                b'0' + (status / 10 % 10) as u8,
                b'0' + (status % 10) as u8,
            ];
            literal_indexed_name(out, IDX_STATUS, &digits);
        }
        fields(out, headers);
    }
}

fn fields(out: &mut Vec<u8>, headers: &HeaderMap) {
    for (name, value) in headers {
        // Literal without indexing, new name (RFC 7541 §6.2.2).
        out.push(0);
        string(out, name.as_str().as_bytes());
        string(out, value.as_bytes());
    }
}

fn literal_indexed_name(out: &mut Vec<u8>, index: usize, value: &[u8]) {
    int(out, 4, 0x00, index);
    string(out, value);
}

/// An integer with an `n`-bit prefix after the `first` pattern bits (RFC 7541 §5.1).
fn int(out: &mut Vec<u8>, n: u8, first: u8, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// A string literal, not Huffman-coded (RFC 7541 §5.2).
fn string(out: &mut Vec<u8>, s: &[u8]) {
    int(out, 7, 0x00, s.len());
    out.extend_from_slice(s);
}

/// Why a header block was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The block does not decode: the connection's compression state is lost.
    #[error("header block does not decode: {0}")]
    Compression(String),
    /// The decoded list is larger than we accept.
    #[error("header list larger than {0} bytes")]
    TooLarge(usize),
    /// A field HTTP/2 forbids, or pseudo-headers out of order or repeated.
    #[error("malformed header block: {0}")]
    Malformed(&'static str),
}

/// A decoded request or response head.
#[derive(Debug, Default, Clone)]
pub struct Decoded {
    /// `:method`.
    pub method: Option<String>,
    /// `:authority`.
    pub authority: Option<String>,
    /// `:scheme`.
    pub scheme: Option<String>,
    /// `:path`.
    pub path: Option<String>,
    /// `:protocol` (extended CONNECT).
    pub protocol: Option<String>,
    /// `:status`.
    pub status: Option<u16>,
    /// Regular fields.
    pub headers: HeaderMap,
}

impl Decoded {
    /// Checks a request head against RFC 9113 §8.3.1 and §8.5: `:method` present, no `:status`;
    /// a CONNECT names `:authority` and carries neither `:scheme` nor `:path`; any other method
    /// carries `:scheme` and a non-empty `:path`; `:protocol` (extended CONNECT, RFC 8441) only
    /// after SETTINGS_ENABLE_CONNECT_PROTOCOL, which HBONE never sends.
    pub fn check_request(&self) -> Result<(), HeaderError> {
        if self.status.is_some() {
            return Err(HeaderError::Malformed(":status in a request"));
        }
        if self.protocol.is_some() {
            return Err(HeaderError::Malformed(":protocol without SETTINGS_ENABLE_CONNECT_PROTOCOL"));
        }
        match self.method.as_deref() {
            None => Err(HeaderError::Malformed("request without :method")),
            Some("CONNECT") => {
                if self.scheme.is_some() || self.path.is_some() {
                    return Err(HeaderError::Malformed(":scheme or :path in a CONNECT request"));
                }
                if self.authority.as_deref().is_none_or(str::is_empty) {
                    return Err(HeaderError::Malformed("CONNECT without :authority"));
                }
                Ok(())
            }
            Some(_) => {
                if self.scheme.is_none() || self.path.as_deref().is_none_or(str::is_empty) {
                    return Err(HeaderError::Malformed("request without :scheme or :path"));
                }
                Ok(())
            }
        }
    }

    /// Checks a response head (RFC 9113 §8.3.2): `:status` and no request pseudo-header.
    pub fn check_response(&self) -> Result<(), HeaderError> {
        if self.has_request_pseudo() {
            return Err(HeaderError::Malformed("request pseudo-header in a response"));
        }
        if self.status.is_none() {
            return Err(HeaderError::Malformed("response without :status"));
        }
        Ok(())
    }

    /// Checks trailers (RFC 9113 §8.1): no pseudo-header.
    pub fn check_trailers(&self) -> Result<(), HeaderError> {
        if self.has_request_pseudo() || self.status.is_some() {
            return Err(HeaderError::Malformed("pseudo-header in trailers"));
        }
        Ok(())
    }

    fn has_request_pseudo(&self) -> bool {
        self.method.is_some()
            || self.authority.is_some()
            || self.scheme.is_some()
            || self.path.is_some()
            || self.protocol.is_some()
    }
}

/// Reads the peer's header blocks; one per connection (the dynamic table is its state).
pub struct Decoder {
    inner: loona_hpack::Decoder<'static>,
}

impl Default for Decoder {
    fn default() -> Decoder {
        let mut inner = loona_hpack::Decoder::new();
        inner.set_max_allowed_table_size(TABLE_SIZE);
        Decoder { inner }
    }
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder").finish_non_exhaustive()
    }
}

impl Decoder {
    /// Decodes one whole block. The block is always decoded to its end (the table must follow
    /// the peer's), even when the head is refused; a [`HeaderError::Compression`] is a
    /// connection error, the others refuse only this stream.
    pub fn decode(&mut self, block: &[u8], max_list: usize) -> Result<Decoded, HeaderError> {
        let mut head = Decoded::default();
        let mut size = 0usize;
        let mut problem: Option<HeaderError> = None;
        let mut regular = false;
        self.inner
            .decode_with_cb(block, |name, value| {
                if problem.is_some() {
                    return;
                }
                size = size.saturating_add(name.len() + value.len() + 32);
                if size > max_list {
                    problem = Some(HeaderError::TooLarge(max_list));
                    return;
                }
                if let Err(e) = field(&mut head, &mut regular, name, value) {
                    problem = Some(e);
                }
            })
            .map_err(|e| HeaderError::Compression(e.to_string()))?;
        match problem {
            Some(e) => Err(e),
            None => Ok(head),
        }
    }
}

fn field(
    head: &mut Decoded,
    regular: &mut bool,
    name: Cow<'_, [u8]>,
    value: Cow<'_, [u8]>,
) -> Result<(), HeaderError> {
    if let Some(pseudo) = name.strip_prefix(b":") {
        if *regular {
            return Err(HeaderError::Malformed("pseudo-header after a regular field"));
        }
        let text = || {
            String::from_utf8(value.to_vec()).map_err(|_| HeaderError::Malformed("pseudo-header not UTF-8"))
        };
        let slot = match pseudo {
            b"method" => &mut head.method,
            b"authority" => &mut head.authority,
            b"scheme" => &mut head.scheme,
            b"path" => &mut head.path,
            b"protocol" => &mut head.protocol,
            b"status" => {
                if head.status.is_some() {
                    return Err(HeaderError::Malformed("repeated :status"));
                }
                let s = std::str::from_utf8(&value)
                    .ok()
                    .filter(|s| s.len() == 3)
                    .and_then(|s| s.parse::<u16>().ok())
                    .filter(|s| (100..600).contains(s))
                    .ok_or(HeaderError::Malformed(":status"))?;
                head.status = Some(s);
                return Ok(());
            }
            _ => return Err(HeaderError::Malformed("unknown pseudo-header")),
        };
        if slot.is_some() {
            return Err(HeaderError::Malformed("repeated pseudo-header"));
        }
        *slot = Some(text()?);
        return Ok(());
    }
    *regular = true;
    if name.iter().any(u8::is_ascii_uppercase) {
        return Err(HeaderError::Malformed("uppercase field name"));
    }
    let name = HeaderName::from_bytes(&name).map_err(|_| HeaderError::Malformed("invalid field name"))?;
    // Connection-specific fields are malformed in HTTP/2 (RFC 9113 §8.2.2).
    let connection_specific = [
        http::header::CONNECTION,
        http::header::TRANSFER_ENCODING,
        http::header::UPGRADE,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ];
    if connection_specific.contains(&name) || (name == http::header::TE && value.as_ref() != b"trailers") {
        return Err(HeaderError::Malformed("connection-specific field"));
    }
    let value = HeaderValue::from_bytes(&value).map_err(|_| HeaderError::Malformed("invalid field value"))?;
    head.headers.append(name, value);
    Ok(())
}

#[cfg(test)]
mod tests;
