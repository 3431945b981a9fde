//! The live status page, on the metrics address: `GET /` is one self-contained HTML page
//! (`status_page.html`: inline CSS and JS, nothing from elsewhere) that asks for
//! `GET /status.json` every second and shows each resource, its nodes, roles, disk and
//! replication states, resync progress bars and the I/O rates of the last second. The JSON
//! is `tandem status --json`'s resources, each with its volumes' read and written byte
//! counters and their rates over the last second (sampled by the node: a headless
//! browser's virtual clock, or a busy one, says nothing of the node's), built resource by
//! resource as the metrics are (`metrics_http.rs`).

use super::state::{NodeReactor, Presence};
use crate::control_api::ResourceStatus;
use serde::Serialize;

pub(super) const PAGE: &str = include_str!("status_page.html");

/// One resource in `/status.json`.
#[derive(Serialize)]
struct PageResource<'a> {
    #[serde(flatten)]
    status: &'a ResourceStatus,
    /// Per volume, bytes read from and written to the local replica.
    read_bytes: Vec<u64>,
    written_bytes: Vec<u64>,
    /// All volumes' over the last second, per second.
    read_rate: u64,
    write_rate: u64,
}

/// The JSON's beginning: the node's name, its clock (ms since it started), then the
/// resources' array.
pub(super) fn json_start(node: &str, at_ms: u64) -> Vec<u8> {
    let mut out = b"{\"node\":".to_vec();
    serde_json::to_writer(&mut out, node).expect("a string serializes");
    out.extend_from_slice(format!(",\"at_ms\":{at_ms},\"resources\":[").as_bytes());
    out
}

impl NodeReactor {
    /// Resource `i` of the node (the running ones, then those not attached) into `json`.
    pub(super) fn add_to_json(&self, json: &mut Vec<u8>, i: usize) {
        if self
            .res
            .get(i)
            .is_some_and(|r| r.presence == Presence::Gone)
        {
            return; // stopped by `tandem adjust`
        }
        let (status, volumes, rates) = match self.res.get(i) {
            Some(res) => (
                self.resource_status(i),
                &res.stats.volumes[..],
                res.stats.rates,
            ),
            None => (
                self.not_attached_status(i - self.res.len()),
                &[][..],
                (0, 0),
            ),
        };
        let page = PageResource {
            status: &status,
            read_bytes: volumes.iter().map(|v| v.read_bytes).collect(),
            written_bytes: volumes.iter().map(|v| v.written_bytes).collect(),
            read_rate: rates.0,
            write_rate: rates.1,
        };
        if json.last() != Some(&b'[') {
            json.push(b',');
        }
        serde_json::to_writer(&mut *json, &page).expect("a status serializes");
    }
}
