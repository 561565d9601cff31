//! PeerAuthentication → the keys a workload lists and the DENY policies behind them
//! (`control-plane.md` §4.2–§4.4, `node-proxy.md` §5.4).
//!
//! One function, [`effect`], decides what a workload PA means given the modes it inherits, and
//! both the workload's key list and the published converted policy come from it, so a listed
//! key always names a published policy that enforces exactly the modes the user wrote. istiod
//! computes the two separately and they disagree in three cases (the [QUIRK] of §4.2); see
//! ARCHITECTURE.md.

use ambit_api::security::{Action, Authorization, Clause, Match, Rule, Scope, StringMatch, string_match};
use ambit_objects::istio::PeerAuthentication;
use tracing::warn;

use super::Ctx;
use super::names::{self, Labels, Name, STATIC_STRICT};

/// A PeerAuthentication mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Unset,
    Disable,
    Permissive,
    Strict,
}

/// What a workload PA means for the workloads it selects.
#[derive(Debug, PartialEq)]
enum Effect {
    /// Plaintext accepted on every port: no key.
    Permissive,
    /// mTLS on every port: the static policy.
    Strict,
    /// A mix: the converted policy.
    Converted(Vec<Rule>),
}

/// The static STRICT policy, published while any PeerAuthentication exists (§4.4).
pub(crate) fn static_strict(ctx: &Ctx<'_>) -> Authorization {
    Authorization {
        name: STATIC_STRICT.to_owned(),
        namespace: ctx.settings.root_namespace.clone(),
        scope: Scope::WorkloadSelector as i32,
        action: Action::Deny as i32,
        rules: vec![Rule { clauses: vec![Clause { matches: vec![plaintext()] }] }],
        ..Authorization::default()
    }
}

/// `<ns>/converted_peer_authentication_<name>`.
pub(crate) fn converted_name(n: &Name) -> Name {
    Name::new(n.ns.as_str(), format!("converted_peer_authentication_{}", n.name))
}

/// The converted policy of a workload PA with port-level modes, when its ports differ from
/// its default (§4.3).
pub(crate) fn converted(ctx: &Ctx<'_>, n: &Name, pa: &PeerAuthentication) -> Option<Authorization> {
    if n.ns == ctx.settings.root_namespace || pa.spec.port_level_mtls.is_empty() || !is_workload_pa(pa) {
        return None;
    }
    let Effect::Converted(rules) = effect(pa, inherited_strict(ctx, &n.ns)) else { return None };
    let name = converted_name(n);
    Some(Authorization {
        name: name.name,
        namespace: name.ns,
        scope: Scope::WorkloadSelector as i32,
        action: Action::Deny as i32,
        rules,
        ..Authorization::default()
    })
}

/// The PeerAuthentication keys a workload in `ns` with `labels` lists (§2.6 step 2).
pub(crate) fn keys(ctx: &Ctx<'_>, ns: &str, labels: &Labels) -> Vec<String> {
    let inherited = inherited_strict(ctx, ns);
    let static_key = || names::service_key(&ctx.settings.root_namespace, STATIC_STRICT);
    let wpa = (ns != ctx.settings.root_namespace)
        .then(|| oldest(ctx, ns, |pa| is_workload_pa(pa) && selector_matches(pa, labels)))
        .flatten();
    let Some((n, pa)) = wpa else {
        return if inherited { vec![static_key()] } else { vec![] };
    };
    match effect(pa, inherited) {
        Effect::Permissive => vec![],
        Effect::Strict => vec![static_key()],
        Effect::Converted(_) => vec![converted_name(&n).to_string()],
    }
}

/// Whether a workload in `ns` without a workload PA is STRICT: the namespace PA's mode unless
/// UNSET, else the mesh PA's.
fn inherited_strict(ctx: &Ctx<'_>, ns: &str) -> bool {
    let root = ctx.settings.root_namespace.as_str();
    let mesh = oldest(ctx, root, |pa| pa.spec.selector.is_none()).map(|(_, pa)| mode(pa));
    let namespace = (ns != root)
        .then(|| oldest(ctx, ns, |pa| !is_workload_pa(pa)).map(|(_, pa)| mode(pa)))
        .flatten()
        .filter(|m| *m != Mode::Unset);
    namespace.or(mesh) == Some(Mode::Strict)
}

/// The meaning of workload PA `pa` under an inherited mode (§4.2 steps 4–6 and §4.3, with
/// each port getting exactly its mode).
fn effect(pa: &PeerAuthentication, inherited_strict: bool) -> Effect {
    let own = mode(pa);
    let default_strict = match own {
        Mode::Strict => true,
        Mode::Permissive | Mode::Disable => false,
        Mode::Unset => inherited_strict,
    };
    let mut exempt = Vec::new();
    let mut strict_ports = Vec::new();
    // BTreeMap: ports in ascending order.
    for (port, m) in &pa.spec.port_level_mtls {
        let port_strict = match parse_mode(&m.mode) {
            Mode::Strict => true,
            Mode::Permissive | Mode::Disable => false,
            Mode::Unset => default_strict,
        };
        if default_strict && !port_strict {
            exempt.push(*port);
        } else if !default_strict && port_strict {
            strict_ports.push(*port);
        }
    }
    if default_strict {
        if exempt.is_empty() {
            return Effect::Strict;
        }
        let exemptions = exempt
            .into_iter()
            .map(|p| Clause { matches: vec![Match { not_destination_ports: vec![p], ..Match::default() }] });
        let p = Clause { matches: vec![plaintext()] };
        // istiod's clause order: the principal check first for a STRICT PA, last when inherited.
        let clauses = if own == Mode::Strict {
            std::iter::once(p).chain(exemptions).collect()
        } else {
            exemptions.chain(std::iter::once(p)).collect()
        };
        return Effect::Converted(vec![Rule { clauses }]);
    }
    if strict_ports.is_empty() {
        return Effect::Permissive;
    }
    Effect::Converted(
        strict_ports
            .into_iter()
            .map(|p| Rule {
                clauses: vec![Clause { matches: vec![Match { destination_ports: vec![p], ..plaintext() }] }],
            })
            .collect(),
    )
}

/// `not_principals: [presence]`: the connection is plaintext.
fn plaintext() -> Match {
    Match {
        not_principals: vec![StringMatch { match_type: Some(string_match::MatchType::Presence(())) }],
        ..Match::default()
    }
}

/// A PA with non-empty `matchLabels` (an empty selector makes it the namespace's PA).
fn is_workload_pa(pa: &PeerAuthentication) -> bool {
    pa.spec.selector.as_ref().is_some_and(|s| !s.match_labels.is_empty())
}

fn selector_matches(pa: &PeerAuthentication, labels: &Labels) -> bool {
    pa.spec.selector.as_ref().is_some_and(|s| names::subset(&s.match_labels, labels))
}

/// The oldest PA of `ns` that `filter` accepts (creation time, then name).
fn oldest<'a>(
    ctx: &Ctx<'a>,
    ns: &str,
    filter: impl Fn(&PeerAuthentication) -> bool,
) -> Option<(Name, &'a PeerAuthentication)> {
    let objects = ctx.store.ns(ns)?;
    objects
        .peer
        .iter()
        .filter_map(|name| {
            let n = Name::new(ns, name.as_str());
            let pa = ctx.store.peer.get(&n)?;
            filter(pa).then_some((n, &**pa))
        })
        .min_by(|(an, a), (bn, b)| {
            (a.metadata.creation_timestamp.as_ref(), an).cmp(&(b.metadata.creation_timestamp.as_ref(), bn))
        })
}

fn mode(pa: &PeerAuthentication) -> Mode {
    pa.spec.mtls.as_ref().map_or(Mode::Unset, |m| parse_mode(&m.mode))
}

/// A mode by its name. A value that is not one is taken as STRICT: when the user's intent is
/// unknown, plaintext is refused rather than accepted. (Files are decoded strictly and refuse
/// such a value; only the Kubernetes API, decoded leniently, can bring one.)
fn parse_mode(s: &str) -> Mode {
    match s {
        "" | "UNSET" => Mode::Unset,
        "DISABLE" => Mode::Disable,
        "PERMISSIVE" => Mode::Permissive,
        "STRICT" => Mode::Strict,
        _ => Mode::Strict,
    }
}

/// Logs the modes of `pa` that are not modes (once per translation of the PA, not per workload).
pub(crate) fn warn_unknown_modes(n: &Name, pa: &PeerAuthentication) {
    let known = |m: &str| matches!(m, "" | "UNSET" | "DISABLE" | "PERMISSIVE" | "STRICT");
    let modes = pa.spec.mtls.iter().chain(pa.spec.port_level_mtls.values());
    for m in modes.filter(|m| !known(&m.mode)) {
        warn!(peer_authentication = %n, mode = m.mode, "unknown mTLS mode; treated as STRICT");
    }
}
