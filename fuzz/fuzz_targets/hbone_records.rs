//! What an HBONE peer's records hold once decrypted: content types, alerts, padding, size
//! limits, the limits on empty records, warnings and KeyUpdates, and post-handshake messages
//! split over records anywhere, through a server's receiving half of the record layer (sealed
//! with a fixed key, so every record opens). Nothing may panic; an error stops the input, as it
//! ends a connection.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ambit_hbone::fuzzing::records(data);
});
