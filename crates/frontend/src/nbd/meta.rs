//! Metadata contexts: the data of `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`,
//! and what its queries select. tandem offers exactly one context, `base:allocation`.

use super::wire::MAX_STRING;

pub const BASE_ALLOCATION: &str = "base:allocation";
/// The id `base:allocation` gets when a client selects it. The spec makes ids opaque and
/// transient; with one context there is nothing to number, but 0 is what LIST replies carry
/// (reserved there), so a selected context never gets it.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// The data of a LIST or SET option: `u32` export name length, name, `u32` number of
/// queries, then each query as `u32` length and string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaRequest<'a> {
    pub export: &'a str,
    pub queries: Vec<&'a str>,
}

/// Why the data of a LIST or SET option is malformed (answered `NBD_REP_ERR_INVALID`, the
/// message going to the client).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    #[error("option data ends inside {0}")]
    Truncated(&'static str),
    #[error("{what} of {len} bytes exceeds the {MAX_STRING}-byte limit on strings")]
    TooLong { what: &'static str, len: u32 },
    #[error("{0} is not UTF-8")]
    NotUtf8(&'static str),
    #[error("the export name contains a NUL byte")]
    NulInName,
    #[error("{0} bytes follow the last query")]
    Trailing(usize),
    #[error("query {0:?} does not start with a namespace and a colon")]
    NoNamespace(String),
}

impl<'a> MetaRequest<'a> {
    /// Parses the option data. Every length is checked against what is left before it is
    /// used, so a hostile count or length costs nothing but the bytes sent.
    pub fn parse(data: &'a [u8]) -> Result<MetaRequest<'a>, MetaError> {
        let mut rest = data;
        let export = string(&mut rest, "the export name")?;
        if export.contains('\0') {
            return Err(MetaError::NulInName);
        }
        let count = u32_at(&mut rest, "the number of queries")?;
        // Each query takes at least its 4-byte length: a count the data cannot hold is
        // refused before anything is allocated for it.
        if u64::from(count) * 4 > rest.len() as u64 {
            return Err(MetaError::Truncated("the queries"));
        }
        let mut queries = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let query = string(&mut rest, "a query")?;
            if query.split_once(':').is_none_or(|(ns, _)| ns.is_empty()) {
                return Err(MetaError::NoNamespace(query.chars().take(64).collect()));
            }
            queries.push(query);
        }
        if !rest.is_empty() {
            return Err(MetaError::Trailing(rest.len()));
        }
        Ok(MetaRequest { export, queries })
    }

    /// The contexts a LIST answers with: all of ours for no query; else those a query names,
    /// the `base:` wildcard included. Queries of other namespaces match nothing (the spec
    /// has them ignored, not refused).
    pub fn listed(&self) -> Option<&'static str> {
        let any = self.queries.is_empty()
            || self
                .queries
                .iter()
                .any(|q| *q == BASE_ALLOCATION || *q == "base:");
        any.then_some(BASE_ALLOCATION)
    }

    /// Whether a SET selects `base:allocation`: only by its full name (the spec has SET
    /// ignore the `base:` wildcard, and no query selects nothing).
    pub fn selects_base_allocation(&self) -> bool {
        self.queries.contains(&BASE_ALLOCATION)
    }
}

fn u32_at(rest: &mut &[u8], what: &'static str) -> Result<u32, MetaError> {
    let Some((n, tail)) = rest.split_first_chunk::<4>() else {
        return Err(MetaError::Truncated(what));
    };
    *rest = tail;
    Ok(u32::from_be_bytes(*n))
}

fn string<'a>(rest: &mut &'a [u8], what: &'static str) -> Result<&'a str, MetaError> {
    let len = u32_at(rest, what)?;
    if len as usize > MAX_STRING {
        return Err(MetaError::TooLong { what, len });
    }
    if rest.len() < len as usize {
        return Err(MetaError::Truncated(what));
    }
    let (bytes, tail) = rest.split_at(len as usize);
    *rest = tail;
    std::str::from_utf8(bytes).map_err(|_| MetaError::NotUtf8(what))
}

/// The payload of an `NBD_REP_META_CONTEXT` reply.
pub fn context_reply(id: u32, name: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + name.len());
    v.extend_from_slice(&id.to_be_bytes());
    v.extend_from_slice(name.as_bytes());
    v
}
