//! Shell completions and man pages, generated from the clap definitions.
//!
//! Hidden subcommands (the `--isolate` worker) are left out of both: they are
//! the harness talking to itself, never typed by a user.

use clap::Command;
use clap_complete::Shell;
use std::{io::Write, path::Path};

/// The name users type, under which completions register.
const BIN: &str = "host-harness";

/// `command` without its hidden subcommands.
fn visible(command: &Command) -> Command {
    let mut shown = Command::new(command.get_name().to_owned())
        .args(command.get_arguments().cloned())
        .subcommands(command.get_subcommands().filter(|sub| !sub.is_hide_set()).cloned());
    if let Some(version) = command.get_version() {
        shown = shown.version(version.to_owned());
    }
    if let Some(about) = command.get_about() {
        shown = shown.about(about.clone());
    }
    if let Some(about) = command.get_long_about() {
        shown = shown.long_about(about.clone());
    }
    shown
}

/// Writes SHELL's completion script.
///
/// clap_complete's bash script labels its dispatch states one way while it
/// walks the words (`host__harness__subcmd__soak`) and another in its case
/// arms (`host__subcmd__harness__subcmd__soak`) when the binary's name has a
/// hyphen, so no subcommand's options would complete; the arms are renamed to
/// the walk's spelling.
pub fn completions(shell: Shell, command: &Command, out: &mut dyn Write) -> std::io::Result<()> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut visible(command), BIN, &mut script);
    let mut script = String::from_utf8(script).expect("clap_complete writes UTF-8");
    if shell == Shell::Bash {
        let escaped = BIN.replace('-', "__");
        script = script.replace(&BIN.replace('-', "__subcmd__"), &escaped);
    }
    out.write_all(script.as_bytes())
}

/// Writes the man page of the subcommand at `path` (the top-level page when
/// `path` is empty), or says which part of the path names no subcommand.
pub fn man_page(command: &Command, path: &[String], out: &mut dyn Write) -> Result<(), String> {
    let mut page = visible(command);
    page.build();
    let mut name = BIN.to_owned();
    for word in path {
        let sub = page
            .find_subcommand(word)
            .filter(|sub| !sub.is_hide_set())
            .ok_or_else(|| format!("no subcommand {word:?} under `{name}`: see `{name} --help`"))?
            .clone();
        name = format!("{name}-{}", sub.get_name());
        page = sub.name(name.clone());
    }
    clap_mangen::Man::new(page).render(out).map_err(|error| format!("cannot write the man page: {error}"))
}

/// Writes one page per command and subcommand into `directory`
/// (`host-harness.1`, `host-harness-soak.1`, `host-harness-lock-add.1`...).
pub fn man_pages(command: &Command, directory: &Path) -> Result<(), String> {
    std::fs::create_dir_all(directory)
        .map_err(|error| format!("cannot create {}: {error}", directory.display()))?;
    clap_mangen::generate_to(visible(command), directory)
        .map_err(|error| format!("cannot write the man pages to {}: {error}", directory.display()))
}
