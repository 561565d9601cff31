//! The typed nftables rule set as nf_tables netlink messages, the way `nft` 1.0 encodes the same
//! rule text (same expressions, in the same order, so `nft list ruleset` prints our rules exactly
//! as the spec writes them), and the kernel's rules read back for verification.

use std::net::IpAddr;

use crate::netlink::{
    Attr, Attrs, NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL, Netlink, Request, find, nft_request, parse_attrs,
};
use crate::nftables::{
    ChainKind, Hook, L4Proto, Match, NftAction, NftRule, NftRuleset, NftSet, NftTable, SetType,
};
use crate::{Family, RedirectError};

const NFPROTO_INET: u8 = 1;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;

const NFT_MSG_NEWTABLE: u8 = 0;
const NFT_MSG_GETTABLE: u8 = 1;
const NFT_MSG_DELTABLE: u8 = 2;
const NFT_MSG_NEWCHAIN: u8 = 3;
const NFT_MSG_GETCHAIN: u8 = 4;
const NFT_MSG_NEWRULE: u8 = 6;
const NFT_MSG_GETRULE: u8 = 7;
const NFT_MSG_DELRULE: u8 = 8;
const NFT_MSG_NEWSET: u8 = 9;
const NFT_MSG_NEWSETELEM: u8 = 12;
const NFT_MSG_GETSETELEM: u8 = 13;
const NFT_MSG_DELSETELEM: u8 = 14;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_USERDATA: u16 = 13;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NF_ACCEPT: i32 = 1;
const NFT_JUMP: i32 = -3;
const NFT_RETURN: i32 = -5;

const NFT_META_MARK: u32 = 3;
const NFT_META_IIFNAME: u32 = 6;
const NFT_META_OIFNAME: u32 = 7;
const NFT_META_SKUID: u32 = 10;
const NFT_META_NFPROTO: u32 = 15;
const NFT_META_L4PROTO: u32 = 16;
const NFT_CT_MARK: u32 = 3;
const NFT_CT_ZONE: u32 = 17;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_NEQ: u32 = 1;
const NFT_NAT_SNAT: u32 = 0;

/// nft's data type numbers for set keys.
const TYPE_IPADDR: u32 = 7;
const TYPE_IP6ADDR: u32 = 8;
/// nftnl user data: set key byte order and comment, element comment.
const UDATA_SET_KEYBYTEORDER: u8 = 0;
const UDATA_SET_COMMENT: u8 = 7;
const UDATA_SET_ELEM_COMMENT: u8 = 0;
const BYTEORDER_BIG_ENDIAN: u32 = 2;
const IFNAMSIZ: usize = 16;

/// What to do with a table that may already exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rebuild {
    /// Delete and recreate it (pod tables: nothing in them is worth keeping).
    Replace,
    /// Keep it and its sets' elements; flush its rules, re-add chains, sets and rules.
    KeepSets,
}

/// The requests that make `ruleset` the content of its tables, then delete the tables named in
/// `absent` (each is created first so deleting it cannot fail): one transaction. `existing`
/// names the tables already there: only those are deleted or flushed. Deleting anything makes
/// the kernel free it after an RCU grace period, and closing the socket then waits for that
/// (about 10 ms here), so a fresh pod's capture is pure additions.
pub(crate) fn ruleset_requests(
    ruleset: &NftRuleset,
    mode: Rebuild,
    existing: &[String],
    absent: &[&str],
) -> Result<Vec<Request>, RedirectError> {
    let mut out = Vec::new();
    let mut set_id = 0u32;
    for table in &ruleset.tables {
        out.push(table_request(NFT_MSG_NEWTABLE, &table.name));
        let exists = existing.contains(&table.name);
        match mode {
            _ if !exists => {}
            Rebuild::Replace => {
                out.push(table_request(NFT_MSG_DELTABLE, &table.name));
                out.push(table_request(NFT_MSG_NEWTABLE, &table.name));
            }
            Rebuild::KeepSets => {
                let mut attrs = Attrs::default();
                attrs.string(NFTA_RULE_TABLE, &table.name);
                let label = format!("flush table inet {}", table.name);
                out.push(nft_request(NFT_MSG_DELRULE, NFPROTO_INET, 0, attrs, label));
            }
        }
        let mut ids = Vec::new();
        for set in &table.sets {
            set_id += 1;
            ids.push((set.name.as_str(), set_id));
            out.push(set_request(&table.name, set, set_id));
        }
        for chain in &table.chains {
            let mut attrs = Attrs::default();
            attrs.string(NFTA_CHAIN_TABLE, &table.name).string(NFTA_CHAIN_NAME, &chain.name);
            let mut label = format!("add chain inet {} {}", table.name, chain.name);
            if let Some(base) = chain.base {
                attrs.nested(NFTA_CHAIN_HOOK, |h| {
                    h.be32(NFTA_HOOK_HOOKNUM, hook_number(base.hook))
                        .be32(NFTA_HOOK_PRIORITY, base.priority as u32);
                });
                attrs.string(NFTA_CHAIN_TYPE, chain_type(base.kind));
                label.push_str(&format!(
                    " {{ type {} hook {:?} priority {} }}",
                    chain_type(base.kind),
                    base.hook,
                    base.priority
                ));
            }
            out.push(nft_request(NFT_MSG_NEWCHAIN, NFPROTO_INET, NLM_F_CREATE, attrs, label));
        }
        for rule in &table.rules {
            let mut attrs = Attrs::default();
            attrs.string(NFTA_RULE_TABLE, &table.name).string(NFTA_RULE_CHAIN, &rule.chain);
            let exprs = expressions(rule, &ids)?;
            attrs.put(NFTA_RULE_EXPRESSIONS | crate::netlink::NLA_F_NESTED, exprs.bytes());
            let label = format!("add rule inet {} {} {}", table.name, rule.chain, rule.text(false));
            out.push(nft_request(NFT_MSG_NEWRULE, NFPROTO_INET, NLM_F_CREATE | NLM_F_APPEND, attrs, label));
        }
    }
    for name in absent {
        out.push(table_request(NFT_MSG_NEWTABLE, name));
        out.push(table_request(NFT_MSG_DELTABLE, name));
    }
    Ok(out)
}

fn table_request(msg: u8, name: &str) -> Request {
    let mut attrs = Attrs::default();
    attrs.string(NFTA_TABLE_NAME, name);
    let (flags, verb) = if msg == NFT_MSG_NEWTABLE { (NLM_F_CREATE, "add") } else { (0, "delete") };
    nft_request(msg, NFPROTO_INET, flags, attrs, format!("{verb} table inet {name}"))
}

fn set_request(table: &str, set: &NftSet, id: u32) -> Request {
    let (key_type, key_len) = match set.kind {
        SetType::Ipv4Addr => (TYPE_IPADDR, 4),
        SetType::Ipv6Addr => (TYPE_IP6ADDR, 16),
    };
    let mut udata = Vec::new();
    udata_put(&mut udata, UDATA_SET_KEYBYTEORDER, &BYTEORDER_BIG_ENDIAN.to_ne_bytes());
    udata_put(&mut udata, UDATA_SET_COMMENT, &nul_terminated(&set.comment));
    let mut attrs = Attrs::default();
    attrs
        .string(NFTA_SET_TABLE, table)
        .string(NFTA_SET_NAME, &set.name)
        .be32(NFTA_SET_KEY_TYPE, key_type)
        .be32(NFTA_SET_KEY_LEN, key_len)
        .be32(NFTA_SET_ID, id)
        .put(NFTA_SET_USERDATA, &udata);
    nft_request(
        NFT_MSG_NEWSET,
        NFPROTO_INET,
        NLM_F_CREATE,
        attrs,
        format!("add set inet {table} {}", set.name),
    )
}

/// A set-element request: `add`/`delete element inet TABLE SET { ADDR [comment "C"] }`;
/// without `addr`, a delete flushes the set.
pub(crate) fn element_request(
    add: bool,
    table: &str,
    set: &str,
    elem: Option<(IpAddr, Option<&str>)>,
) -> Request {
    let mut attrs = Attrs::default();
    attrs.string(NFTA_SET_ELEM_LIST_TABLE, table).string(NFTA_SET_ELEM_LIST_SET, set);
    let mut label = format!("{} element inet {table} {set}", if add { "add" } else { "delete" });
    if let Some((addr, comment)) = elem {
        label.push_str(&format!(" {{ {addr} }}"));
        attrs.nested(NFTA_SET_ELEM_LIST_ELEMENTS, |list| {
            list.nested(NFTA_LIST_ELEM, |e| {
                e.nested(NFTA_SET_ELEM_KEY, |k| {
                    k.put(NFTA_DATA_VALUE, &addr_bytes(addr));
                });
                if let Some(comment) = comment {
                    let mut udata = Vec::new();
                    udata_put(&mut udata, UDATA_SET_ELEM_COMMENT, &nul_terminated(comment));
                    e.put(NFTA_SET_ELEM_USERDATA, &udata);
                }
            });
        });
    } else {
        label = format!("flush set inet {table} {set}");
    }
    let (msg, flags) = if add { (NFT_MSG_NEWSETELEM, NLM_F_CREATE) } else { (NFT_MSG_DELSETELEM, 0) };
    nft_request(msg, NFPROTO_INET, flags, attrs, label)
}

/// The same request, failing with `EEXIST` when the object is already there.
pub(crate) fn exclusive(mut request: Request) -> Request {
    request.flags |= NLM_F_EXCL;
    request
}

/// Flushes every rule of `table` (chains and sets stay).
pub(crate) fn flush_rules_requests(table: &str) -> Vec<Request> {
    let mut attrs = Attrs::default();
    attrs.string(NFTA_RULE_TABLE, table);
    vec![
        table_request(NFT_MSG_NEWTABLE, table),
        nft_request(NFT_MSG_DELRULE, NFPROTO_INET, 0, attrs, format!("flush table inet {table}")),
    ]
}

/// Elements of `set` in `table`: address and comment.
pub(crate) fn set_elements(
    nl: &mut Netlink,
    table: &str,
    set: &str,
) -> Result<Vec<(IpAddr, Option<String>)>, RedirectError> {
    let mut attrs = Attrs::default();
    attrs.string(NFTA_SET_ELEM_LIST_TABLE, table).string(NFTA_SET_ELEM_LIST_SET, set);
    let label = format!("list set inet {table} {set}");
    let request = nft_request(NFT_MSG_GETSETELEM, NFPROTO_INET, 0, attrs, label.clone());
    let malformed = |detail: String| RedirectError::Parse { command: label.clone(), detail };
    let mut out = Vec::new();
    for reply in nl.dump(&request)? {
        reply_set_elements(&reply.payload, &mut out).map_err(malformed)?;
    }
    Ok(out)
}

/// Appends the (address, comment) elements of one `GETSETELEM` reply to `out`.
pub(crate) fn reply_set_elements(
    payload: &[u8],
    out: &mut Vec<(IpAddr, Option<String>)>,
) -> Result<(), String> {
    let attrs = nft_attrs(payload)?;
    let Some(list) = find(&attrs, NFTA_SET_ELEM_LIST_ELEMENTS) else { return Ok(()) };
    for elem in list.attrs()? {
        let fields = elem.attrs()?;
        let key = find(&fields, NFTA_SET_ELEM_KEY).ok_or("element without a key")?.attrs()?;
        let value = find(&key, NFTA_DATA_VALUE).ok_or("key without a value")?;
        let addr = match value.value.len() {
            4 => IpAddr::from(<[u8; 4]>::try_from(value.value).map_err(|e| e.to_string())?),
            16 => IpAddr::from(<[u8; 16]>::try_from(value.value).map_err(|e| e.to_string())?),
            n => return Err(format!("a {n}-byte key is not an address")),
        };
        let comment = find(&fields, NFTA_SET_ELEM_USERDATA)
            .and_then(|u| udata_get(u.value, UDATA_SET_ELEM_COMMENT))
            .map(|c| String::from_utf8_lossy(c.strip_suffix(&[0]).unwrap_or(c)).into_owned());
        out.push((addr, comment));
    }
    Ok(())
}

/// The payload of an nf_tables reply after its `nfgenmsg` header, as attributes.
fn nft_attrs(payload: &[u8]) -> Result<Vec<Attr<'_>>, String> {
    parse_attrs(payload.get(4..).ok_or("reply shorter than its header")?)
}

/// A base chain's hook number, priority and type.
pub(crate) type BaseHook = (u32, i32, String);

/// What the kernel holds for one of our tables: chains with their base hook, and each chain's
/// rules as parsed expression lists.
#[derive(Debug, Default)]
pub(crate) struct LiveTable {
    /// Chain name → (hook number, priority, type) for base chains.
    pub chains: Vec<(String, Option<BaseHook>)>,
    /// (chain, encoded expressions) in kernel order.
    pub rules: Vec<(String, Vec<u8>)>,
}

/// Names of the `inet` tables present.
pub(crate) fn table_names(nl: &mut Netlink) -> Result<Vec<String>, RedirectError> {
    let request = nft_request(NFT_MSG_GETTABLE, NFPROTO_INET, 0, Attrs::default(), "list tables inet".into());
    let mut names = Vec::new();
    for reply in nl.dump(&request)? {
        let name = reply_table_name(&reply.payload)
            .map_err(|detail| RedirectError::Parse { command: "list tables inet".into(), detail })?;
        names.extend(name);
    }
    Ok(names)
}

/// The table name of one `GETTABLE` reply.
pub(crate) fn reply_table_name(payload: &[u8]) -> Result<Option<String>, String> {
    let attrs = nft_attrs(payload)?;
    Ok(find(&attrs, NFTA_TABLE_NAME).and_then(|a| a.str()).map(str::to_owned))
}

/// Reads the chains and rules of `table`.
pub(crate) fn live_table(nl: &mut Netlink, table: &str) -> Result<LiveTable, RedirectError> {
    let label = format!("list table inet {table}");
    let malformed = |detail: String| RedirectError::Parse { command: label.clone(), detail };
    let mut live = LiveTable::default();
    let mut attrs = Attrs::default();
    attrs.string(NFTA_CHAIN_TABLE, table);
    for reply in nl.dump(&nft_request(NFT_MSG_GETCHAIN, NFPROTO_INET, 0, attrs.clone(), label.clone()))? {
        live.chains.extend(reply_chain(&reply.payload, table).map_err(malformed)?);
    }
    for reply in nl.dump(&nft_request(NFT_MSG_GETRULE, NFPROTO_INET, 0, attrs, label.clone()))? {
        live.rules.extend(reply_rule(&reply.payload, table).map_err(malformed)?);
    }
    Ok(live)
}

/// The chain of one `GETCHAIN` reply (name and base hook), if it belongs to `table`.
pub(crate) fn reply_chain(payload: &[u8], table: &str) -> Result<Option<(String, Option<BaseHook>)>, String> {
    let attrs = nft_attrs(payload)?;
    if find(&attrs, NFTA_CHAIN_TABLE).and_then(|a| a.str()) != Some(table) {
        return Ok(None);
    }
    let name = find(&attrs, NFTA_CHAIN_NAME).and_then(|a| a.str()).unwrap_or_default().to_owned();
    let base = match find(&attrs, NFTA_CHAIN_HOOK) {
        Some(hook) => {
            let hook = hook.attrs()?;
            let num = find(&hook, NFTA_HOOK_HOOKNUM).and_then(|a| a.be32()).unwrap_or(u32::MAX);
            let prio = find(&hook, NFTA_HOOK_PRIORITY).and_then(|a| a.be32()).unwrap_or_default() as i32;
            let kind = find(&attrs, NFTA_CHAIN_TYPE).and_then(|a| a.str()).unwrap_or_default().to_owned();
            Some((num, prio, kind))
        }
        None => None,
    };
    Ok(Some((name, base)))
}

/// The rule of one `GETRULE` reply (chain and encoded expressions), if it belongs to `table`.
pub(crate) fn reply_rule(payload: &[u8], table: &str) -> Result<Option<(String, Vec<u8>)>, String> {
    let attrs = nft_attrs(payload)?;
    if find(&attrs, NFTA_RULE_TABLE).and_then(|a| a.str()) != Some(table) {
        return Ok(None);
    }
    let chain = find(&attrs, NFTA_RULE_CHAIN).and_then(|a| a.str()).unwrap_or_default().to_owned();
    let exprs = find(&attrs, NFTA_RULE_EXPRESSIONS).map(|a| a.value.to_vec()).unwrap_or_default();
    Ok(Some((chain, exprs)))
}

/// Differences between `want` and what the kernel holds for it (empty = in sync).
pub(crate) fn compare_table(want: &NftTable, live: &LiveTable) -> Result<Vec<String>, RedirectError> {
    let mut drift = Vec::new();
    let t = &want.name;
    let wanted_chains: Vec<(String, Option<BaseHook>)> = want
        .chains
        .iter()
        .map(|c| {
            let base = c.base.map(|b| (hook_number(b.hook), b.priority, chain_type(b.kind).to_owned()));
            (c.name.clone(), base)
        })
        .collect();
    for chain in &wanted_chains {
        match live.chains.iter().find(|(n, _)| *n == chain.0) {
            None => drift.push(format!("table inet {t}: chain {} missing", chain.0)),
            Some(got) if got.1 != chain.1 => drift.push(format!(
                "table inet {t}: chain {} has hook {:?}, expected {:?}",
                chain.0, got.1, chain.1
            )),
            Some(_) => {}
        }
    }
    for (name, _) in &live.chains {
        if !wanted_chains.iter().any(|(n, _)| n == name) {
            drift.push(format!("table inet {t}: unexpected chain {name}"));
        }
    }
    // Set ids only link requests within one transaction; the kernel does not echo them.
    let ids: Vec<(&str, u32)> = Vec::new();
    for chain in &wanted_chains {
        let wanted: Vec<&NftRule> = want.rules.iter().filter(|r| r.chain == chain.0).collect();
        let got: Vec<&Vec<u8>> = live.rules.iter().filter(|(c, _)| *c == chain.0).map(|(_, e)| e).collect();
        if wanted.len() != got.len() {
            drift.push(format!(
                "table inet {t} chain {}: {} rules, expected {}",
                chain.0,
                got.len(),
                wanted.len()
            ));
            continue;
        }
        for (rule, got) in wanted.iter().zip(got) {
            let exprs = expressions(rule, &ids)?;
            if !contains(exprs.bytes(), got, true) {
                drift.push(format!("table inet {t} chain {}: expected `{}`", chain.0, rule.text(false)));
            }
        }
    }
    Ok(drift)
}

/// True when `got` (from the kernel) holds what `want` (our encoding) says. The top level is a
/// list (rule expressions: same length, same order); below it, every attribute of `want` must
/// be in `got` with an equal value, nested ones compared the same way recursively. The kernel
/// adds attributes we do not send (counter values, implied flags), so byte equality would be
/// too strict.
fn contains(want: &[u8], got: &[u8], list: bool) -> bool {
    let (Ok(want), Ok(got)) = (parse_attrs(want), parse_attrs(got)) else { return false };
    if list {
        return want.len() == got.len()
            && want.iter().zip(&got).all(|(w, g)| w.kind == g.kind && value_matches(w, g));
    }
    want.iter().all(|w| got.iter().any(|g| g.kind == w.kind && value_matches(w, g)))
}

fn value_matches(want: &Attr<'_>, got: &Attr<'_>) -> bool {
    if want.nested { contains(want.value, got.value, false) } else { want.value == got.value }
}

fn hook_number(hook: Hook) -> u32 {
    match hook {
        Hook::Prerouting => 0,
        Hook::Output => 3,
        Hook::Postrouting => 4,
    }
}

fn chain_type(kind: ChainKind) -> &'static str {
    match kind {
        ChainKind::Filter => "filter",
        ChainKind::Nat => "nat",
        ChainKind::Route => "route",
    }
}

fn nul_terminated(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// Appends one nftnl user-data TLV (`u8` type, `u8` length, value).
fn udata_put(buf: &mut Vec<u8>, kind: u8, value: &[u8]) {
    buf.push(kind);
    buf.push(u8::try_from(value.len()).unwrap_or(u8::MAX));
    buf.extend_from_slice(&value[..value.len().min(255)]);
}

fn udata_get(mut buf: &[u8], kind: u8) -> Option<&[u8]> {
    while buf.len() >= 2 {
        let (k, len) = (buf[0], usize::from(buf[1]));
        let value = buf.get(2..2 + len)?;
        if k == kind {
            return Some(value);
        }
        buf = &buf[2 + len..];
    }
    None
}

fn addr_bytes(addr: IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Expression writer for one rule.
struct Exprs {
    list: Attrs,
}

impl Exprs {
    fn expr(&mut self, name: &str, data: impl FnOnce(&mut Attrs)) {
        self.list.nested(NFTA_LIST_ELEM, |e| {
            e.string(NFTA_EXPR_NAME, name);
            let mut inner = Attrs::default();
            data(&mut inner);
            if !inner.bytes().is_empty() {
                e.put(NFTA_EXPR_DATA | crate::netlink::NLA_F_NESTED, inner.bytes());
            }
        });
    }

    fn meta_load(&mut self, key: u32) {
        self.expr("meta", |a| {
            a.be32(1, NFT_REG_1).be32(2, key); // NFTA_META_DREG, NFTA_META_KEY
        });
    }

    fn meta_set(&mut self, key: u32) {
        self.expr("meta", |a| {
            a.be32(2, key).be32(3, NFT_REG_1); // NFTA_META_KEY, NFTA_META_SREG
        });
    }

    fn ct_load(&mut self, key: u32) {
        self.expr("ct", |a| {
            a.be32(1, NFT_REG_1).be32(2, key); // NFTA_CT_DREG, NFTA_CT_KEY
        });
    }

    fn ct_set(&mut self, key: u32) {
        self.expr("ct", |a| {
            a.be32(2, key).be32(4, NFT_REG_1); // NFTA_CT_KEY, NFTA_CT_SREG
        });
    }

    fn cmp(&mut self, negated: bool, data: &[u8]) {
        self.expr("cmp", |a| {
            a.be32(1, NFT_REG_1).be32(2, if negated { NFT_CMP_NEQ } else { NFT_CMP_EQ });
            a.nested(3, |d| {
                d.put(NFTA_DATA_VALUE, data);
            });
        });
    }

    fn payload(&mut self, base: u32, offset: u32, len: u32) {
        self.expr("payload", |a| {
            a.be32(1, NFT_REG_1).be32(2, base).be32(3, offset).be32(4, len);
        });
    }

    /// `reg1 = (reg1 & mask) ^ xor` over 4 bytes (marks are host-endian).
    fn bitwise(&mut self, mask: u32, xor: u32) {
        self.expr("bitwise", |a| {
            a.be32(1, NFT_REG_1).be32(2, NFT_REG_1).be32(3, 4);
            a.nested(4, |d| {
                d.put(NFTA_DATA_VALUE, &mask.to_ne_bytes());
            });
            a.nested(5, |d| {
                d.put(NFTA_DATA_VALUE, &xor.to_ne_bytes());
            });
        });
    }

    fn immediate_value(&mut self, data: &[u8]) {
        self.expr("immediate", |a| {
            a.be32(1, NFT_REG_1);
            a.nested(2, |d| {
                d.put(NFTA_DATA_VALUE, data);
            });
        });
    }

    fn verdict(&mut self, code: i32, chain: Option<&str>) {
        self.expr("immediate", |a| {
            a.be32(1, NFT_REG_VERDICT);
            a.nested(2, |d| {
                d.nested(NFTA_DATA_VERDICT, |v| {
                    v.be32(NFTA_VERDICT_CODE, code as u32);
                    if let Some(chain) = chain {
                        v.string(NFTA_VERDICT_CHAIN, chain);
                    }
                });
            });
        });
    }

    fn nfproto(&mut self, family: Family) {
        self.meta_load(NFT_META_NFPROTO);
        self.cmp(false, &[if family == Family::V4 { NFPROTO_IPV4 } else { NFPROTO_IPV6 }]);
    }

    fn l4proto(&mut self, proto: L4Proto) {
        self.meta_load(NFT_META_L4PROTO);
        self.cmp(false, &[proto_number(proto)]);
    }
}

fn proto_number(proto: L4Proto) -> u8 {
    match proto {
        L4Proto::Tcp => 6,
        L4Proto::Udp => 17,
    }
}

fn ifname(name: &str) -> Result<[u8; IFNAMSIZ], RedirectError> {
    let mut out = [0u8; IFNAMSIZ];
    if name.is_empty() || name.len() >= IFNAMSIZ {
        return Err(RedirectError::InvalidValue {
            what: "interface name",
            value: name.to_owned(),
            reason: "must be 1 to 15 bytes",
        });
    }
    out[..name.len()].copy_from_slice(name.as_bytes());
    Ok(out)
}

/// Encodes one rule's matches, counter and action as `NFTA_RULE_EXPRESSIONS` content. `sets`
/// gives the transaction ids of sets created in the same batch.
fn expressions(rule: &NftRule, sets: &[(&str, u32)]) -> Result<Attrs, RedirectError> {
    let mut x = Exprs { list: Attrs::default() };
    for m in &rule.matches {
        match m {
            Match::IifName(name) => {
                x.meta_load(NFT_META_IIFNAME);
                x.cmp(false, &ifname(name)?);
            }
            Match::OifName { name, negated } => {
                x.meta_load(NFT_META_OIFNAME);
                x.cmp(*negated, &ifname(name)?);
            }
            Match::L4Proto(p) => x.l4proto(*p),
            Match::Addr { source, negated, addr, prefix } => {
                let (family, len, offset) = match (addr, source) {
                    (IpAddr::V4(_), true) => (Family::V4, 32, 12),
                    (IpAddr::V4(_), false) => (Family::V4, 32, 16),
                    (IpAddr::V6(_), true) => (Family::V6, 128, 8),
                    (IpAddr::V6(_), false) => (Family::V6, 128, 24),
                };
                if prefix.is_some_and(|p| p != len) {
                    return Err(RedirectError::InvalidValue {
                        what: "address prefix",
                        value: format!("{addr}/{}", prefix.unwrap_or(len)),
                        reason: "only whole addresses are matched",
                    });
                }
                let bytes = addr_bytes(*addr);
                x.nfproto(family);
                x.payload(NFT_PAYLOAD_NETWORK_HEADER, offset, bytes.len() as u32);
                x.cmp(*negated, &bytes);
            }
            Match::DaddrInSet { family, set } => {
                let (offset, len) = if *family == Family::V4 { (16, 4) } else { (24, 16) };
                x.nfproto(*family);
                x.payload(NFT_PAYLOAD_NETWORK_HEADER, offset, len);
                let id = sets.iter().find(|(n, _)| n == set).map(|(_, id)| *id);
                x.expr("lookup", |a| {
                    a.string(1, set).be32(2, NFT_REG_1); // NFTA_LOOKUP_SET, NFTA_LOOKUP_SREG
                    if let Some(id) = id.filter(|id| *id != 0) {
                        a.be32(4, id); // NFTA_LOOKUP_SET_ID
                    }
                });
            }
            Match::Port { proto, source, negated, port } => {
                x.l4proto(*proto);
                x.payload(NFT_PAYLOAD_TRANSPORT_HEADER, if *source { 0 } else { 2 }, 2);
                x.cmp(*negated, &port.to_be_bytes());
            }
            Match::MetaMark { mask, value, negated } => {
                x.meta_load(NFT_META_MARK);
                x.bitwise(*mask, 0);
                x.cmp(*negated, &value.to_ne_bytes());
            }
            Match::CtMark { mask, value } => {
                x.ct_load(NFT_CT_MARK);
                x.bitwise(*mask, 0);
                x.cmp(false, &value.to_ne_bytes());
            }
            Match::SkUid(uid) => {
                x.meta_load(NFT_META_SKUID);
                x.cmp(false, &uid.to_ne_bytes());
            }
        }
    }
    x.expr("counter", |_| {});
    match &rule.action {
        NftAction::Jump(chain) => x.verdict(NFT_JUMP, Some(chain)),
        NftAction::Accept => x.verdict(NF_ACCEPT, None),
        NftAction::Return => x.verdict(NFT_RETURN, None),
        NftAction::Redirect(port) => {
            x.immediate_value(&port.to_be_bytes());
            x.expr("redir", |a| {
                a.be32(1, NFT_REG_1); // NFTA_REDIR_REG_PROTO_MIN
            });
        }
        NftAction::CtMarkSet { keep, set } => {
            // (mark & keep) | set == (mark & (keep & !set)) ^ set
            x.ct_load(NFT_CT_MARK);
            x.bitwise(keep & !set, *set);
            x.ct_set(NFT_CT_MARK);
        }
        NftAction::MetaMarkFromCt => {
            x.ct_load(NFT_CT_MARK);
            x.meta_set(NFT_META_MARK);
        }
        NftAction::CtZoneSet(zone) => {
            x.immediate_value(&zone.to_ne_bytes());
            x.ct_set(NFT_CT_ZONE);
        }
        NftAction::Snat(addr) => {
            x.immediate_value(&addr_bytes(*addr));
            let family = if addr.is_ipv4() { NFPROTO_IPV4 } else { NFPROTO_IPV6 };
            x.expr("nat", |a| {
                // NFTA_NAT_TYPE, NFTA_NAT_FAMILY, NFTA_NAT_REG_ADDR_MIN
                a.be32(1, NFT_NAT_SNAT).be32(2, u32::from(family)).be32(3, NFT_REG_1);
            });
        }
    }
    Ok(x.list)
}
