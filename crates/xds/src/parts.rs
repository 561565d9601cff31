//! A response split into parts.
//!
//! A client refuses a message over its decoding limit (ztunnel and Ambit: 200 MiB), and the
//! initial Address response of a mesh of a million workloads is about 400 MB. So the server
//! sends a response larger than [`crate::server::ServerConfig::max_response_bytes`] as several
//! responses, each with its own nonce and ACKed on its own, their resources in the original
//! order and the removals after them. Delta xDS has no field that says "more follows", so each
//! part says so in `system_version_info`, which Envoy's protocol leaves to the server (istiod
//! puts its push version there): `"<version> part <i>/<n>"`. Ambit's client counts a type as
//! synced only after it ACKed the last part; a client that ignores the marker (ztunnel) is
//! still served, and treats the first part as its initial sync, as it would any response.

/// The `system_version_info` of part `part` (from 1) of `parts`.
pub fn version(version: &str, part: usize, parts: usize) -> String {
    format!("{version} part {part}/{parts}")
}

/// Whether a response whose `system_version_info` is `version` is a part that more parts of
/// the same response follow (not the last part, and not a whole response).
pub fn more_follow(version: &str) -> bool {
    let Some((_, counts)) = version.rsplit_once(" part ") else { return false };
    let Some((part, parts)) = counts.split_once('/') else { return false };
    match (part.parse::<usize>(), parts.parse::<usize>()) {
        (Ok(part), Ok(parts)) => part >= 1 && part < parts,
        _ => false,
    }
}

/// Splits `sizes` (each item's encoded size, in order) into consecutive runs of at most
/// `max_bytes` each, but at least one item per run: the index where each run after the first
/// starts (empty: one run).
pub(crate) fn split(sizes: impl IntoIterator<Item = usize>, max_bytes: usize) -> Vec<usize> {
    let mut starts = Vec::new();
    let (mut run, mut start) = (0usize, 0usize);
    for (i, size) in sizes.into_iter().enumerate() {
        if i > start && run.saturating_add(size) > max_bytes {
            starts.push(i);
            (run, start) = (0, i);
        }
        run = run.saturating_add(size);
    }
    starts
}

#[cfg(test)]
mod tests {
    use super::{more_follow, split, version};

    #[test]
    fn only_a_part_before_the_last_says_more_follow() {
        assert_eq!(version("7", 1, 3), "7 part 1/3");
        assert!(more_follow(&version("7", 1, 3)));
        assert!(more_follow(&version("7", 2, 3)));
        assert!(!more_follow(&version("7", 3, 3)));
        for whole in ["7", "", "sv-n4", "7 part", "7 part x/3", "7 part 0/3", "7 part 3", "7 part 4/3"] {
            assert!(!more_follow(whole), "{whole}");
        }
    }

    #[test]
    fn runs_stay_under_the_limit_and_keep_at_least_one_item() {
        assert_eq!(split([10, 10, 10], 100), Vec::<usize>::new());
        assert_eq!(split([10, 10, 10], 20), vec![2]);
        assert_eq!(split([10, 10, 10], 10), vec![1, 2]);
        // An item larger than the limit goes alone.
        assert_eq!(split([5, 50, 5, 5], 10), vec![1, 2]);
        assert_eq!(split([], 10), Vec::<usize>::new());
    }
}
