//! The administration verbs: a request on the node daemon's control socket, the answer
//! printed for a person (or as JSON).

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

fn request(control: &Path, req: &Value) -> Result<Value> {
    let mut s = UnixStream::connect(control).with_context(|| {
        format!(
            "cannot reach the node daemon at {} (is `tandem node` running?)",
            control.display()
        )
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(format!("{req}\n").as_bytes())?;
    let mut line = String::new();
    BufReader::new(&s)
        .read_line(&mut line)
        .context("reading the daemon's answer")?;
    let v: Value = serde_json::from_str(&line).context("the daemon's answer is not JSON")?;
    if v.get("ok").and_then(Value::as_bool) != Some(true) {
        bail!(
            "{}",
            v.get("error")
                .and_then(Value::as_str)
                .unwrap_or("the daemon refused")
        );
    }
    Ok(v)
}

pub fn verb(control: &Path, req: Value) -> Result<()> {
    request(control, &req).map(|_| ())
}

pub fn status(control: &Path, resource: Option<&str>, json: bool) -> Result<()> {
    let v = request(
        control,
        &serde_json::json!({"cmd": "status", "resource": resource}),
    )?;
    let resources = v.get("resources").cloned().unwrap_or(Value::Array(vec![]));
    if json {
        println!("{}", serde_json::to_string_pretty(&resources)?);
        return Ok(());
    }
    if let (Some(name), Some(list)) = (resource, resources.as_array()) {
        if list.is_empty() {
            bail!("no resource {name:?} on this node");
        }
    }
    print!("{}", human(&resources));
    Ok(())
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("?")
}

/// In the spirit of `drbdadm status`.
pub fn human(resources: &Value) -> String {
    let mut out = String::new();
    for r in resources.as_array().into_iter().flatten() {
        out += &format!("{} role:{}\n", s(r, "name"), s(r, "role"));
        for v in r["volumes"].as_array().into_iter().flatten() {
            out += &format!("  volume:{} disk:{}", v["volume"], s(v, "disk"));
            if let Some(kib) = v["resync_remaining_kib"].as_u64() {
                out += &format!(" resync-remaining:{kib} KiB");
            }
            if v["up_to_date_within_reach"] == false {
                out += " (no up-to-date replica within reach: I/O fails until one returns; \
                        README \"No up-to-date replica\")";
            }
            out += "\n";
        }
        for p in r["peers"].as_array().into_iter().flatten() {
            let conn = s(p, "connection");
            if conn == "Connected" {
                out += &format!("  {} role:{}\n", s(p, "name"), s(p, "role"));
            } else {
                out += &format!("  {} connection:{}", s(p, "name"), conn);
                if let Some(e) = p["last_error"].as_str() {
                    out += &format!(" ({e})");
                }
                out += "\n";
            }
            for pv in p["volumes"].as_array().into_iter().flatten() {
                out += &format!(
                    "    volume:{} peer-disk:{} replication:{} out-of-sync:{} KiB\n",
                    pv["volume"],
                    s(pv, "peer_disk"),
                    s(pv, "replication"),
                    pv["out_of_sync_kib"]
                );
            }
        }
    }
    out
}
