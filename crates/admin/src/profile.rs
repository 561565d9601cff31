//! CPU profiles for the admin server's `/debug/pprof/profile`.
//!
//! The `pprof` crate samples the process (a `SIGPROF` timer and a stack walk per tick); the
//! report is encoded as the pprof `profile.proto` with Ambit's own prost types
//! ([`ambit_api::pprof`]), so no protobuf code generator is needed at build time. The sampler is
//! process-wide, so one profile runs at a time; a profile whose request goes away (the client
//! disconnects) stops sampling at once. pprof keeps the stacks that overflow its in-memory table
//! in a temporary file (`$TMPDIR`, else `/tmp`), which must be writable.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use ambit_api::pprof as proto;
use prost::Message;

/// Why a profile was not produced.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProfileError {
    /// A parameter is out of range or not a number.
    #[error("invalid {name} {value:?}: must be an integer from {min} to {max}")]
    Param {
        /// `seconds` or `frequency`.
        name: &'static str,
        /// What the request gave (cut to 64 bytes).
        value: String,
        /// Smallest accepted value.
        min: u64,
        /// Largest accepted value.
        max: u64,
    },
    /// Another profile is being taken (the sampler is process-wide).
    #[error("a CPU profile is already being taken; retry when it has finished")]
    Busy,
    /// The sampler could not start or report.
    #[error("CPU profiler failed: {0}")]
    Profiler(String),
}

/// Libraries whose frames are not unwound from the signal handler (unwinding through them can
/// deadlock or crash), as pprof-rs recommends.
const BLOCKLIST: [&str; 4] = ["libc", "libgcc", "pthread", "vdso"];

static RUNNING: AtomicBool = AtomicBool::new(false);

/// The right to run the process's one profiler; released on drop.
struct Slot;

impl Slot {
    fn take() -> Option<Slot> {
        RUNNING.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).ok().map(|_| Slot)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        RUNNING.store(false, Ordering::Release);
    }
}

/// Samples the process's CPU use for `seconds` at `frequency` Hz and returns the encoded pprof
/// profile (samples/count and cpu/nanoseconds per stack, a `thread` label per sample).
pub async fn cpu(seconds: u64, frequency: u32) -> Result<Vec<u8>, ProfileError> {
    let slot = Slot::take().ok_or(ProfileError::Busy)?;
    let hz = i32::try_from(frequency.clamp(1, 1000)).unwrap_or(100);
    let guard =
        pprof::ProfilerGuardBuilder::default().frequency(hz).blocklist(&BLOCKLIST).build().map_err(|e| {
            // pprof keeps evicted samples in a temporary file it creates when first used.
            ProfileError::Profiler(format!("{e} (the sampler needs a writable $TMPDIR, else /tmp)"))
        })?;
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    // Symbolizing walks debug info and can take a while: keep it off the control runtime.
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let report = guard.report().build().map_err(|e| ProfileError::Profiler(e.to_string()));
        drop(guard);
        report.map(|r| encode(&r))
    })
    .await
    .map_err(|e| ProfileError::Profiler(e.to_string()))?
}

/// Interns strings, functions and locations of one profile.
#[derive(Default)]
struct Builder {
    strings: Vec<String>,
    string_ids: HashMap<String, i64>,
    functions: Vec<proto::Function>,
    function_ids: HashMap<(i64, i64), u64>,
    locations: Vec<proto::Location>,
    location_ids: HashMap<Vec<(u64, i64)>, u64>,
}

impl Builder {
    fn new() -> Builder {
        let mut b = Builder::default();
        // The format requires string 0 to be "".
        b.string("");
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = i64::try_from(self.strings.len()).unwrap_or(i64::MAX);
        self.strings.push(s.to_owned());
        self.string_ids.insert(s.to_owned(), id);
        id
    }

    fn function(&mut self, name: &str, system_name: &str, filename: &str) -> u64 {
        let (name, filename) = (self.string(name), self.string(filename));
        let system_name = self.string(system_name);
        let next = self.functions.len() as u64 + 1;
        let id = *self.function_ids.entry((name, filename)).or_insert(next);
        if id == next {
            self.functions.push(proto::Function { id, name, system_name, filename, start_line: 0 });
        }
        id
    }

    fn location(&mut self, lines: Vec<proto::Line>) -> u64 {
        let key: Vec<(u64, i64)> = lines.iter().map(|l| (l.function_id, l.line)).collect();
        let next = self.locations.len() as u64 + 1;
        let id = *self.location_ids.entry(key).or_insert(next);
        if id == next {
            self.locations.push(proto::Location { id, line: lines, ..Default::default() });
        }
        id
    }
}

/// `report` as a pprof `Profile` message.
fn encode(report: &pprof::Report) -> Vec<u8> {
    let mut b = Builder::new();
    let value_type =
        |b: &mut Builder, t: &str, u: &str| proto::ValueType { r#type: b.string(t), unit: b.string(u) };
    let sample_type = vec![value_type(&mut b, "samples", "count"), value_type(&mut b, "cpu", "nanoseconds")];
    let period_type = value_type(&mut b, "cpu", "nanoseconds");
    let frequency = i64::from(report.timing.frequency.max(1));
    let period = 1_000_000_000 / frequency;
    let thread = b.string("thread");
    let mut samples = Vec::with_capacity(report.data.len());
    for (frames, &count) in &report.data {
        let mut location_id = Vec::with_capacity(frames.frames.len());
        // Leaf first, as the format wants; each frame's symbols are its inlined calls, innermost first.
        for frame in &frames.frames {
            let lines: Vec<proto::Line> = frame
                .iter()
                .map(|sym| proto::Line {
                    function_id: b.function(&sym.name(), &sym.sys_name(), &sym.filename()),
                    line: i64::from(sym.lineno()),
                    column: 0,
                })
                .collect();
            location_id.push(b.location(lines));
        }
        let count = count as i64;
        let thread_name = b.string(&frames.thread_name_or_id());
        samples.push(proto::Sample {
            location_id,
            value: vec![count, count.saturating_mul(period)],
            label: vec![proto::Label { key: thread, str: thread_name, num: 0, num_unit: 0 }],
        });
    }
    let time_nanos = report
        .timing
        .start_time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    let duration_nanos = i64::try_from(report.timing.duration.as_nanos()).unwrap_or(i64::MAX);
    proto::Profile {
        sample_type,
        sample: samples,
        location: b.locations,
        function: b.functions,
        string_table: b.strings,
        time_nanos,
        duration_nanos,
        period_type: Some(period_type),
        period,
        ..Default::default()
    }
    .encode_to_vec()
}

/// Whether a profile is being taken (tests wait on it).
pub fn running() -> bool {
    RUNNING.load(Ordering::Acquire)
}
