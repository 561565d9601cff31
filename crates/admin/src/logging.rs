//! Logging setup and the runtime log-level control behind the admin server's `/logging`
//! (`istioctl ztunnel-config log`).
//!
//! The filter is a `tracing-subscriber` [`EnvFilter`] behind a [`reload`] layer: `/logging`
//! swaps it without a restart. A change is appended to the current directives (a later directive
//! for the same target replaces the earlier one); `reset` goes back to the filter the process
//! started with (`RUST_LOG`).
//!
//! Lines go to stderr through [`writer::LogSink`]: buffered and written by a thread of their own,
//! so logging never makes a data-plane thread wait for its output. [`flush`] writes out what is
//! still buffered; the binary calls it before it exits.

pub mod writer;

use std::sync::{Mutex, OnceLock};

use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, reload};

/// Log levels `/logging` accepts (per module or for everything).
pub const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];

/// Usage of `/logging`, appended to every error it answers.
pub const HELP: &str = "usage: POST /logging\t\t\t\t\t\t(To list current level)
usage: POST /logging?level=<level>\t\t\t\t(To change global levels)
usage: POST /logging?level={mod1}:{level1},{mod2}:{level2}\t(To change specific mods' logging level)
usage: POST /logging?reset\t\t\t\t\t(To reset to the startup level, RUST_LOG)

hint: loglevel:\terror|warn|info|debug|trace|off
hint: mod_name:\tthe module name, i.e. ambit_proxy::dns
";

/// Most directives the filter may hold after a change (each one is checked for every new
/// callsite; modules added one request at a time could otherwise grow it without end).
pub const MAX_DIRECTIVES: usize = 128;

/// Why a level change was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LevelError {
    /// The `level` value is not `<level>` or `<mod>:<level>,…` with a known level.
    #[error("Invalid level provided: {0}")]
    Invalid(String),
    /// The change would leave more than [`MAX_DIRECTIVES`] directives.
    #[error("Failed to set new level: more than {MAX_DIRECTIVES} directives; use ?reset first")]
    TooMany,
    /// The resulting filter does not parse.
    #[error("Failed to set new level: {0}")]
    Filter(String),
    /// The subscriber that owned the filter is gone.
    #[error("Failed to set new level: the log filter is no longer installed")]
    Gone,
}

/// Changes the installed log filter at run time.
pub struct LogControl {
    handle: reload::Handle<EnvFilter, Registry>,
    /// The filter the process started with (`reset` returns to it).
    default: String,
    /// Serializes read-modify-write changes, so two concurrent requests cannot lose one.
    change: Mutex<()>,
}

static CONTROL: OnceLock<LogControl> = OnceLock::new();

/// The control of the process's filter, once [`init`] has installed it.
pub fn control() -> Option<&'static LogControl> {
    CONTROL.get()
}

/// Installs the process's subscriber: `filter` (EnvFilter syntax; `info` if it does not parse),
/// plain or JSON lines on stderr, reloadable through [`control`].
pub fn init(filter: &str, json: bool) {
    use std::io::IsTerminal;
    let default = if EnvFilter::try_new(filter).is_ok() { filter.to_owned() } else { "info".to_owned() };
    let (layer, handle) = reload::Layer::new(EnvFilter::new(&default));
    // Without a thread for the sink (thread limit reached), lines go to stderr directly.
    let sink = writer::LogSink::new(Box::new(std::io::stderr()), writer::MAX_PENDING).ok();
    let make = match &sink {
        Some(s) => BoxMakeWriter::new(s.clone()),
        None => BoxMakeWriter::new(std::io::stderr),
    };
    let fmt = tracing_subscriber::fmt::layer().with_writer(make).with_ansi(std::io::stderr().is_terminal());
    let installed = if json {
        let fmt = fmt.json().flatten_event(true).with_current_span(false);
        tracing_subscriber::registry().with(layer).with(fmt).try_init()
    } else {
        tracing_subscriber::registry().with(layer).with(fmt).try_init()
    };
    if installed.is_err() {
        if let Some(sink) = sink {
            sink.stop();
        }
        return;
    }
    if let Some(sink) = sink
        && SINK.set(sink).is_ok()
    {
        // A panic message comes after every line logged before it.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            flush();
            previous(info);
        }));
    }
    let _ = CONTROL.set(LogControl::new(handle, default));
}

static SINK: OnceLock<writer::LogSink> = OnceLock::new();

/// Writes out every line logged so far (the process calls this before it exits).
pub fn flush() {
    if let Some(sink) = SINK.get() {
        sink.flush();
    }
}

impl LogControl {
    /// A control over `handle`, whose startup filter is `default`.
    pub fn new(handle: reload::Handle<EnvFilter, Registry>, default: String) -> LogControl {
        LogControl { handle, default, change: Mutex::new(()) }
    }

    /// The filter in effect, as its directives.
    pub fn current(&self) -> Result<String, LevelError> {
        self.handle.with_current(|f| f.to_string()).map_err(|_| LevelError::Gone)
    }

    /// Applies `level` (`<level>` or `<mod>:<level>,…`, may be empty) on top of the current
    /// filter, or on top of the startup filter when `reset`. Returns the filter in effect.
    pub fn set(&self, reset: bool, level: &str) -> Result<String, LevelError> {
        if !level.is_empty() && !valid_level(level) {
            return Err(LevelError::Invalid(level.to_owned()));
        }
        let _guard = self.change.lock().unwrap_or_else(|p| p.into_inner());
        let base = if reset { self.default.clone() } else { self.current()? };
        let directives = match (base.is_empty(), level.is_empty()) {
            (_, true) => base,
            (true, false) => level.to_owned(),
            (false, false) => format!("{base},{}", to_directives(level)),
        };
        let filter = EnvFilter::try_new(&directives).map_err(|e| LevelError::Filter(e.to_string()))?;
        // Count what the filter keeps (a repeated module replaces its earlier directive).
        if filter.to_string().split(',').count() > MAX_DIRECTIVES {
            return Err(LevelError::TooMany);
        }
        self.handle.reload(filter).map_err(|_| LevelError::Gone)?;
        self.current()
    }
}

/// `level` as EnvFilter directives: `mod:lvl` becomes `mod=lvl`.
fn to_directives(level: &str) -> String {
    level
        .split(',')
        .map(|clause| match clause.rsplit_once(':') {
            Some((module, lvl)) => format!("{module}={lvl}"),
            None => clause.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `<level>` or a comma-separated list of `<level>` / `<module>:<level>` with a known level and a
/// module path made of Rust identifiers joined by `::`.
fn valid_level(level: &str) -> bool {
    level.split(',').all(|clause| {
        let (module, lvl) = match clause.rsplit_once(':') {
            Some((module, lvl)) => (Some(module), lvl),
            None => (None, clause),
        };
        let module_ok = module.is_none_or(|m| {
            !m.is_empty()
                && m.split("::").all(|part| {
                    !part.is_empty()
                        && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                })
        });
        module_ok && LEVELS.contains(&lvl.to_ascii_lowercase().as_str())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_validated() {
        for ok in ["debug", "OFF", "ambit_proxy::dns:debug", "access:warn,dns:trace,info", "a-b:info"] {
            assert!(valid_level(ok), "{ok}");
        }
        for bad in ["loud", "dns:", ":debug", "dns:loud", "a:::b:info", "dns=debug", "a b:info", ""] {
            assert!(!valid_level(bad), "{bad}");
        }
    }

    #[test]
    fn the_number_of_directives_is_bounded() {
        let (_layer, handle) = reload::Layer::<EnvFilter, Registry>::new(EnvFilter::new("info"));
        let logs = LogControl::new(handle, "info".into());
        // The same module again and again replaces its directive.
        for _ in 0..1000 {
            assert_eq!(logs.set(false, "probe:debug"), Ok("probe=debug,info".to_owned()));
        }
        for i in 2..MAX_DIRECTIVES {
            assert!(logs.set(false, &format!("m{i}:debug")).is_ok(), "{i}");
        }
        assert_eq!(logs.current().map(|c| c.split(',').count()), Ok(MAX_DIRECTIVES));
        assert_eq!(logs.set(false, "one_more:debug"), Err(LevelError::TooMany));
        assert_eq!(logs.current().map(|c| c.split(',').count()), Ok(MAX_DIRECTIVES), "unchanged");
        assert_eq!(logs.set(true, ""), Ok("info".to_owned()));
    }

    #[test]
    fn module_levels_become_directives() {
        assert_eq!(to_directives("ambit_proxy::dns:debug,warn"), "ambit_proxy::dns=debug,warn");
    }
}
