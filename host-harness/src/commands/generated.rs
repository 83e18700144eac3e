//! Shell completions and man pages, generated from the clap definitions.
//! The `--isolate` worker is no subcommand (the harness talking to itself,
//! recognised before clap parses), so neither offers it.

use super::Failure;
use clap_complete::Shell;
use std::{io::Write, path::Path};

/// The name users type, under which completions register.
const BIN: &str = "host-harness";

/// Writes SHELL's completion script.
///
/// clap_complete's bash script labels its dispatch states one way while it
/// walks the words (`host__harness__subcmd__soak`) and another in its case
/// arms (`host__subcmd__harness__subcmd__soak`) when the binary's name has a
/// hyphen, so no subcommand's options would complete; the arms are renamed to
/// the walk's spelling.
pub fn completions(shell: Shell, out: &mut dyn Write) -> Result<(), Failure> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut crate::cli_command(), BIN, &mut script);
    let mut script = String::from_utf8(script).expect("clap_complete writes UTF-8");
    if shell == Shell::Bash {
        let escaped = BIN.replace('-', "__");
        script = script.replace(&BIN.replace('-', "__subcmd__"), &escaped);
    }
    out.write_all(script.as_bytes())
        .map_err(|error| Failure::Usage(format!("cannot write the completions: {error}")))
}

/// Writes the man page of the subcommand at `path` (the top-level page when
/// `path` is empty), or says which part of the path names no subcommand.
pub fn man_page(path: &[String], out: &mut dyn Write) -> Result<(), Failure> {
    let mut page = crate::cli_command();
    page.build();
    let mut name = BIN.to_owned();
    for word in path {
        let sub = page
            .find_subcommand(word)
            .ok_or_else(|| {
                Failure::Usage(format!("no subcommand {word:?} under `{name}`: see `{name} --help`"))
            })?
            .clone();
        name = format!("{name}-{}", sub.get_name());
        page = sub.name(name.clone());
    }
    clap_mangen::Man::new(page)
        .render(out)
        .map_err(|error| Failure::Usage(format!("cannot write the man page: {error}")))
}

/// Writes one page per command and subcommand into `directory`
/// (`host-harness.1`, `host-harness-soak.1`, `host-harness-lock-add.1`...).
pub fn man_pages(directory: &Path) -> Result<(), Failure> {
    std::fs::create_dir_all(directory)
        .map_err(|error| Failure::Usage(format!("cannot create {}: {error}", directory.display())))?;
    clap_mangen::generate_to(crate::cli_command(), directory).map_err(|error| {
        Failure::Usage(format!("cannot write the man pages to {}: {error}", directory.display()))
    })
}
