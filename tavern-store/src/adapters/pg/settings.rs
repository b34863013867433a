//! Connection settings from what an operator gives: a `postgres://` URL or `key=value`
//! string, a file holding the password and a PEM file of CA certificates — read and checked in
//! one place for every program that connects, with errors that never repeat a value or a path.

use std::path::Path;

use super::{PgConfig, PgTls};
use crate::error::StoreError;

/// Parses `settings`: a `postgres://` URL or `key=value` settings.
///
/// # Errors
/// [`StoreError::Invalid`] naming the option at fault when the driver says which and it is one
/// the driver knows (a `port` that is not a number); for an unknown option, the known one
/// nearest to it (`hots` → `host`) — never anything of the input itself: settings may hold a
/// password, and a password with an unescaped `@`, `?` or space is read as more options.
pub fn parse_settings(settings: &str) -> Result<PgConfig, StoreError> {
    settings.parse().map_err(|e: tokio_postgres::Error| {
        StoreError::Invalid(tavern_core::CoreError::InvalidField {
            field: "postgres settings",
            reason: settings_problem(&e),
        })
    })
}

/// Every option the driver reads (`tokio_postgres::Config`'s parser, 0.7).
const KNOWN_OPTIONS: [&str; 19] = [
    "user",
    "password",
    "dbname",
    "options",
    "application_name",
    "sslmode",
    "sslnegotiation",
    "host",
    "hostaddr",
    "port",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

/// What is wrong with settings the driver refused, in words that quote nothing of the input:
/// only the names of known options.
fn settings_problem(e: &tokio_postgres::Error) -> String {
    const SSLMODE: &str =
        "sslmode takes disable, prefer or require; require verifies the certificate and host name";
    let cause = std::error::Error::source(e)
        .map(ToString::to_string)
        .unwrap_or_default();
    let named = |start: &str| {
        cause
            .strip_prefix(start)
            .and_then(|rest| rest.strip_suffix('`'))
            .filter(|name| !name.contains('`'))
    };
    if let Some(name) = named("invalid value for option `") {
        if let Some(known) = KNOWN_OPTIONS.iter().find(|k| **k == name) {
            return match *known {
                "sslmode" => format!("invalid value for option `sslmode` ({SSLMODE})"),
                known => format!("invalid value for option `{known}`"),
            };
        }
    }
    if let Some(name) = named("unknown option `") {
        // The name as typed may be a piece of a password: only a known name is shown.
        let nearest = KNOWN_OPTIONS
            .iter()
            .map(|k| (strsim::damerau_levenshtein(name, k), *k))
            .filter(|(distance, k)| *distance <= 2 && *distance < k.len() / 2 + 1)
            .min();
        return match nearest {
            Some((_, known)) => format!("an unknown option (did you mean `{known}`?)"),
            None => "an unknown option (known: host, port, user, dbname, password, sslmode…); a password holding `@`, `?`, `/` or a space must be percent-encoded in a url, quoted in key=value settings".to_owned(),
        };
    }
    format!("cannot be parsed as a postgres:// url or key=value settings ({SSLMODE})")
}

/// Which part of a connection's set-up could not be used. Messages name the part and the
/// reason, never a setting's value (it may be a password) nor a file's path.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum PgSetupError {
    /// The settings string ([`parse_settings`]).
    #[error("{0}")]
    Settings(StoreError),
    /// The password file could not be read.
    #[error("cannot read the password file ({0})")]
    PasswordFile(std::io::ErrorKind),
    /// The CA file could not be read.
    #[error("cannot read the ca file ({0})")]
    CaFile(std::io::ErrorKind),
    /// The CA file holds no certificate, or one that cannot be read.
    #[error("{0}")]
    CaPem(StoreError),
}

impl PgSetupError {
    /// What, after the settings' own name, names the part at fault in a program's options:
    /// `""` for the settings (`--store`), `"-password-file"`, `"-ca-file"` — the convention
    /// `tavern` and `tavern-bridge` share (`--store-password-file`, `TAVERN_STORE_CA_FILE`…).
    pub fn option_suffix(&self) -> &'static str {
        match self {
            Self::Settings(_) => "",
            Self::PasswordFile(_) => "-password-file",
            Self::CaFile(_) | Self::CaPem(_) => "-ca-file",
        }
    }
}

/// The connection `settings` describe, with the password from the first line of
/// `password_file` (which then overrides one in the settings) and TLS trusting the CA
/// certificates in `ca_file` besides the Mozilla roots.
///
/// # Errors
/// [`PgSetupError`] naming the part that could not be read or parsed.
pub fn load_settings(
    settings: &str,
    password_file: Option<&Path>,
    ca_file: Option<&Path>,
) -> Result<(PgConfig, PgTls), PgSetupError> {
    let mut config = parse_settings(settings).map_err(PgSetupError::Settings)?;
    if let Some(file) = password_file {
        let text =
            std::fs::read_to_string(file).map_err(|e| PgSetupError::PasswordFile(e.kind()))?;
        config.password(text.lines().next().unwrap_or_default());
    }
    let mut tls = PgTls::default();
    if let Some(file) = ca_file {
        let pem = std::fs::read(file).map_err(|e| PgSetupError::CaFile(e.kind()))?;
        tls = tls.with_ca_pem(&pem).map_err(PgSetupError::CaPem)?;
    }
    Ok((config, tls))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused setting is named; no value of the settings is repeated.
    #[test]
    fn bad_settings_name_the_option_not_the_value() {
        let cases = [
            (
                "host=/tmp port=s3cret",
                Some("invalid value for option `port`"),
            ),
            (
                "host=/tmp pasword=s3cret",
                Some("an unknown option (did you mean `password`?)"),
            ),
            ("host=/tmp hots=s3cret", Some("did you mean `host`?")),
            (
                "host=/tmp sslmode=s3cret",
                Some("invalid value for option `sslmode` (sslmode takes disable"),
            ),
            // Pieces of a password the driver reads as option names are never shown: a url
            // whose password holds an unescaped `@` and `?`, one with `&` in a query value,
            // key=value settings whose password holds an unquoted space.
            (
                "postgres://kai:Pa@s3cret?wordy=1@db/tavern",
                Some("an unknown option (known: host"),
            ),
            (
                "postgres://kai@db/x?password=ab&s3cretcd=ef",
                Some("an unknown option (known: host"),
            ),
            (
                "host=/tmp password=open s3cretsesame=1",
                Some("percent-encoded in a url, quoted in key=value settings"),
            ),
            ("host='s3cret", None),
            ("s3cret", None),
        ];
        for (settings, named) in cases {
            let err = parse_settings(settings).unwrap_err().to_string();
            assert!(err.starts_with("invalid postgres settings: "), "{err}");
            assert!(
                !err.contains("s3cret") && !err.contains("wordy"),
                "{settings}: {err}"
            );
            match named {
                Some(named) => assert!(err.contains(named), "{settings}: {err}"),
                None => assert!(err.contains("cannot be parsed"), "{settings}: {err}"),
            }
        }
        assert!(parse_settings("host=/tmp user=kai port=5433").is_ok());
    }

    /// The password comes from the file's first line; a missing or unusable file is named by
    /// its part, never by its path.
    #[test]
    fn files_are_read_and_named_by_their_part() {
        let dir = tempfile::tempdir().unwrap();
        let password = dir.path().join("s3cret-password");
        std::fs::write(&password, "hunter2\nsecond line\n").unwrap();
        let (config, tls) = load_settings("host=/tmp password=old", Some(&password), None).unwrap();
        assert_eq!(config.get_password(), Some(&b"hunter2"[..]));
        assert!(format!("{tls:?}").contains("extra_roots: 0"), "{tls:?}");

        let missing = dir.path().join("s3cret-missing");
        let err = load_settings("host=/tmp", Some(&missing), None).unwrap_err();
        assert!(
            matches!(
                err,
                PgSetupError::PasswordFile(std::io::ErrorKind::NotFound)
            ),
            "{err:?}"
        );
        assert_eq!(err.option_suffix(), "-password-file");
        let err = load_settings("host=/tmp", None, Some(&missing)).unwrap_err();
        assert!(
            matches!(err, PgSetupError::CaFile(std::io::ErrorKind::NotFound)),
            "{err:?}"
        );
        assert_eq!(err.option_suffix(), "-ca-file");
        let junk = dir.path().join("s3cret-ca.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let err = load_settings("host=/tmp", None, Some(&junk)).unwrap_err();
        assert!(matches!(err, PgSetupError::CaPem(_)), "{err:?}");
        assert_eq!(err.option_suffix(), "-ca-file");
        let err = load_settings("host=/tmp port=s3cret", Some(&password), None).unwrap_err();
        assert!(matches!(err, PgSetupError::Settings(_)), "{err:?}");
        assert_eq!(err.option_suffix(), "");
        for err in [
            load_settings("host=/tmp", Some(&missing), None).unwrap_err(),
            load_settings("host=/tmp", None, Some(&junk)).unwrap_err(),
            load_settings("host=/tmp port=s3cret", None, None).unwrap_err(),
        ] {
            let shown = err.to_string();
            assert!(!shown.contains("s3cret") && !shown.contains('/'), "{shown}");
        }
    }
}
