//! `tandem`: replicated block storage in user space.

mod admin;
mod check;
mod size;
mod time;

use anyhow::{bail, Context, Result};
use clap::{CommandFactory, Parser, Subcommand};
use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use tandem_daemon::control_api::Request;
use tandem_daemon::{ExportConfig, ListenAddr, ServeConfig};

#[derive(Parser)]
#[command(
    name = "tandem",
    version,
    about = "Replicated block storage in user space, served over NBD"
)]
struct Cli {
    /// Log filter (tracing env-filter syntax); RUST_LOG overrides it.
    #[arg(long, global = true, default_value = "info")]
    log: String,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Export local files or block devices over NBD (one node, no replication).
    Serve(ServeArgs),
    /// Run the node daemon: replicate the resources that name this node.
    Node(NodeArgs),
    /// Validate the resource files offline: every error at once, and (with --name) whether
    /// that node is in any of them.
    Check {
        /// Directory holding one TOML file per resource.
        #[arg(long, default_value = "/etc/tandem")]
        config_dir: PathBuf,
        /// The node that would start on them.
        #[arg(long)]
        name: Option<String>,
    },
    /// Watch the node: every resource, device, connection and peer device as it exists,
    /// `exists -`, then a line per change (like `drbdsetup events2`).
    Events {
        /// Only what exists now, then exit.
        #[arg(long)]
        now: bool,
        /// One JSON object per line (the daemon's own lines, as they come).
        #[arg(long)]
        json: bool,
        /// Prefix each line with the time it arrived (ISO 8601, local time with
        /// microseconds and the UTC offset, as drbdsetup events2 does); with --json, a
        /// "time" field.
        #[arg(long)]
        timestamps: bool,
        /// Add the counters the node measures (device: size, upper-pending; connection:
        /// pending; peer device: out-of-sync, and while it resyncs done, dbdt1, eta), and a
        /// line when only they changed (at most one a second per resource).
        #[arg(long)]
        statistics: bool,
        #[command(flatten)]
        control: ControlArg,
    },
    /// Show resources, roles, disks and peers (like `drbdadm status`).
    Status {
        /// Only this resource (default: every resource of the node).
        resource: Option<String>,
        /// The whole status as JSON, for scripts (every field the daemon reports).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        control: ControlArg,
    },
    /// Make this node Primary for a resource.
    Primary {
        /// The resource (its name in the resource files).
        resource: String,
        /// Declare this node's replicas up to date first (choose the sync source).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        control: ControlArg,
    },
    /// Make this node Secondary for a resource (refused while NBD clients are attached).
    Secondary {
        /// The resource (its name in the resource files).
        resource: String,
        /// Even with NBD clients attached: their requests in flight and later ones fail
        /// with EIO.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        control: ControlArg,
    },
    /// (Re)connect to a peer, or to all peers.
    ///
    /// Ends StandAlone (after `tandem disconnect` or `down`) and a split brain that stopped
    /// the connection, and dials at once.
    Connect {
        /// The resource (its name in the resource files).
        resource: String,
        /// Only this peer (its node name in the resource file); default: every peer.
        peer: Option<String>,
        /// The next split brain found with the peer (every peer, without one) discards
        /// this node's changes: they are pulled back from the peer (DRBD's
        /// `--discard-my-data`). Refused on a Primary: demote first.
        #[arg(long)]
        discard_my_data: bool,
        #[command(flatten)]
        control: ControlArg,
    },
    /// Disconnect from a peer, or from all peers, and stay StandAlone.
    ///
    /// Until `tandem connect` (or `up`); the peer is not dialed and its dials are refused.
    /// Writes meanwhile are marked out of sync and resynced when it is connected again.
    Disconnect {
        /// The resource (its name in the resource files).
        resource: String,
        /// Only this peer (its node name in the resource file); default: every peer.
        peer: Option<String>,
        #[command(flatten)]
        control: ControlArg,
    },
    /// Connect a resource to all its peers (`tandem connect RESOURCE`).
    ///
    /// Every resource that names this node runs from the node's start to its stop: unlike
    /// `drbdadm up`, this attaches nothing and starts nothing. It ends StandAlone towards
    /// every peer (after `tandem down` or `disconnect`) and a split brain that stopped a
    /// connection, and dials them at once. A resource whose replica could not be attached
    /// at start stays down: fix it and restart the node.
    Up {
        /// The resource (its name in the resource files).
        resource: String,
        #[command(flatten)]
        control: ControlArg,
    },
    /// Disconnect a resource from all its peers (`tandem disconnect RESOURCE`).
    ///
    /// Unlike `drbdadm down`, the resource stays on this node: its replica stays attached,
    /// its NBD export keeps serving and its role is kept; only its connections go, and
    /// it stays StandAlone (no dials out, dials in refused) until `tandem up` or `connect`.
    /// Writes meanwhile are marked out of sync for the peers and resynced when they are
    /// connected again. To take a resource off this node, stop the node (`tandem node`
    /// serves every resource that names it).
    Down {
        /// The resource (its name in the resource files).
        resource: String,
        #[command(flatten)]
        control: ControlArg,
    },
    /// Print a replica's metadata as JSON (superblock, generation ids, bitmap slots,
    /// activity log).
    DumpMd(ReplicaArg),
    /// Print a replica's generation ids and flags.
    ShowGi(ReplicaArg),
    /// Write new metadata for a replica whose node is not running (`--force` over metadata
    /// that is there, valid or not: the replica is then resynced in full).
    CreateMd {
        #[command(flatten)]
        replica: ReplicaArg,
        /// Over metadata that is there, valid or not.
        #[arg(long)]
        force: bool,
    },
    /// Throw away a replica and resync it in full from an up-to-date peer: on the running
    /// node (through its control socket), or, with `--name`, one whose node is stopped (its
    /// next start resyncs it; it serves nothing before).
    Invalidate {
        /// The resource (its name in the resource files).
        resource: String,
        /// The stopped node whose replica it is (without it: the running node's, through
        /// `--control`).
        #[arg(long)]
        name: Option<String>,
        /// The volume's number in the resource file.
        #[arg(long, default_value_t = 0)]
        volume: u16,
        /// Directory holding one TOML file per resource (with `--name`).
        #[arg(long, default_value = "/etc/tandem")]
        config_dir: PathBuf,
        #[command(flatten)]
        control: ControlArg,
    },
    /// Read the resource files again and apply what changed while the node runs: a new
    /// resource starts; a running one takes a new protocol, timeouts, resync rates and
    /// after-split-brain policies; one removed from the files stops (unless it is Primary
    /// or has NBD clients here). Anything else (secret, volumes, nodes, quorum) is named as
    /// needing a restart, and nothing of that resource changes. The same as sending SIGHUP
    /// to `tandem node`.
    Adjust {
        #[command(flatten)]
        control: ControlArg,
    },
    /// Print a shell completion script to stdout.
    ///
    /// bash: `tandem completions bash > /etc/bash_completion.d/tandem`;
    /// zsh: `tandem completions zsh > "${fpath[1]}/_tandem"`;
    /// fish: `tandem completions fish > ~/.config/fish/completions/tandem.fish`.
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) to stdout, or write one per command into a directory.
    ///
    /// `tandem man | man -l -`, or `tandem man --dir /usr/local/share/man/man1` for
    /// tandem.1 and a tandem-COMMAND.1 for each command.
    Man {
        /// Write tandem.1 and tandem-COMMAND.1 for every command here instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

/// One node's replica of one volume, found through the resource files.
#[derive(clap::Args)]
struct ReplicaArg {
    /// The resource (its name in the resource files).
    resource: String,
    /// The node whose replica it is.
    #[arg(long)]
    name: String,
    /// The volume's number in the resource file.
    #[arg(long, default_value_t = 0)]
    volume: u16,
    /// Directory holding one TOML file per resource.
    #[arg(long, default_value = "/etc/tandem")]
    config_dir: PathBuf,
}

#[derive(clap::Args)]
struct ControlArg {
    /// The node daemon's control socket.
    #[arg(long, env = "TANDEM_CONTROL", default_value = "/run/tandem/tandem.ctl")]
    control: PathBuf,
}

#[derive(clap::Args)]
struct BusyPollArg {
    /// Microseconds to keep polling for more work after handling some, before sleeping:
    /// trades CPU while busy for latency (a sleeping process is slow to wake, above all in
    /// virtual machines). 0 turns it off; an idle daemon never spins.
    #[arg(long, default_value_t = 50, value_name = "MICROSECONDS",
          value_parser = clap::value_parser!(u64).range(0..=10_000))]
    busy_poll_us: u64,
}

impl BusyPollArg {
    fn window(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.busy_poll_us)
    }
}

#[derive(clap::Args)]
struct NodeArgs {
    /// This node's name in the resource files.
    #[arg(long)]
    name: String,
    /// Directory holding one TOML file per resource.
    #[arg(long, default_value = "/etc/tandem")]
    config_dir: PathBuf,
    #[command(flatten)]
    control: ControlArg,
    /// Threads for blocking disk operations (fdatasync, reads not in the page cache).
    #[arg(long, default_value_t = 8)]
    disk_threads: usize,
    #[command(flatten)]
    busy_poll: BusyPollArg,
    /// For benchmarks only: no activity-log transactions and no "consistent" mark while
    /// running, the ceiling metadata writes are measured against. A crash or kill -9 of
    /// this node then costs a full resync of its replicas (a clean stop costs nothing).
    #[arg(long)]
    unsafe_no_activity_log: bool,
    /// Serve Prometheus metrics on http://ADDR/metrics (e.g. 127.0.0.1:9942), and a live
    /// status page on http://ADDR/. Overrides the `metrics` key of this node's [[node]]
    /// table in the resource files; without either, neither is served.
    #[arg(long, value_name = "IP:PORT")]
    metrics: Option<SocketAddr>,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Exports as [NAME=]PATH. NAME defaults to the file name without extension; the first
    /// export is also the default export (the empty name).
    #[arg(required = true, value_name = "EXPORT")]
    exports: Vec<String>,
    /// Size of files that do not exist yet (created sparse), e.g. 1G, 512M. An existing file
    /// must already have this size.
    #[arg(long, value_parser = size::parse)]
    size: Option<u64>,
    /// Refuse writes, trims and zeroing with EPERM.
    #[arg(long)]
    read_only: bool,
    /// Open backing stores with O_DIRECT (bypass the page cache).
    #[arg(long)]
    direct: bool,
    /// Listen on this Unix socket.
    #[arg(long, value_name = "PATH")]
    socket: Vec<PathBuf>,
    /// Listen on this TCP address. Default 127.0.0.1:10809 when no --socket or --listen is given.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Vec<SocketAddr>,
    /// Minimum block size advertised to clients that ask for block sizes and enforced on
    /// their requests. Other clients may address single bytes: requests not aligned to it
    /// are served by reading (and for writes rewriting) the whole blocks they touch.
    #[arg(long, default_value_t = 512)]
    block_size: u32,
    /// Description shown to clients (nbdinfo).
    #[arg(long, default_value = "")]
    description: String,
    /// Threads for blocking disk operations (fdatasync, reads not in the page cache,
    /// O_DIRECT I/O).
    #[arg(long, default_value_t = 8)]
    disk_threads: usize,
    #[command(flatten)]
    busy_poll: BusyPollArg,
    /// TLS for clients (NBD_OPT_STARTTLS, X.509): off; on (clients that ask get TLS, the
    /// others are served in the clear); require (nothing but STARTTLS before TLS).
    /// TLS-PSK is not supported (rustls has no external pre-shared keys).
    #[arg(long, value_enum, default_value_t = TlsArg::Off)]
    tls: TlsArg,
    /// The server's certificate chain (PEM, leaf first); its subject alternative names must
    /// hold the host name or address clients connect to. Needed with --tls=on|require.
    #[arg(long, value_name = "PEM")]
    tls_certificate: Option<PathBuf>,
    /// The server certificate's private key (PEM).
    #[arg(long, value_name = "PEM")]
    tls_key: Option<PathBuf>,
    /// Mutual authentication: clients must present a certificate this CA (PEM) signed.
    #[arg(long, value_name = "PEM")]
    tls_client_ca: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum TlsArg {
    Off,
    On,
    Require,
}

fn main() {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&cli.log))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
    let result = match cli.command {
        Cmd::Serve(args) => serve(args),
        Cmd::Node(a) => tandem_daemon::node::run(tandem_daemon::node::NodeOptions {
            node: a.name,
            config_dir: a.config_dir,
            control: a.control.control,
            disk_threads: a.disk_threads.max(1),
            busy_poll: a.busy_poll.window(),
            activity_log: !a.unsafe_no_activity_log,
            metrics: a.metrics,
        }),
        Cmd::Check { config_dir, name } => check::check(&config_dir, name.as_deref()),
        Cmd::Events {
            now,
            json,
            timestamps,
            statistics,
            control,
        } => admin::events(
            &control.control,
            admin::EventsOptions {
                now,
                json,
                timestamps,
                statistics,
            },
        ),
        Cmd::Status {
            resource,
            json,
            control,
        } => admin::status(&control.control, resource.as_deref(), json),
        Cmd::Primary {
            resource,
            force,
            control,
        } => admin::role(&control.control, Request::Primary { resource, force }),
        Cmd::Secondary {
            resource,
            force,
            control,
        } => admin::role(&control.control, Request::Secondary { resource, force }),
        Cmd::Connect {
            resource,
            peer,
            discard_my_data,
            control,
        } => admin::verb(
            &control.control,
            Request::Connect {
                resource,
                peer,
                discard_my_data,
            },
        ),
        Cmd::Disconnect {
            resource,
            peer,
            control,
        } => admin::verb(&control.control, Request::Disconnect { resource, peer }),
        Cmd::Up { resource, control } => admin::verb(&control.control, Request::Up { resource }),
        Cmd::DumpMd(r) => tandem_daemon::node::dump_md(&r.config_dir, &r.resource, &r.name, r.volume)
            .map(|d| println!("{}", serde_json::to_string_pretty(&d).expect("a dump serialises"))),
        Cmd::ShowGi(r) => tandem_daemon::node::dump_md(&r.config_dir, &r.resource, &r.name, r.volume)
            .map(|d| print!("{}", d.show_gi())),
        Cmd::CreateMd { replica: r, force } => {
            tandem_daemon::node::create_md(&r.config_dir, &r.resource, &r.name, r.volume, force)
                .map(|t| println!("new metadata on {t}; this replica is resynced in full from an up-to-date peer when its node starts (if no other replica can prove it is current, `tandem primary --force` on the one you trust)"))
        }
        Cmd::Invalidate {
            resource,
            name: Some(name),
            volume,
            config_dir,
            ..
        } => tandem_daemon::node::invalidate(&config_dir, &resource, &name, volume)
            .map(|t| println!("invalidated the replica of {resource} volume {volume} on node {name} (metadata on {t}): when the node starts it is resynced in full from an up-to-date peer, and serves nothing before")),
        Cmd::Invalidate {
            resource,
            name: None,
            volume,
            control,
            ..
        } => admin::verb(&control.control, Request::Invalidate { resource, volume }),
        Cmd::Adjust { control } => admin::adjust(&control.control),
        Cmd::Down { resource, control } => {
            admin::verb(&control.control, Request::Down { resource })
        }
        Cmd::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "tandem", &mut std::io::stdout());
            Ok(())
        }
        Cmd::Man { dir } => man(dir.as_deref()),
    };
    if let Err(e) = result {
        eprintln!("tandem: error: {}", tandem_daemon::error_chain(&e));
        std::process::exit(1);
    }
}

/// `tandem man`: the top page to stdout, or every command's page into `dir`.
fn man(dir: Option<&std::path::Path>) -> Result<()> {
    let cmd = Cli::command();
    match dir {
        Some(dir) => clap_mangen::generate_to(cmd, dir)
            .with_context(|| format!("writing the manual pages into {}", dir.display())),
        None => {
            let mut out = std::io::stdout().lock();
            clap_mangen::Man::new(cmd).render(&mut out)?;
            Ok(out.flush()?)
        }
    }
}

fn serve(args: ServeArgs) -> Result<()> {
    if args.disk_threads == 0 {
        bail!("--disk-threads must be at least 1");
    }
    let mut exports = Vec::new();
    for spec in &args.exports {
        let (name, path) = match spec.split_once('=') {
            Some((name, path)) => (name.to_string(), PathBuf::from(path)),
            None => {
                let path = PathBuf::from(spec);
                let name = path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                (name, path)
            }
        };
        if name.is_empty() || name.len() > 4096 || name.contains('\0') {
            bail!("export {spec:?}: the name must be 1 to 4096 bytes without NUL");
        }
        exports.push(ExportConfig {
            name,
            path,
            description: args.description.clone(),
            size: args.size,
            read_only: args.read_only,
            direct: args.direct,
            min_block: args.block_size,
        });
    }
    let mut listen: Vec<ListenAddr> = args.listen.iter().map(|a| ListenAddr::Tcp(*a)).collect();
    listen.extend(args.socket.iter().cloned().map(ListenAddr::Unix));
    if listen.is_empty() {
        listen.push(ListenAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 10809))));
    }
    tandem_daemon::serve::run(ServeConfig {
        exports,
        listen,
        disk_threads: args.disk_threads,
        busy_poll: args.busy_poll.window(),
        tls: serve_tls(&args)?,
    })
}

/// `--tls` and its files, checked for what belongs together (the files are read at start).
fn serve_tls(args: &ServeArgs) -> Result<Option<tandem_daemon::tls::NbdTlsConfig>> {
    use tandem_daemon::tls::{CertFiles, NbdTlsConfig, TlsMode};
    let mode = match args.tls {
        TlsArg::Off => {
            if args.tls_certificate.is_some()
                || args.tls_key.is_some()
                || args.tls_client_ca.is_some()
            {
                bail!("--tls-certificate, --tls-key and --tls-client-ca need --tls=on or --tls=require");
            }
            return Ok(None);
        }
        TlsArg::On => TlsMode::On,
        TlsArg::Require => TlsMode::Require,
    };
    let (Some(certificate), Some(key)) = (&args.tls_certificate, &args.tls_key) else {
        bail!("--tls=on|require needs the server's --tls-certificate and --tls-key");
    };
    Ok(Some(NbdTlsConfig {
        mode,
        files: CertFiles {
            certificate: certificate.clone(),
            key: key.clone(),
        },
        client_ca: args.tls_client_ca.clone(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command and every argument of every command says what it is: one added
    /// without a doc comment fails here.
    fn undocumented(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        if cmd.get_about().is_none() {
            out.push(format!("command `{path}`"));
        }
        for arg in cmd.get_arguments() {
            let help = arg.get_help().or(arg.get_long_help());
            if help.is_none_or(|h| h.to_string().trim().is_empty()) {
                out.push(format!("`{path}` argument {}", arg.get_id()));
            }
        }
        for sub in cmd.get_subcommands() {
            undocumented(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    #[test]
    fn every_command_and_argument_has_help() {
        let cmd = Cli::command();
        cmd.clone().debug_assert();
        let mut missing = Vec::new();
        undocumented(&cmd, "tandem", &mut missing);
        assert!(missing.is_empty(), "without help: {missing:#?}");
        // The walk sees the subcommands' own arguments (flattened ones included).
        let status = cmd.find_subcommand("status").unwrap();
        let ids: Vec<_> = status
            .get_arguments()
            .map(|a| a.get_id().as_str())
            .collect();
        for id in ["resource", "json", "control"] {
            assert!(ids.contains(&id), "{ids:?}");
        }
    }
}
