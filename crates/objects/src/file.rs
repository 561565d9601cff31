//! The YAML folder source (local mode): every `.yaml`/`.yml` file of one folder, each holding
//! any number of documents (`---`), and `v1` `List`s of objects.
//!
//! The folder is polled: a file whose stamp (mtime, ctime, size, inode) is unchanged costs one
//! `stat`; a changed one is read and parsed again. [`FileSource::poll`] compares per object, so
//! editing one Pod among many yields exactly one [`Change::Upsert`], and deleting a file yields a
//! [`Change::Delete`] for each object it held.
//!
//! A bad file (not YAML, a document of a kind Ambit reads that does not decode, an object
//! defined twice) is reported by [`FileSource::errors`] as `<path>:<line>:<column>: <message>`,
//! and the file's **last good objects are kept**: a typo while editing never deletes what the
//! file held. When two files define the same object, the one that held it first keeps it and the
//! other is reported, naming both places. Documents of kinds Ambit does not read are skipped.
//!
//! With a capture-state folder ([`FileSource::with_capture_state`]), the
//! `ambient.istio.io/redirection` annotation the node agents would have written on their pods is
//! laid over the Pod objects (see [`CaptureState`]): local mode's stand-in for the agent's patch
//! of `pods/status`, so the translation sees the same annotation in both modes.

mod capture;
mod locate;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use capture::{CaptureError, CaptureState, CapturedPod};

use crate::{Change, Decoding, Filter, Kind, Object, ObjectError, ObjectKey, Source};

/// Largest YAML file read (bigger ones are reported, and their last good objects kept).
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// A folder of YAML objects, polled.
pub struct FileSource {
    dir: PathBuf,
    filter: Filter,
    files: BTreeMap<PathBuf, FileState>,
    /// Which file holds each object.
    owners: HashMap<ObjectKey, PathBuf>,
    /// What the consumer was given (pods with their capture-state annotation laid over).
    emitted: HashMap<ObjectKey, Object>,
    capture: Option<capture::Overlay>,
    folder_error: Option<FileError>,
    synced: bool,
}

/// A problem with one file, and where in it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct FileError {
    /// The file (or the folder).
    pub path: PathBuf,
    /// Where in the file (`None`: the whole file).
    pub at: Option<Position>,
    /// What is wrong.
    pub problem: Problem,
}

/// A 1-based line and column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// Line.
    pub line: u64,
    /// Column.
    pub column: u64,
}

/// What is wrong with a file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// The file or folder cannot be read.
    #[error("cannot read: {0}")]
    Read(String),
    /// The file is too large to be read.
    #[error("the file has {size} bytes, more than the {limit} read; split it into several files")]
    TooLarge {
        /// Its size.
        size: u64,
        /// [`MAX_FILE_BYTES`].
        limit: u64,
    },
    /// Not YAML.
    #[error("not valid YAML: {0}")]
    Yaml(String),
    /// A document that is not a Kubernetes object.
    #[error("not a Kubernetes object: {0}")]
    NotAnObject(&'static str),
    /// A document of a kind Ambit reads that does not decode.
    #[error("{0}")]
    Object(String),
    /// The object is defined twice (in this file or another).
    #[error("{key} is defined twice: also in {} at line {line}; delete one of them", other.display())]
    Duplicate {
        /// The object.
        key: ObjectKey,
        /// The other file.
        other: PathBuf,
        /// Its line there.
        line: u64,
    },
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Some(p) => write!(f, "{}:{}:{}: {}", self.path.display(), p.line, p.column, self.problem),
            None => write!(f, "{}: {}", self.path.display(), self.problem),
        }
    }
}

/// What identifies one version of a file without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    mtime: (i64, i64),
    ctime: (i64, i64),
    len: u64,
    ino: u64,
    dev: u64,
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            len: m.len(),
            ino: m.ino(),
            dev: m.dev(),
        }
    }
}

/// One object where a file defines it.
#[derive(Clone, Debug)]
struct Placed {
    object: Object,
    line: u64,
}

#[derive(Default)]
struct FileState {
    /// The version last read.
    stamp: Option<Stamp>,
    /// The objects that count: the last good version's.
    good: BTreeMap<ObjectKey, Placed>,
    /// A version that parsed but is not accepted yet (it defines an object another file holds);
    /// tried again whenever the folder changes.
    candidate: Option<BTreeMap<ObjectKey, Placed>>,
    /// What is wrong with the current version.
    error: Option<FileError>,
}

impl FileSource {
    /// Watches `dir` (read at the first [`FileSource::poll`]), delivering what `filter` admits.
    pub fn new(dir: impl Into<PathBuf>, filter: Filter) -> FileSource {
        FileSource {
            dir: dir.into(),
            filter,
            files: BTreeMap::new(),
            owners: HashMap::new(),
            emitted: HashMap::new(),
            capture: None,
            folder_error: None,
            synced: false,
        }
    }

    /// Also reads the node agents' capture state from `dir` (`<node>.json` files, see
    /// [`CaptureState`]) and lays each pod's `ambient.istio.io/redirection` value over the Pod
    /// objects (matched by namespace, name, uid and node); a pod whose value changes is an
    /// Upsert.
    pub fn with_capture_state(mut self, dir: impl Into<PathBuf>) -> FileSource {
        self.capture = Some(capture::Overlay::new(dir.into()));
        self
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The changes since the last call. Only files whose stamp changed are read.
    pub fn poll(&mut self) -> Vec<Change> {
        let mut touched = BTreeSet::new();
        if self.scan(&mut touched) {
            self.accept(&mut touched);
        }
        if let Some(c) = &mut self.capture {
            for (namespace, name) in c.poll() {
                touched.insert(ObjectKey::new(Kind::Pod, namespace, name));
            }
        }
        self.synced = true;
        let mut changes = Vec::new();
        for key in touched {
            let want = self
                .owners
                .get(&key)
                .and_then(|path| self.files.get(path))
                .and_then(|f| f.good.get(&key))
                .map(|placed| self.overlay(&placed.object));
            match (want, self.emitted.get(&key)) {
                (Some(o), Some(old)) if o == *old => {}
                (Some(o), _) => {
                    self.emitted.insert(key, o.clone());
                    changes.push(Change::Upsert(o));
                }
                (None, Some(_)) => {
                    self.emitted.remove(&key);
                    changes.push(Change::Delete(key));
                }
                (None, None) => {}
            }
        }
        changes
    }

    /// What is wrong right now: the folder, each bad file, each bad capture-state file.
    pub fn errors(&self) -> Vec<FileError> {
        let files = self.files.values().filter_map(|f| f.error.clone());
        let capture = self.capture.iter().flat_map(|c| c.errors());
        self.folder_error.clone().into_iter().chain(files).chain(capture).collect()
    }

    /// Reads what changed; true when any file changed or went away.
    fn scan(&mut self, touched: &mut BTreeSet<ObjectKey>) -> bool {
        let paths = match yaml_files(&self.dir) {
            Ok(p) => {
                self.folder_error = None;
                p
            }
            Err(e) => {
                // Keep everything: a folder that cannot be read is not an empty folder.
                let error =
                    FileError { path: self.dir.clone(), at: None, problem: Problem::Read(e.to_string()) };
                if self.folder_error.as_ref() != Some(&error) {
                    tracing::warn!(%error, "cannot read the source folder; keeping the objects read before");
                }
                self.folder_error = Some(error);
                return false;
            }
        };
        let mut changed = false;
        let gone: Vec<PathBuf> = self.files.keys().filter(|p| !paths.contains_key(*p)).cloned().collect();
        for path in gone {
            let Some(state) = self.files.remove(&path) else { continue };
            for key in state.good.into_keys() {
                if self.owners.get(&key) == Some(&path) {
                    self.owners.remove(&key);
                }
                touched.insert(key);
            }
            changed = true;
        }
        for (path, meta) in paths {
            let stamp = Stamp::of(&meta);
            let state = self.files.entry(path.clone()).or_default();
            if state.stamp == Some(stamp) {
                continue;
            }
            state.stamp = Some(stamp);
            changed = true;
            match read(&path, &meta, &self.filter) {
                Ok(objects) => {
                    state.candidate = Some(objects);
                    state.error = None;
                }
                Err(error) => {
                    tracing::warn!(%error, "bad source file; keeping the objects it held before");
                    state.candidate = None;
                    state.error = Some(*error);
                }
            }
        }
        changed
    }

    /// Accepts each parsed version whose objects no other file holds. Repeated until nothing
    /// more is accepted, so an object moved from one file to another in one step is accepted
    /// whatever the files' order; what is left defines an object another file keeps.
    fn accept(&mut self, touched: &mut BTreeSet<ObjectKey>) {
        let mut pending: Vec<PathBuf> =
            self.files.iter().filter(|(_, f)| f.candidate.is_some()).map(|(p, _)| p.clone()).collect();
        loop {
            let before = pending.len();
            let mut left = Vec::new();
            for path in pending {
                if self.clash(&path).is_some() {
                    left.push(path);
                    continue;
                }
                let Some(state) = self.files.get_mut(&path) else { continue };
                let Some(candidate) = state.candidate.take() else { continue };
                for key in state.good.keys() {
                    if self.owners.get(key) == Some(&path) {
                        self.owners.remove(key);
                    }
                    touched.insert(key.clone());
                }
                for key in candidate.keys() {
                    self.owners.insert(key.clone(), path.clone());
                    touched.insert(key.clone());
                }
                state.good = candidate;
                state.error = None;
            }
            pending = left;
            if pending.len() == before {
                break;
            }
        }
        for path in pending {
            let Some((key, line, other)) = self.clash(&path) else { continue };
            let other_line = self.files.get(&other).and_then(|f| f.good.get(&key)).map_or(0, |p| p.line);
            let error = FileError {
                path: path.clone(),
                at: Some(Position { line, column: 1 }),
                problem: Problem::Duplicate { key, other, line: other_line },
            };
            if let Some(state) = self.files.get_mut(&path) {
                if state.error.as_ref() != Some(&error) {
                    tracing::warn!(%error, "bad source file; keeping the objects it held before");
                }
                state.error = Some(error);
            }
        }
    }

    /// The first object of `path`'s candidate that another file holds: (key, line, that file).
    fn clash(&self, path: &PathBuf) -> Option<(ObjectKey, u64, PathBuf)> {
        let candidate = self.files.get(path)?.candidate.as_ref()?;
        candidate.iter().find_map(|(key, placed)| match self.owners.get(key) {
            Some(owner) if owner != path => Some((key.clone(), placed.line, owner.clone())),
            _ => None,
        })
    }

    /// The object as delivered: a pod with its capture-state annotation, if any.
    fn overlay(&self, object: &Object) -> Object {
        match (object, &self.capture) {
            (Object::Pod(pod), Some(c)) => match c.redirection(pod) {
                Some(value) => {
                    let mut pod = (**pod).clone();
                    pod.metadata
                        .annotations
                        .get_or_insert_default()
                        .insert(crate::REDIRECTION.to_owned(), value.to_owned());
                    Object::Pod(Arc::new(pod))
                }
                None => object.clone(),
            },
            _ => object.clone(),
        }
    }
}

impl Source for FileSource {
    fn poll(&mut self) -> Vec<Change> {
        FileSource::poll(self)
    }

    fn is_synced(&self) -> bool {
        self.synced
    }
}

/// The folder's YAML files with their metadata (one `stat` each), sorted; hidden files (editor
/// and lock files) are not read.
fn yaml_files(dir: &Path) -> std::io::Result<BTreeMap<PathBuf, std::fs::Metadata>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with('.') || !(name.ends_with(".yaml") || name.ends_with(".yml")) {
            continue;
        }
        // Follows symlinks (a ConfigMap volume is made of them); directories are skipped.
        if let Ok(meta) = std::fs::metadata(&path)
            && meta.is_file()
        {
            files.insert(path, meta);
        }
    }
    Ok(files)
}

/// Where one value of a file comes from: the position its document starts at and, for an item of
/// a `v1` `List`, its index in each enclosing `items` (outermost first; empty: the document).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    /// Where the document starts.
    pub at: Position,
    /// The item's indices in the Lists holding it.
    pub items: Vec<usize>,
}

impl Default for Position {
    fn default() -> Position {
        Position { line: 1, column: 1 }
    }
}

/// One file's documents as the folder source reads them, not decoded yet: every document (and
/// every item of a `v1` `List`) as JSON, with where it came from. The file's size is bounded by
/// [`MAX_FILE_BYTES`]; it must be UTF-8 YAML whose documents are mappings with `apiVersion` and
/// `kind`. `ambit up` reads its desired objects with this, so both readers accept exactly the same
/// files; objects are then decoded with [`crate::Decoding::Strict`], and an error in one field is
/// placed at that field with [`field_position`].
pub fn values(path: &Path) -> Result<Vec<(serde_json::Value, Origin)>, Box<FileError>> {
    let text = read_text(path)?;
    let documents = documents(&text).map_err(|(at, message)| {
        Box::new(FileError { path: path.to_owned(), at, problem: Problem::Yaml(message) })
    })?;
    let mut out = Vec::new();
    for (value, at) in documents {
        let fail = |p| Box::new(FileError { path: path.to_owned(), at: Some(at), problem: p });
        out.extend(items(value).map_err(fail)?.into_iter().map(|(v, items)| (v, Origin { at, items })));
    }
    Ok(out)
}

/// Where in `path` the field that `error` is about is written (its key for an unknown field, its
/// value otherwise), in the value from `origin`: found by parsing the file again with positions,
/// which only errors pay for. As close as the file allows (the nearest enclosing field that is
/// written, at worst the document's start, which is also the answer when the file changed or
/// cannot be read again).
pub fn field_position(path: &Path, origin: &Origin, error: &crate::FieldError) -> Position {
    read_text(path).ok().and_then(|text| locate::find(&text, origin, error)).unwrap_or(origin.at)
}

/// The text of `path`: at most [`MAX_FILE_BYTES`] of UTF-8.
fn read_text(path: &Path) -> Result<String, Box<FileError>> {
    let fail = |at: Option<Position>, problem| Box::new(FileError { path: path.to_owned(), at, problem });
    let too_large = |size| fail(None, Problem::TooLarge { size, limit: MAX_FILE_BYTES });
    let mut file = std::fs::File::open(path).map_err(|e| fail(None, Problem::Read(e.to_string())))?;
    let size = file.metadata().map_err(|e| fail(None, Problem::Read(e.to_string())))?.len();
    if size > MAX_FILE_BYTES {
        return Err(too_large(size));
    }
    let mut bytes = Vec::new();
    {
        use std::io::Read;
        (&mut file)
            .take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| fail(None, Problem::Read(e.to_string())))?;
    }
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        fail(
            None,
            Problem::Yaml(format!(
                "not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            )),
        )
    })?;
    Ok(text)
}

/// Reads and parses one file: its objects that `filter` admits.
fn read(
    path: &Path,
    meta: &std::fs::Metadata,
    filter: &Filter,
) -> Result<BTreeMap<ObjectKey, Placed>, Box<FileError>> {
    if meta.len() > MAX_FILE_BYTES {
        let problem = Problem::TooLarge { size: meta.len(), limit: MAX_FILE_BYTES };
        return Err(Box::new(FileError { path: path.to_owned(), at: None, problem }));
    }
    let fail = |at: Option<Position>, problem| Box::new(FileError { path: path.to_owned(), at, problem });
    let mut objects: BTreeMap<ObjectKey, Placed> = BTreeMap::new();
    for (value, origin) in values(path)? {
        let at = origin.at;
        let object = match Object::decode(value, Decoding::Strict) {
            Ok(o) => o,
            Err(ObjectError::UnknownKind { api_version, kind }) => {
                tracing::debug!(file = %path.display(), line = at.line, %api_version, %kind,
                    "skipping a kind Ambit does not read");
                continue;
            }
            Err(e) => {
                let at = match &e {
                    ObjectError::Field { error, .. } => field_position(path, &origin, error),
                    _ => at,
                };
                return Err(fail(Some(at), Problem::Object(e.to_string())));
            }
        };
        if !filter.admits(&object) {
            continue;
        }
        let key = object.key();
        if let Some(first) = objects.get(&key) {
            let problem = Problem::Duplicate { key, other: path.to_owned(), line: first.line };
            return Err(fail(Some(at), problem));
        }
        objects.insert(key, Placed { object, line: at.line });
    }
    Ok(objects)
}

/// The YAML text parser, for the fuzz targets (`fuzzing` feature): the objects of one file's
/// text, each decoded as the source decodes it, a field error placed as the source places it
/// (errors as values, never a panic).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub fn fuzz_parse(text: &str) -> Vec<Result<Object, String>> {
    match documents(text) {
        Err((_, message)) => vec![Err(message)],
        Ok(docs) => docs
            .into_iter()
            .flat_map(|(value, at)| match items(value) {
                Ok(items) => items
                    .into_iter()
                    .map(|(v, items)| {
                        Object::decode(v, Decoding::Strict).map_err(|e| match &e {
                            ObjectError::Field { error, .. } => {
                                let origin = Origin { at, items };
                                let p = locate::find(text, &origin, error).unwrap_or(at);
                                format!("{}:{}: {e}", p.line, p.column)
                            }
                            _ => e.to_string(),
                        })
                    })
                    .collect(),
                Err(p) => vec![Err(p.to_string())],
            })
            .collect(),
    }
}

/// Documents with the position each starts at.
type Documents = Vec<(serde_json::Value, Position)>;

/// Where the YAML is broken (if known), and how.
type YamlError = (Option<Position>, String);

fn documents(text: &str) -> Result<Documents, YamlError> {
    let docs: Vec<serde_saphyr::Spanned<serde_json::Value>> =
        serde_saphyr::from_multiple_with_options(text, options()).map_err(|e| {
            let at = e
                .location()
                .filter(|l| l.line() > 0)
                .map(|l| Position { line: l.line(), column: l.column() });
            (at, plain_message(&e, at))
        })?;
    Ok(docs.into_iter().map(|d| (d.value, start(&d.referenced))).collect())
}

/// Where a document starts, as [`documents`] reports it.
fn start(l: &serde_saphyr::Location) -> Position {
    Position { line: l.line().max(1), column: l.column().max(1) }
}

/// The parser's options for object files.
fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        // YAML 1.2's booleans only (`true`/`false`): `app: y` is the string `y`.
        strict_booleans: true,
        // Bounded by the file size limit rather than by the default 1 024 documents per file.
        budget: serde_saphyr::budget! {
            max_documents: 1_000_000,
            max_nodes: 20_000_000,
            max_events: 50_000_000,
        },
    }
}

/// One YAML document (JSON is YAML too) as a JSON value, read with the same parser and
/// options as object files (YAML 1.2 booleans; bounded). For settings that hold YAML, such as
/// istio-cni's `AMBIENT_ENABLEMENT_SELECTOR`. An empty text, or more than one document, is an
/// error that says so; a parse error says where (`line L, column C: …`).
pub fn yaml_value(text: &str) -> Result<serde_json::Value, String> {
    let mut docs = documents(text).map_err(|(at, message)| match at {
        Some(p) => format!("line {}, column {}: {message}", p.line, p.column),
        None => message,
    })?;
    match docs.len() {
        1 => Ok(docs.remove(0).0),
        0 => Err("no YAML document".to_owned()),
        n => Err(format!("{n} YAML documents where one is expected")),
    }
}

/// The parser's message on one line, without the location it appends (ours comes first).
fn plain_message(e: &serde_saphyr::Error, at: Option<Position>) -> String {
    let options = serde_saphyr::render_options! { snippets: serde_saphyr::SnippetMode::Off };
    let message = e.render_with_options(options);
    let message = match at {
        Some(p) => {
            let suffix = format!(" at line {}, column {}", p.line, p.column);
            message.strip_suffix(&suffix).map(str::to_owned).unwrap_or(message)
        }
        None => message,
    };
    message.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}

/// A document's objects: itself, or the items of a `v1` `List` (with their indices).
fn items(value: serde_json::Value) -> Result<Vec<(serde_json::Value, Vec<usize>)>, Problem> {
    let serde_json::Value::Object(map) = &value else {
        return Err(Problem::NotAnObject("a document must be a mapping with apiVersion, kind and metadata"));
    };
    let kind = map.get("kind").and_then(|k| k.as_str());
    let api_version = map.get("apiVersion").and_then(|k| k.as_str());
    match (api_version, kind) {
        (_, None) => Err(Problem::NotAnObject("the document has no kind")),
        (None, Some(_)) => Err(Problem::NotAnObject("the document has no apiVersion")),
        (Some("v1"), Some("List")) => match value {
            serde_json::Value::Object(mut map) => match map.remove("items") {
                // Each item is checked like a document (a List in a List too; YAML's nesting
                // limit bounds the depth).
                Some(serde_json::Value::Array(list)) => {
                    let mut out = Vec::new();
                    for (i, item) in list.into_iter().enumerate() {
                        for (v, mut inner) in items(item)? {
                            inner.insert(0, i);
                            out.push((v, inner));
                        }
                    }
                    Ok(out)
                }
                None | Some(serde_json::Value::Null) => Ok(Vec::new()),
                Some(_) => Err(Problem::NotAnObject("the items of a List must be a sequence")),
            },
            _ => Ok(Vec::new()),
        },
        _ => Ok(vec![(value, Vec::new())]),
    }
}
