//! The `tandem` binary as an operator first meets it: `--help` of every command describes
//! every argument, shell completions that the shell accepts, a manual page, and error
//! messages that name the file once and the OS error once.

mod common;

use common::*;
use std::process::Command;
use std::time::Duration;

fn tandem(args: &[&str]) -> Run {
    let mut cmd = Command::new(tandem_bin());
    cmd.args(args).env_remove("TANDEM_CONTROL");
    run(&mut cmd, Duration::from_secs(20))
}

/// The commands `tandem --help` lists.
fn commands() -> Vec<String> {
    let help = tandem(&["--help"]);
    help.expect_success();
    let listed: Vec<String> = help
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect();
    assert!(listed.len() >= 15, "{}", help.stdout);
    listed
}

/// What `-h` says of an argument on its line (`  <RESOURCE>  The resource ...`), less
/// clap's own bracketed notes (`[default: ...]`, `[possible values: ...]`).
fn description(line: &str) -> String {
    let Some((_, text)) = line.trim_start().split_once("  ") else {
        return String::new();
    };
    let mut out = String::new();
    let mut depth = 0;
    for c in text.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out.trim().to_string()
}

/// `tandem COMMAND -h` (one line per argument) has a description for every argument and
/// option, and the long `--help` says what `up` and `down` do.
#[test]
fn every_commands_help_describes_every_argument() {
    for command in commands() {
        let help = tandem(&[&command, "-h"]);
        help.expect_success();
        let mut in_args = false;
        let mut seen = 0;
        for line in help.stdout.lines() {
            if line == "Arguments:" || line == "Options:" {
                in_args = true;
                continue;
            }
            let first = line.trim_start().chars().next();
            if !in_args || !matches!(first, Some('-' | '<' | '[')) {
                continue;
            }
            seen += 1;
            assert!(
                !description(line).is_empty(),
                "`tandem {command} -h`: {line:?} has no description:\n{}",
                help.stdout
            );
        }
        assert!(seen >= 2, "no arguments found in:\n{}", help.stdout);
    }
    // What `up` and `down` do, said where an operator looks.
    let down = tandem(&["down", "--help"]);
    assert!(
        down.stdout.contains("stays on this node"),
        "{}",
        down.stdout
    );
    let up = tandem(&["up", "--help"]);
    assert!(up.stdout.contains("attaches nothing"), "{}", up.stdout);
}

/// `tandem completions SHELL`: a script for each shell; bash's passes `bash -n` and names
/// the commands (zsh and fish are checked the same way where they are installed).
#[test]
fn completions_are_scripts_the_shells_accept() {
    let dir = TestDir::new("usage::completions_are_scripts_the_shells_accept");
    for (shell, check) in [
        ("bash", &["-n"][..]),
        ("zsh", &["-n"][..]),
        ("fish", &["--no-execute"][..]),
    ] {
        let out = tandem(&["completions", shell]);
        out.expect_success();
        assert!(
            out.stdout.contains("tandem") && out.stdout.contains("events"),
            "{shell}: {}",
            out.stdout
        );
        let script = dir.join(format!("tandem.{shell}"));
        std::fs::write(&script, &out.stdout).unwrap();
        if shell != "bash" && find_tool(shell).is_none() {
            continue;
        }
        let mut cmd = tool(shell);
        cmd.args(check).arg(&script);
        let syntax = run(&mut cmd, Duration::from_secs(20));
        assert!(syntax.success(), "{shell}: {}", syntax.describe());
    }
    // Sourced, bash completes a command name.
    let mut bash = tool("bash");
    bash.arg("-c").arg(format!(
        "source {}; COMP_WORDS=(tandem eve); COMP_CWORD=1; _tandem tandem eve tandem; echo ${{COMPREPLY[@]}}",
        dir.join("tandem.bash").display()
    ));
    let done = run(&mut bash, Duration::from_secs(20));
    done.expect_success();
    assert_eq!(done.stdout.trim(), "events", "{}", done.describe());
    let bad = tandem(&["completions", "tcsh"]);
    assert!(!bad.success());
}

/// `tandem man`: a roff page (`.TH` after clap_mangen's string definitions) that groff
/// renders without a warning; `--dir` writes one page per command.
#[test]
fn man_prints_a_manual_page() {
    let man = tandem(&["man"]);
    man.expect_success();
    let first_macro = man
        .stdout
        .lines()
        .find(|l| !l.starts_with(".ie") && !l.starts_with(".el"))
        .unwrap_or("");
    assert!(first_macro.starts_with(".TH tandem 1"), "{}", man.stdout);
    for command in [r"tandem\-events", r"tandem\-status", r"tandem\-completions"] {
        assert!(man.stdout.contains(command), "{command}: {}", man.stdout);
    }
    if find_tool("groff").is_none() {
        skip(
            "usage::man_prints_a_manual_page (groff check)",
            "groff not installed",
        );
    } else {
        let dir = TestDir::new("usage::man_prints_a_manual_page");
        let page = dir.join("tandem.1");
        std::fs::write(&page, &man.stdout).unwrap();
        let mut groff = tool("groff");
        groff.args(["-man", "-Tutf8", "-ww", "-z"]).arg(&page);
        let r = run(&mut groff, Duration::from_secs(20));
        assert!(r.success() && r.stderr.is_empty(), "{}", r.describe());
    }
    let dir = TestDir::new("usage::man_prints_a_manual_page");
    let out = dir.join("man1");
    std::fs::create_dir(&out).unwrap();
    tandem(&["man", "--dir", out.to_str().unwrap()]).expect_success();
    for page in ["tandem.1", "tandem-events.1", "tandem-down.1"] {
        let text = std::fs::read_to_string(out.join(page)).unwrap();
        assert!(text.contains(".TH"), "{page}: {text}");
    }
    let events = std::fs::read_to_string(out.join("tandem-events.1")).unwrap();
    assert!(events.contains("timestamps"), "{events}");
}

/// An error names the file once and the OS error once: the control socket absent, the
/// configuration directory missing, and a replica whose backing file's directory is
/// missing (that one's `StorageError` carries the OS error in its own message and as its
/// source, and `{:#}` printed it twice, in the CLI and in `tandem status`).
#[test]
fn errors_name_the_os_error_once() {
    const ENOENT: &str = "No such file or directory (os error 2)";
    let dir = TestDir::new("usage::errors_name_the_os_error_once");
    let once = |what: &str, text: &str, names: &str| {
        assert_eq!(text.matches(ENOENT).count(), 1, "{what}: {text}");
        assert_eq!(text.matches(names).count(), 1, "{what}: {text}");
    };
    let absent = dir.join("absent.ctl");
    let r = tandem(&["status", "--control", absent.to_str().unwrap()]);
    assert!(!r.success());
    once("status, no daemon", &r.stderr, absent.to_str().unwrap());
    let missing = dir.join("no-such-dir");
    let r = tandem(&["check", "--config-dir", missing.to_str().unwrap()]);
    assert!(!r.success());
    once("check, no directory", &r.stderr, missing.to_str().unwrap());

    let config = dir.join("config");
    std::fs::create_dir(&config).unwrap();
    let disk = dir.join("gone/r0.img");
    std::fs::write(
        config.join("r0.toml"),
        format!(
            r#"[resource]
name = "r0"
shared-secret = "s3cret"
[[volume]]
number = 0
size = "4M"
[[node]]
name = "alpha"
node-id = 0
address = "127.0.0.93:7993"
  [[node.volume]]
  number = 0
  disk = "{}"
  nbd = []
[[node]]
name = "beta"
node-id = 1
address = "127.0.0.94:7994"
  [[node.volume]]
  number = 0
  disk = "/nowhere/r0.img"
  nbd = []
"#,
            disk.display()
        ),
    )
    .unwrap();
    let disk = disk.to_str().unwrap();
    let r = tandem(&[
        "dump-md",
        "r0",
        "--name",
        "alpha",
        "--config-dir",
        config.to_str().unwrap(),
    ]);
    assert!(!r.success());
    once("dump-md", &r.stderr, disk);
    let control = dir.join("alpha.ctl");
    let mut node = NodeDaemon::start("alpha", &config, &control, &dir.join("alpha.log"));
    node.wait_ready(Duration::from_secs(20));
    let status = node.admin(&["status"]);
    status.expect_success();
    once("status, not attached", &status.stdout, disk);
    assert!(status.stdout.contains("not attached"), "{}", status.stdout);
}
