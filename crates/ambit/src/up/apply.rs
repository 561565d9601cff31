//! `ambit apply` and `ambit delete`: the desired folder with a file's objects written or
//! removed, checked as a whole first; and the YAML sources they and `ambit up` read.

use super::*;

/// `ambit apply -f FILE` and `ambit delete -f FILE`: the desired folder with FILE's objects
/// written (or removed), checked as a whole first; nothing changes when it does not check.
pub fn apply(args: ApplyArgs, delete: bool) -> ExitCode {
    let what = if delete { "delete" } else { "apply" };
    let target = match args.at.resolve() {
        Ok(t) => t,
        Err(e) => return fail(what, e),
    };
    let state = match live_state(&target) {
        Ok(s) => s,
        Err(e) => return fail(what, e),
    };
    let layout = Layout(target.run_dir.clone());
    let (mut ours, errors) = read_source(&args.file);
    if !errors.is_empty() {
        print_errors(what, &DesiredErrors(errors));
        return ExitCode::FAILURE;
    }
    if ours.is_empty() {
        return fail(what, format!("{}: no objects", source_name(&args.file)));
    }
    let current_files = match desired::yaml_files(&layout.desired()) {
        Ok(f) => f,
        Err(e) => return fail(what, e),
    };
    let (current, errors) = desired::read_files(&current_files);
    if !delete {
        desired::keep_cluster_ips(&mut ours, &current);
    }
    let mut names = Vec::new();
    for (value, at) in &ours {
        match desired::object_file(value) {
            Some(f) => names.push(f),
            None => {
                let e =
                    DesiredError { at: at.clone(), problem: "the object has no usable kind and name".into() };
                print_errors(what, &DesiredErrors(vec![e]));
                return ExitCode::FAILURE;
            }
        }
    }
    let replaced = |at: &Location| {
        at.path.file_name().and_then(|n| n.to_str()).is_some_and(|n| names.iter().any(|m| m == n))
    };
    let mut next: Vec<(Value, Location)> = current.iter().filter(|(_, at)| !replaced(at)).cloned().collect();
    if delete {
        let missing: Vec<DesiredError> = ours
            .iter()
            .zip(&names)
            .filter(|(_, n)| !current_files.iter().any(|f| f.file_name().and_then(|x| x.to_str()) == Some(n)))
            .map(|((v, at), _)| DesiredError {
                at: at.clone(),
                problem: format!("{} {} is not in the cluster", kind_of(v), name_of(v)),
            })
            .collect();
        if !missing.is_empty() {
            print_errors(what, &DesiredErrors(missing));
            return ExitCode::FAILURE;
        }
    } else {
        next.extend(ours.iter().cloned());
    }
    if !delete {
        let added = names
            .iter()
            .filter(|n| {
                !current_files.iter().any(|f| f.file_name().and_then(|x| x.to_str()) == Some(n.as_str()))
            })
            .count();
        if let Some(problem) = too_many_objects(current_files.len(), added) {
            return fail(what, problem);
        }
    }
    let nodes: Vec<String> = state.network.nodes.iter().map(|n| n.name.clone()).collect();
    match Desired::check(next, errors, &nodes) {
        Ok(d) => desired::fill_cluster_ips(&mut ours, &d),
        Err(e) => {
            print_errors(what, &e);
            return ExitCode::FAILURE;
        }
    }
    for ((value, _), name) in ours.iter().zip(&names) {
        let path = layout.desired().join(name);
        let existed = path.exists();
        let same = |(v, at): &(Value, Location)| v == value && at.path == path;
        if !delete && current.iter().any(same) {
            println!("{} {} unchanged", kind_of(value), name_of(value));
            continue;
        }
        let done = if delete {
            std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))
        } else {
            write_objects(&layout.desired(), &[(value.clone(), Location::new(path.clone(), 0))])
        };
        if let Err(e) = done {
            return fail(what, e);
        }
        let verb = match (delete, existed) {
            (true, _) => "deleted",
            (false, true) => "configured",
            (false, false) => "created",
        };
        println!("{} {} {verb}", kind_of(value), name_of(value));
    }
    if !delete {
        crate::policies::print_warnings(ours.iter().map(|(v, _)| v));
    }
    ExitCode::SUCCESS
}

/// Why `added` more objects do not fit beside `held` in a cluster's folder (one file each), if
/// they do not: checked before anything is written, so an apply is never half done.
fn too_many_objects(held: usize, added: usize) -> Option<String> {
    (held + added > desired::MAX_FILES).then(|| {
        format!(
            "{added} new object(s) beside the {held} the cluster holds would make {}; a local cluster holds at most {} (one file each); nothing was applied",
            held + added,
            desired::MAX_FILES
        )
    })
}

/// The record of the cluster at `target`, whose owner must be running.
pub(super) fn live_state(target: &Target) -> Result<ClusterState, String> {
    let s = target.load()?;
    if s.owner_alive() {
        Ok(s)
    } else {
        Err(format!(
            "the cluster's owner is gone (a crash or a killed `ambit up`); `{}`, then `{}`",
            target.command("down"),
            target.command("up")
        ))
    }
}

/// How `-f`'s argument is named in messages.
fn source_name(path: &Path) -> String {
    if path == Path::new("-") { STDIN.to_owned() } else { path.display().to_string() }
}

/// What errors and locations call standard input.
const STDIN: &str = "<stdin>";

/// The documents of `-f PATH` (or `--config PATH`), as kubectl reads them: a file, every
/// `.yaml`/`.yml` file of a folder (not hidden, in name order), or `-`, standard input.
pub(super) fn read_source(path: &Path) -> (Vec<(Value, Location)>, Vec<DesiredError>) {
    if path == Path::new("-") {
        let (mut docs, mut errors) = desired::read_files(&[PathBuf::from("/dev/stdin")]);
        for at in docs.iter_mut().map(|(_, at)| at).chain(errors.iter_mut().map(|e| &mut e.at)) {
            at.path = PathBuf::from(STDIN);
        }
        return (docs, errors);
    }
    if path.is_dir() {
        return match desired::yaml_files(path) {
            Ok(files) => desired::read_files(&files),
            Err(e) => (Vec::new(), vec![e]),
        };
    }
    desired::read_files(&[path.to_owned()])
}

fn kind_of(v: &Value) -> String {
    v.get("kind").and_then(Value::as_str).unwrap_or_default().to_owned()
}

fn name_of(v: &Value) -> String {
    let m = v.get("metadata");
    let name = m.and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or_default();
    match m.and_then(|m| m.get("namespace")).and_then(Value::as_str) {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_apply_past_the_folders_limit_is_refused_whole() {
        assert_eq!(too_many_objects(19_000, 1_000), None);
        assert_eq!(
            too_many_objects(19_500, 501).as_deref(),
            Some(
                "501 new object(s) beside the 19500 the cluster holds would make 20001; a local cluster holds at most 20000 (one file each); nothing was applied"
            )
        );
    }
}
