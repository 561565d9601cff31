//! What an HBONE peer sends once TLS is up: HTTP/2 frames (split at any point, as TLS records
//! and reads split them) through the server's or the client's protocol machinery: frame reader,
//! header blocks (HPACK), settings, windows, stream states and the flood limits. Nothing the peer
//! sends may panic; a connection error stops the input, as it ends a connection.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ambit_hbone::fuzzing::plaintext(data);
});
