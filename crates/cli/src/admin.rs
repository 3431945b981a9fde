//! The administration verbs: a typed request on the node daemon's control socket, the
//! answer printed for a person (or as JSON).

use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};
use tandem_daemon::control_api::{Answer, Connection, Request, ResourceStatus};
use tandem_daemon::events::EventLine;

fn connect(control: &Path) -> Result<UnixStream> {
    UnixStream::connect(control).with_context(|| {
        format!(
            "cannot reach the node daemon at {} (is `tandem node` running?)",
            control.display()
        )
    })
}

/// The daemon's answer, refusals included.
fn ask(control: &Path, req: &Request) -> Result<Answer> {
    let mut s = connect(control)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let line = serde_json::to_string(req)?;
    s.write_all(format!("{line}\n").as_bytes())?;
    let mut line = String::new();
    BufReader::new(&s)
        .read_line(&mut line)
        .context("reading the daemon's answer")?;
    serde_json::from_str(&line).context("the daemon's answer is not one we understand")
}

fn request(control: &Path, req: &Request) -> Result<Answer> {
    settled(ask(control, req)?)
}

/// An answer, or its refusal as the error.
fn settled(answer: Answer) -> Result<Answer> {
    if !answer.ok {
        bail!(
            "{}",
            answer.error.as_deref().unwrap_or("the daemon refused")
        );
    }
    Ok(answer)
}

/// What `tandem events` prints.
pub struct EventsOptions {
    /// Only the dump, then exit.
    pub now: bool,
    pub json: bool,
    /// Each line prefixed with the time it arrived (`"time"` in JSON).
    pub timestamps: bool,
    /// The node adds its counters to the lines (`EventLine::statistics`).
    pub statistics: bool,
}

/// `tandem events`: the node's stream, printed line by line as it comes (flushed, so a
/// pipe sees each change at once) until the node closes it.
pub fn events(control: &Path, o: EventsOptions) -> Result<()> {
    let mut s = connect(control)?;
    let req = Request::Events {
        now: o.now,
        statistics: o.statistics,
    };
    let line = serde_json::to_string(&req)?;
    s.write_all(format!("{line}\n").as_bytes())?;
    let mut out = std::io::stdout().lock();
    for line in BufReader::new(&s).lines() {
        let line = line.context("reading the events stream")?;
        if let Ok(answer) = serde_json::from_str::<Answer>(&line) {
            bail!(
                "{}",
                answer.error.as_deref().unwrap_or("the daemon refused")
            );
        }
        let event: EventLine = serde_json::from_str(&line)
            .with_context(|| format!("an events line we do not understand: {line}"))?;
        let time = o.timestamps.then(crate::time::now_iso8601);
        match (o.json, time) {
            (true, None) => writeln!(out, "{line}")?,
            // The daemon's object with "time" first (its keys keep their order).
            (true, Some(t)) => match line.strip_prefix('{') {
                Some(rest) if rest.trim_start().starts_with('}') => {
                    writeln!(out, "{{\"time\":\"{t}\"{rest}")?
                }
                Some(rest) => writeln!(out, "{{\"time\":\"{t}\",{rest}")?,
                None => bail!("an events line that is not a JSON object: {line}"),
            },
            (false, None) => writeln!(out, "{}", event.text())?,
            (false, Some(t)) => writeln!(out, "{t} {}", event.text())?,
        }
        out.flush()?;
    }
    if !o.now {
        bail!("the node closed the events stream (it stopped, or this watcher fell behind)");
    }
    Ok(())
}

pub fn verb(control: &Path, req: Request) -> Result<()> {
    request(control, &req).map(|_| ())
}

/// `tandem primary` and `secondary`: refused for a moment only (a peer that just
/// connected has not yet said which Primary it follows, or listed what this node lacks;
/// a peer has not yet answered a change of the ids), it asks again, for up to 5 s; then
/// the refusal stands, with its reason.
pub fn role(control: &Path, req: Request) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let answer = ask(control, &req)?;
        if answer.momentary && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        return settled(answer).map(|_| ());
    }
}

/// `tandem adjust`: what the node did, one line per resource it changed or could not.
pub fn adjust(control: &Path) -> Result<()> {
    let answer = request(control, &Request::Adjust)?;
    if let Some(said) = answer.message {
        println!("{said}");
    }
    Ok(())
}

pub fn status(control: &Path, resource: Option<&str>, json: bool) -> Result<()> {
    let req = Request::Status {
        resource: resource.map(str::to_string),
    };
    let answer = request(control, &req)?;
    let resources = answer.resources.unwrap_or_default();
    if json {
        println!("{}", serde_json::to_string_pretty(&resources)?);
        return Ok(());
    }
    if let (Some(name), true) = (resource, resources.is_empty()) {
        bail!("no resource {name:?} on this node");
    }
    print!("{}", human(&resources));
    if let Some(f) = answer.files.filter(|f| f.near_limit()) {
        println!(
            "warning: the node holds {} open files of its limit {}: raise it (LimitNOFILE= in the systemd unit, or ulimit -n) before adding resources",
            f.open, f.limit
        );
    }
    Ok(())
}

/// ` done:37.5% (1.2 GiB of 3.2 GiB) rate:120 MiB/s eta:17s`, as far as it is known.
fn progress(p: &tandem_daemon::control_api::ResyncProgress) -> String {
    let mut s = format!(
        " done:{:.1}% ({} of {})",
        p.percent,
        crate::size::human_kib(p.done_kib),
        crate::size::human_kib(p.done_kib + p.left_kib)
    );
    if let Some(r) = p.rate_kib_s {
        s += &format!(" rate:{}/s", crate::size::human_kib(r));
    }
    if let Some(e) = p.eta_s {
        s += &format!(" eta:{e}s");
    }
    s
}

/// In the spirit of `drbdadm status`.
pub fn human(resources: &[ResourceStatus]) -> String {
    let mut out = String::new();
    for r in resources {
        if let Some(why) = &r.not_attached {
            out += &format!("{} not attached: {why}\n", r.name);
            continue;
        }
        out += &format!("{} role:{}\n", r.name, r.role);
        for v in &r.volumes {
            out += &format!("  volume:{} disk:{}", v.volume, v.disk);
            if let Some(kib) = v.resync_remaining_kib {
                out += &format!(" resync-remaining:{kib} KiB");
            }
            if let Some(p) = &v.resync {
                out += &progress(p);
                if let Some(from) = &p.peer {
                    out += &format!(" from:{from}");
                }
            }
            if let Some(q) = v.quorum.filter(|q| !q.quorate) {
                out += &format!(
                    " quorum:no (reaches {} of {} replicas, {} needed: a Primary fails or holds I/O, no promotion)",
                    q.reached, q.voters, q.needed
                );
            }
            if !v.up_to_date_within_reach {
                out += " (no up-to-date replica within reach: I/O fails until one returns; \
                        README \"No up-to-date replica\")";
            }
            out += "\n";
        }
        for p in &r.peers {
            if p.connection == Connection::Connected {
                out += &format!("  {} role:{}\n", p.name, p.role);
            } else {
                out += &format!("  {} connection:{}", p.name, p.connection);
                if let Some(e) = &p.last_error {
                    out += &format!(" ({e})");
                }
                out += "\n";
            }
            if let Some(sb) = &p.split_brain_resolved {
                out += &format!("    last split brain: {sb}\n");
            }
            for pv in &p.volumes {
                out += &format!(
                    "    volume:{} peer-disk:{} replication:{} out-of-sync:{} KiB",
                    pv.volume, pv.peer_disk, pv.replication, pv.out_of_sync_kib
                );
                if let Some(r) = &pv.resync {
                    out += &progress(r);
                    // A resync between that peer and a third node.
                    let itself = format!("{} (node-id {})", p.name, p.node_id);
                    if let Some(from) = r.peer.as_ref().filter(|f| **f != itself) {
                        out += &format!(" from:{from}");
                    }
                }
                out += "\n";
            }
        }
    }
    out
}
