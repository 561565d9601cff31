//! The process-wide subscriber that `ambit proxy`, `ambit agent` and `ambit control` install
//! at start is the one `/logging` changes (its own binary: it installs the global subscriber).

#![allow(clippy::unwrap_used)]

use ambit_admin::logging;

#[test]
fn the_installed_filter_is_reloadable_through_the_global_control() {
    assert!(logging::control().is_none(), "nothing installed yet");
    // A RUST_LOG that does not parse falls back to `info`, as before.
    logging::init("ambit_proxy=[", false);
    let logs = logging::control().expect("init installs a reloadable filter");
    assert_eq!(logs.current(), Ok("info".to_owned()));
    assert_eq!(logs.set(false, "ambit_proxy::dns:trace"), Ok("ambit_proxy::dns=trace,info".to_owned()));
    assert!(tracing::enabled!(target: "ambit_proxy::dns", tracing::Level::TRACE));
    assert!(!tracing::enabled!(target: "ambit_proxy::inbound", tracing::Level::DEBUG));
    assert_eq!(logs.set(true, ""), Ok("info".to_owned()));
    assert!(!tracing::enabled!(target: "ambit_proxy::dns", tracing::Level::DEBUG));
    // A second init (the binary calls it once) leaves the first in place.
    logging::init("debug", true);
    assert_eq!(logging::control().unwrap().current(), Ok("info".to_owned()));
}
