//! A large local-config file parsed on several threads.
//!
//! The YAML parser reads about 10–15 MB/s on one core, so a file of 100 000 workloads (~65 MB)
//! took five seconds to load. A file in the plain block shape every generator and ztunnel's own
//! examples write (top-level keys `workloads:`, `services:`, `policies:` at column 0, each list
//! item starting with `- ` at column 0) is cut at item boundaries into pieces; each piece is a
//! block sequence, a YAML document of its own, parsed on its own thread; the lists are joined
//! in order. Whenever the shape is anything else, or any piece fails (an alias to an anchor in
//! another piece, a quoted scalar cut in two, a budget breach, any error), the caller parses the
//! whole file as before: the result, and every error with its position, are the whole-file
//! parse's.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use serde::de::DeserializeOwned;

use super::config::{LocalConfig, MAX_POLICIES, MAX_SERVICES, MAX_WORKLOADS, item_budget, options_within};

/// Files smaller than this are parsed whole (the threads would not pay for themselves).
pub const MIN_BYTES: usize = 4 * 1024 * 1024;

/// The top-level keys, in the order of [`LocalConfig`]'s lists.
const KEYS: [&str; 3] = ["workloads", "services", "policies"];

/// The config, parsed in pieces on up to `threads` threads; `None` when the file is smaller than
/// `min_bytes`, not of the plain shape, or a piece failed (then parse it whole).
///
/// The pieces are several times more than the threads, and each thread takes the next one
/// when it is done with one: pieces parse at different speeds (a workload costs more per byte
/// than a policy), so a fixed share per thread left one core idle while the other finished.
pub fn parse(yaml: &str, threads: usize, min_bytes: usize) -> Option<LocalConfig> {
    if threads < 2 || yaml.len() < min_bytes {
        return None;
    }
    let sections = sections(yaml)?;
    let items: usize = sections.iter().flatten().map(|s| s.len()).sum();
    if items > MAX_WORKLOADS + MAX_SERVICES + MAX_POLICIES {
        return None;
    }
    let total: usize = sections.iter().flatten().map(|s| s.last().map_or(0, |l| l.end) - s[0].start).sum();
    let target = total.div_ceil(threads * PIECES_PER_THREAD).max(1);
    let queue: Vec<(usize, &str, usize)> = sections
        .iter()
        .enumerate()
        .filter_map(|(k, s)| Some((k, s.as_ref()?)))
        .flat_map(|(k, items)| pieces(yaml, items, target).into_iter().map(move |(text, n)| (k, text, n)))
        .collect();
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let done: Vec<Vec<(usize, Parsed)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.min(queue.len()))
            .map(|_| {
                scope.spawn(|| {
                    let mut out = Vec::new();
                    while !failed.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(kind, text, items)) = queue.get(i) else { break };
                        match Parsed::of(kind, text, items) {
                            Some(parsed) => out.push((i, parsed)),
                            None => failed.store(true, Ordering::Relaxed),
                        }
                    }
                    out
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or_default()).collect()
    });
    if failed.load(Ordering::Relaxed) {
        return None;
    }
    let mut parsed: Vec<(usize, Parsed)> = done.into_iter().flatten().collect();
    if parsed.len() != queue.len() {
        return None;
    }
    parsed.sort_unstable_by_key(|(i, _)| *i);
    let mut config = LocalConfig::default();
    for (_, p) in parsed {
        match p {
            Parsed::Workloads(w) => config.workloads.extend(w),
            Parsed::Services(s) => config.services.extend(s),
            Parsed::Policies(p) => config.policies.extend(p),
        }
    }
    Some(config)
}

/// Pieces per thread: enough that the last piece is a small part of a thread's work.
const PIECES_PER_THREAD: usize = 8;

/// One piece's items.
enum Parsed {
    Workloads(Vec<super::model::Workload>),
    Services(Vec<super::model::Service>),
    Policies(Vec<crate::authz::Authorization>),
}

impl Parsed {
    /// The piece `text` of section `kind` (an index into [`KEYS`]), of `items` items.
    fn of(kind: usize, text: &str, items: usize) -> Option<Parsed> {
        Some(match kind {
            0 => Parsed::Workloads(piece(text, items)?),
            1 => Parsed::Services(piece(text, items)?),
            _ => Parsed::Policies(piece(text, items)?),
        })
    }
}

/// One list item's bytes.
#[derive(Clone, Copy)]
struct Item {
    start: usize,
    end: usize,
}

/// Each top-level key's items, when the file is of the plain shape: every line at column 0 is
/// blank, a comment, a list item (`- …`) or one of [`KEYS`] alone (`workloads:`), each key at
/// most once and followed by at least one item.
fn sections(yaml: &str) -> Option<[Option<Vec<Item>>; 3]> {
    let mut sections: [Option<Vec<Item>>; 3] = [None, None, None];
    let mut current: Option<usize> = None;
    let mut offset = 0;
    for line in yaml.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let text = line.trim_end_matches(['\n', '\r']);
        match text.as_bytes().first() {
            None | Some(b'#') => {}
            Some(b' ') => {
                // Content of the current item; before a section's first item, not our shape.
                let items = sections[current?].as_ref()?;
                if items.is_empty() && !text.trim_start().is_empty() && !text.trim_start().starts_with('#') {
                    return None;
                }
            }
            Some(b'-') if text == "-" || text.starts_with("- ") => {
                let items = sections[current?].as_mut()?;
                if let Some(last) = items.last_mut() {
                    last.end = start;
                }
                items.push(Item { start, end: start });
            }
            Some(_) => {
                let key = text.split_once('#').map_or(text, |(k, _)| k).trim_end().strip_suffix(':')?;
                let k = KEYS.iter().position(|known| *known == key)?;
                if sections[k].is_some() {
                    return None;
                }
                close(&mut sections, current, start);
                sections[k] = Some(Vec::new());
                current = Some(k);
            }
        }
    }
    close(&mut sections, current, offset);
    if sections.iter().flatten().any(Vec::is_empty) {
        return None;
    }
    Some(sections)
}

/// Ends the last item of section `current` at `at`.
fn close(sections: &mut [Option<Vec<Item>>; 3], current: Option<usize>, at: usize) {
    if let Some(last) = current.and_then(|c| sections[c].as_mut()).and_then(|items| items.last_mut()) {
        last.end = at;
    }
}

/// A section's items cut into runs of about `target` bytes: each run's text and item count.
fn pieces<'a>(yaml: &'a str, items: &[Item], target: usize) -> Vec<(&'a str, usize)> {
    let mut out = Vec::new();
    let mut first = 0;
    for (i, item) in items.iter().enumerate() {
        let size = item.end - items[first].start;
        if size >= target || i + 1 == items.len() {
            out.push((&yaml[items[first].start..item.end], i + 1 - first));
            first = i + 1;
        }
    }
    out
}

/// One piece, a block sequence of `items` items, under the budget of that many items.
fn piece<T: DeserializeOwned>(text: &str, items: usize) -> Option<Vec<T>> {
    let list: Vec<T> = serde_saphyr::from_str_with_options(text, options_within(item_budget(items))).ok()?;
    (list.len() == items).then_some(list)
}
