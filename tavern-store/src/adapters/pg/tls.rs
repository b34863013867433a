//! TLS to the server, for settings that ask for it with `sslmode=require`: the server's
//! certificate is verified (chain and host name, as libpq's `verify-full`) against the Mozilla
//! root certificates plus a deployment's own CA. Other settings connect without TLS: a unix
//! socket, loopback, or a network the deployment trusts.

use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use tokio_postgres::config::SslMode;

use super::PgConfig;
use crate::error::StoreError;

/// Which certificates a TLS connection trusts. `Default`: the Mozilla roots only.
#[derive(Clone, Default)]
pub struct PgTls {
    extra_roots: Vec<CertificateDer<'static>>,
}

impl std::fmt::Debug for PgTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTls")
            .field("extra_roots", &self.extra_roots.len())
            .finish()
    }
}

fn invalid(reason: String) -> StoreError {
    StoreError::Invalid(tavern_core::CoreError::InvalidField {
        field: "postgres ca certificates",
        reason,
    })
}

impl PgTls {
    /// Also trusts the CA certificates in `pem` (the contents of a PEM file, e.g. the
    /// deployment's own CA or the server's self-signed certificate).
    ///
    /// # Errors
    /// [`StoreError::Invalid`] when `pem` holds no certificate or one that cannot be read.
    pub fn with_ca_pem(mut self, pem: &[u8]) -> Result<Self, StoreError> {
        let before = self.extra_roots.len();
        for cert in CertificateDer::pem_slice_iter(pem) {
            self.extra_roots
                .push(cert.map_err(|e| invalid(format!("unreadable pem ({e})")))?);
        }
        if self.extra_roots.len() == before {
            return Err(invalid("no certificate in the pem data".into()));
        }
        Ok(self)
    }

    /// The connector for `config`: rustls when it says `sslmode=require`, else none.
    pub(super) fn connector(&self, config: &PgConfig) -> Result<Connector, StoreError> {
        if config.get_ssl_mode() != SslMode::Require {
            return Ok(Connector::Plain);
        }
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        for cert in &self.extra_roots {
            roots
                .add(cert.clone())
                .map_err(|e| invalid(format!("certificate not usable as a root ({e})")))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| StoreError::Internal(format!("tls setup: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Connector::Tls(
            tokio_postgres_rustls::MakeRustlsConnect::new(client),
        ))
    }
}

/// How the pool connects.
pub(super) enum Connector {
    /// No TLS.
    Plain,
    /// TLS with verification.
    Tls(tokio_postgres_rustls::MakeRustlsConnect),
}
