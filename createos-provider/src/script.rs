//! The bash script `execute` sends as `/bin/bash -lc SCRIPT`.
//!
//! Reference shape (see `createos-api.md`, "Managed processes"):
//!
//! ```text
//! cd -- '<cwd>' || exit
//! exec env -- 'K=v' ... '<cmd>' '<arg>' ... < '<stdin file>'
//! ```
//!
//! - Every word is single-quoted; a `'` inside is written `'"'"'`. Nothing
//!   else is special inside single quotes, so `$(...)`, backticks, `\`,
//!   newlines and globs reach the command byte for byte.
//! - `env --` ends `env`'s options, so a command starting with `-` is not
//!   taken for one.
//! - `env` takes every word containing `=` for an assignment, so a command
//!   containing `=` is started through `/bin/sh -c 'exec "$0" "$@"'`, which
//!   runs its `$0` as the command (after `env` applied the variables).
//! - Standard input is the staged file when there is one, else `/dev/null`:
//!   a command never waits on an input nobody will send.
//! - Env names must match `^[A-Za-z_][A-Za-z0-9_]*$`; no word may contain a
//!   NUL byte (it cannot cross `execve`). Both are checked by [`validate`]
//!   before any request.

use crate::error::Error;

/// Where standard input comes from when the caller gives none.
pub const NO_STDIN: &str = "/dev/null";

/// Largest script: it travels as one `execve` argument, and Linux refuses
/// an argument of 128 KiB or more (`MAX_ARG_STRLEN`, NUL included) before
/// the command could report anything. Large data goes through stdin.
pub const MAX_SCRIPT_BYTES: usize = 128 * 1024 - 1;

/// What the script runs.
#[derive(Debug, Clone, Copy)]
pub struct ScriptSpec<'a> {
    /// Working directory.
    pub cwd: &'a str,
    /// The program (looked up in `PATH` unless it contains a `/`).
    pub command: &'a str,
    /// Its arguments.
    pub args: &'a [&'a str],
    /// Extra environment variables, in order (a later one wins).
    pub env: &'a [(&'a str, &'a str)],
    /// The staged standard input file; `/dev/null` when `None`.
    pub stdin_path: Option<&'a str>,
}

/// True when `name` matches `^[A-Za-z_][A-Za-z0-9_]*$`.
pub fn is_valid_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Checks a spec before any request: a non-empty command, valid env names,
/// no NUL byte anywhere.
pub fn validate(spec: &ScriptSpec<'_>) -> Result<(), Error> {
    if spec.command.is_empty() {
        return Err(Error::invalid_input("CreateOS command must not be empty."));
    }
    if let Some((name, _)) = spec.env.iter().find(|(name, _)| !is_valid_env_name(name)) {
        // The name is user input: keep it out of the message unless it is
        // short and printable.
        let shown = if name.len() <= 64 && name.chars().all(|c| c.is_ascii_graphic()) {
            format!(" {name:?}")
        } else {
            String::new()
        };
        return Err(Error::invalid_input(format!(
            "CreateOS environment variable name{shown} is invalid: names must match ^[A-Za-z_][A-Za-z0-9_]*$."
        )));
    }
    let nul = |s: &str| s.contains('\0');
    // The places a NUL may hide, in the order they are checked.
    let places = [
        (nul(spec.cwd), "working directory"),
        (nul(spec.command) || spec.args.iter().any(|a| nul(a)), "command and arguments"),
        (spec.env.iter().any(|(_, value)| nul(value)), "environment variable values"),
        (spec.stdin_path.is_some_and(nul), "stdin path"),
    ];
    match places.into_iter().find(|(found, _)| *found) {
        Some((_, place)) => {
            Err(Error::invalid_input(format!("CreateOS {place} must not contain a NUL byte.")))
        }
        None => Ok(()),
    }
}

/// [`validate`]s the spec and [`build`]s the script, refusing one that
/// cannot be passed to bash. Sends nothing.
pub fn render(spec: &ScriptSpec<'_>) -> Result<String, Error> {
    validate(spec)?;
    let script = build(spec);
    if script.len() > MAX_SCRIPT_BYTES {
        return Err(Error::invalid_input(format!(
            "CreateOS command is too long: its quoted arguments, environment and working directory take {} bytes, more than {MAX_SCRIPT_BYTES}; pass large data through stdin.",
            script.len()
        )));
    }
    Ok(script)
}

/// Single-quotes one word for bash: `'` becomes `'"'"'`.
pub fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r#"'"'"'"#))
}

/// Builds the script. Call [`validate`] first: this function does not check.
pub fn build(spec: &ScriptSpec<'_>) -> String {
    let env = spec.env.iter().map(|(name, value)| quote(&format!("{name}={value}")));
    // `env` would take a command containing `=` for an assignment.
    let shim = spec.command.contains('=').then(|| r#"/bin/sh -c 'exec "$0" "$@"'"#.to_owned());
    let command = [spec.command].into_iter().chain(spec.args.iter().copied()).map(quote);
    let words: Vec<String> = env.chain(shim).chain(command).collect();
    let (cwd, stdin) = (quote(spec.cwd), quote(spec.stdin_path.unwrap_or(NO_STDIN)));
    format!("cd -- {cwd} || exit\nexec env -- {} < {stdin}", words.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use std::process::Command;

    fn spec<'a>(
        cwd: &'a str,
        command: &'a str,
        args: &'a [&'a str],
        env: &'a [(&'a str, &'a str)],
    ) -> ScriptSpec<'a> {
        ScriptSpec { cwd, command, args, env, stdin_path: None }
    }

    #[test]
    fn quoting() {
        assert_eq!(quote(""), "''");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), "'it'\"'\"'s'");
        assert_eq!(quote("'"), "''\"'\"''");
    }

    #[test]
    fn reference_shape() {
        let s = ScriptSpec {
            cwd: "/paperclip-workspace",
            command: "echo",
            args: &["a'b", "$(x)"],
            env: &[("K", "v w")],
            stdin_path: Some("/tmp/.paperclip-stdin-1"),
        };
        assert_eq!(
            build(&s),
            "cd -- '/paperclip-workspace' || exit\n\
             exec env -- 'K=v w' 'echo' 'a'\"'\"'b' '$(x)' < '/tmp/.paperclip-stdin-1'"
        );
        let s = spec("/w", "true", &[], &[]);
        assert_eq!(build(&s), "cd -- '/w' || exit\nexec env -- 'true' < '/dev/null'");
    }

    #[test]
    fn env_names() {
        for ok in ["A", "_", "a_1", "PATH", "_X9"] {
            assert!(is_valid_env_name(ok), "{ok}");
        }
        for bad in ["", "1A", "A-B", "A=B", "A B", "É", "A\n", "$A", "A\0"] {
            assert!(!is_valid_env_name(bad), "{bad:?}");
            let env = [(bad, "v")];
            let err = validate(&spec("/w", "true", &[], &env)).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::INVALID_INPUT);
            assert!(!err.to_string().contains('\n'));
        }
    }

    #[test]
    fn validation_rejects_nul_and_empty_commands() {
        let cases = [
            spec("/w", "", &[], &[]),
            spec("/w\0", "true", &[], &[]),
            spec("/w", "tr\0ue", &[], &[]),
            spec("/w", "true", &["a\0"], &[]),
            spec("/w", "true", &[], &[("A", "\0")]),
        ];
        for case in cases {
            assert_eq!(validate(&case).unwrap_err().kind(), ErrorKind::INVALID_INPUT);
        }
        assert!(validate(&spec("/w", "true", &["", "x"], &[("A", "")])).is_ok());
    }

    /// Linux's `MAX_ARG_STRLEN` (`include/uapi/linux/binfmts.h`: 32 pages of
    /// 4 KiB): the longest single `execve` argument, its NUL included. The
    /// script travels as one such argument (`bash -lc SCRIPT`).
    const LINUX_MAX_ARG_STRLEN: usize = 131_072;

    /// A spec whose script is exactly `len` bytes: `echo` and one plain
    /// argument padded to fit.
    fn script_of_len(len: usize) -> String {
        let overhead = build(&spec("/", "echo", &[""], &[])).len();
        "a".repeat(len - overhead)
    }

    #[test]
    fn the_script_limit_is_linuxs_argument_limit() {
        // (script bytes, fits in one execve argument)
        let cases = [
            (LINUX_MAX_ARG_STRLEN - 2, true),
            (LINUX_MAX_ARG_STRLEN - 1, true),
            (LINUX_MAX_ARG_STRLEN, false),
            (LINUX_MAX_ARG_STRLEN + 1, false),
        ];
        for (len, fits) in cases {
            let filler = script_of_len(len);
            let args = [filler.as_str()];
            let spec = spec("/", "echo", &args, &[]);
            let script = build(&spec);
            assert_eq!(script.len(), len);
            match render(&spec) {
                Ok(rendered) => {
                    assert!(fits, "a {len}-byte script must be refused before any request");
                    assert_eq!(rendered, script);
                }
                Err(err) => {
                    assert!(!fits, "a {len}-byte script fits: {err}");
                    assert_eq!(err.kind(), ErrorKind::INVALID_INPUT);
                    assert!(err.to_string().contains(&format!("take {len} bytes")), "{err}");
                }
            }
            // The kernel draws the same line: bash runs the longest script
            // render accepts and execve refuses the shortest it refuses.
            let ran = Command::new("/bin/bash").arg("-c").arg(&script).env_clear().output();
            match ran {
                Ok(out) => {
                    assert!(fits, "execve took a {len}-byte argument");
                    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
                    assert_eq!(out.stdout.len(), filler.len() + 1);
                }
                Err(err) => {
                    assert!(!fits, "{len}: {err}");
                    assert_eq!(err.kind(), std::io::ErrorKind::ArgumentListTooLong, "{len}: {err}");
                }
            }
        }
    }

    #[test]
    fn quoting_counts_toward_the_limit() {
        // 30,000 quotes are 30,000 bytes of argument but 150,000 of script.
        let quotes = "'".repeat(30_000);
        let err = render(&spec("/w", "echo", &[&quotes], &[])).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::INVALID_INPUT);
        assert!(err.to_string().contains("pass large data through stdin"), "{err}");
    }

    #[test]
    fn an_invalid_env_name_is_shown_only_when_short_and_printable() {
        let hidden_tail =
            "CreateOS environment variable name is invalid: names must match ^[A-Za-z_][A-Za-z0-9_]*$.";
        let sixty_four = format!("-{}", "A".repeat(63));
        let sixty_five = format!("-{}", "A".repeat(64));
        // (invalid name, shown in the message)
        let cases: [(&str, bool); 14] = [
            ("1A", true),
            ("A-B", true),
            ("X=Y", true),
            ("$(id)", true),
            ("\"quoted\"", true),
            ("", true),
            (&sixty_four, true),
            (&sixty_five, false),
            ("A B", false),
            ("A\n", false),
            ("A\t", false),
            ("\x1b[31mred", false),
            ("\u{7f}", false),
            ("É", false),
        ];
        for (name, shown) in cases {
            let env = [(name, "v")];
            let message = validate(&spec("/w", "true", &[], &env)).unwrap_err().to_string();
            let expected = if shown {
                format!(
                    "CreateOS environment variable name {name:?} is invalid: names must match ^[A-Za-z_][A-Za-z0-9_]*$."
                )
            } else {
                hidden_tail.to_string()
            };
            assert_eq!(message, expected, "{name:?}");
        }
    }

    /// Runs the script with the real bash and returns what `printf '%s\0'`
    /// printed (each argument, NUL-terminated) and the exit status.
    fn run(script: &str) -> (Vec<u8>, Vec<u8>, Option<i32>) {
        let out = Command::new("/bin/bash")
            .arg("-c")
            .arg(script)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .output()
            .expect("bash runs");
        (out.stdout, out.stderr, out.status.code())
    }

    fn split_nul(bytes: &[u8]) -> Vec<String> {
        let mut parts: Vec<String> =
            bytes.split(|b| *b == 0).map(|p| String::from_utf8(p.to_vec()).unwrap()).collect();
        assert_eq!(parts.pop().as_deref(), Some(""), "NUL-terminated");
        parts
    }

    fn hostile() -> Vec<String> {
        vec![
            String::new(),
            "'".into(),
            "''".into(),
            "\"".into(),
            "it's \"quoted\"".into(),
            "$(touch /tmp/pwned-createos)".into(),
            "`touch /tmp/pwned-createos`".into(),
            "${HOME}$PATH$$!*?[a-z]~".into(),
            "line1\nline2\r\n\t".into(),
            "\\'\\\"\\\\".into(),
            "-n".into(),
            "--".into(),
            "a=b".into(),
            "; exit 7 #".into(),
            "'\"'\"'".into(),
            "é ü 日本 🦀".into(),
            "\x01\x1b[31m\x7f".into(),
            "x'".repeat(5_000),
            "a".repeat(40_000),
        ]
    }

    #[test]
    fn bash_receives_args_byte_exact() {
        let args = hostile();
        let mut all: Vec<&str> = vec!["%s\\0"];
        all.extend(args.iter().map(String::as_str));
        let script = build(&spec("/", "printf", &all[..], &[]));
        let (stdout, stderr, code) = run(&script);
        assert_eq!(code, Some(0), "{}", String::from_utf8_lossy(&stderr));
        assert_eq!(split_nul(&stdout), args);
        assert!(!std::path::Path::new("/tmp/pwned-createos").exists());
    }

    #[test]
    fn bash_receives_env_byte_exact() {
        let values = hostile();
        let names: Vec<String> = (0..values.len()).map(|i| format!("V_{i}")).collect();
        let env: Vec<(&str, &str)> =
            names.iter().map(String::as_str).zip(values.iter().map(String::as_str)).collect();
        // A second shell expands the variables it received.
        let refs: Vec<String> = names.iter().map(|n| format!("\"${{{n}}}\"")).collect();
        let body = format!("printf '%s\\0' {}", refs.join(" "));
        let script = build(&spec("/", "/bin/sh", &["-c", &body], &env));
        let (stdout, stderr, code) = run(&script);
        assert_eq!(code, Some(0), "{}", String::from_utf8_lossy(&stderr));
        assert_eq!(split_nul(&stdout), values);
    }

    #[test]
    fn cwd_commands_with_equals_or_dashes_and_stdin() {
        let dir = std::env::temp_dir().join(format!("createos-script-{}", uuid::Uuid::new_v4()));
        let cwd = dir.join("it's $(x) dir");
        std::fs::create_dir_all(&cwd).unwrap();
        let cwd = cwd.to_str().unwrap();
        // The working directory arrives exactly.
        let (stdout, _, code) = run(&build(&spec(cwd, "pwd", &[], &[])));
        assert_eq!(code, Some(0));
        assert_eq!(String::from_utf8(stdout).unwrap(), format!("{cwd}\n"));
        // A missing working directory fails before the command runs.
        let (stdout, _, code) = run(&build(&spec("/nonexistent/createos", "echo", &["ran"], &[])));
        assert_ne!(code, Some(0));
        assert!(stdout.is_empty());
        // A command whose name contains `=` or starts with `-`.
        for name in ["a=b", "-x", "-y=z"] {
            let path = cwd.to_string() + "/" + name;
            std::fs::write(&path, "#!/bin/sh\nprintf '%s|%s|%s' \"${0##*/}\" \"$1\" \"$K\"\n").unwrap();
            let mut perms = std::fs::metadata(&path).unwrap().permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
            std::fs::set_permissions(&path, perms).unwrap();
            let (stdout, stderr, code) = run(&build(&spec(cwd, &path, &["a r g"], &[("K", "v=1")])));
            assert_eq!(code, Some(0), "{name}: {}", String::from_utf8_lossy(&stderr));
            assert_eq!(String::from_utf8(stdout).unwrap(), format!("{name}|a r g|v=1"));
        }
        // Standard input: the staged file, else /dev/null.
        let stdin = dir.join("stdin 'file'");
        std::fs::write(&stdin, b"in\x00put\n").unwrap();
        let with = ScriptSpec { stdin_path: stdin.to_str(), ..spec("/", "cat", &[], &[]) };
        let (stdout, _, code) = run(&build(&with));
        assert_eq!(code, Some(0));
        assert_eq!(stdout, b"in\x00put\n");
        let (stdout, _, code) = run(&build(&spec("/", "cat", &[], &[])));
        assert_eq!(code, Some(0));
        assert!(stdout.is_empty());
        // Exit codes pass through `exec`.
        let (_, _, code) = run(&build(&spec("/", "sh", &["-c", "exit 7"], &[])));
        assert_eq!(code, Some(7));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
