//! TLS from the connection string, with rustls, in libpq's terms.
//!
//! | `sslmode` | encrypts | checks the chain | checks the host name |
//! | --- | --- | --- | --- |
//! | `disable` | no | | |
//! | `prefer` (the default) | if the server offers it | no | no |
//! | `require` | yes, or fail | no (yes with `sslrootcert`, as libpq) | no |
//! | `verify-ca` | yes | yes | no |
//! | `verify-full` | yes | yes | yes |
//!
//! `sslrootcert` names a PEM file of trusted roots, or `system` for the
//! operating system's store. Without it, the verifying modes read
//! `~/.postgresql/root.crt`, as libpq does, and fail clearly when it is absent.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::conninfo::ConnInfo;
use crate::error::PoolError;

/// How a connection uses TLS: libpq's `sslmode` (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Never.
    Disable,
    /// When the server offers it, without checking its certificate.
    #[default]
    Prefer,
    /// Always, without checking the certificate.
    Require,
    /// Always; the certificate must chain to a trusted root.
    VerifyCa,
    /// Always; the certificate must chain to a trusted root and name the host.
    VerifyFull,
}

impl SslMode {
    fn parse(s: &str) -> Result<Self, PoolError> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(PoolError::InvalidUrl(format!(
                    "sslmode {other:?} is not one of disable, prefer, require, verify-ca, verify-full"
                )))
            }
        })
    }
}

/// Where to connect and how: the parsed config and its TLS connector.
#[derive(Clone)]
pub(crate) struct Endpoint {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) tls: MakeRustlsConnect,
    pub(crate) ssl_mode: SslMode,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint").field("ssl_mode", &self.ssl_mode).finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Parses a connection string, taking the TLS options out first.
    pub(crate) fn parse(url: &str) -> Result<Self, PoolError> {
        let mut info = ConnInfo::new(url);
        let mode = info.take("sslmode").map(|m| SslMode::parse(&m)).transpose()?.unwrap_or_default();
        let root = info.take("sslrootcert");
        let mut config: tokio_postgres::Config =
            info.as_str().parse().map_err(|e: tokio_postgres::Error| PoolError::InvalidUrl(e.to_string()))?;
        // libpq: `require` with a root certificate checks the chain.
        let mode = if mode == SslMode::Require && root.is_some() { SslMode::VerifyCa } else { mode };
        config.ssl_mode(match mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        });
        let tls = MakeRustlsConnect::new(client_config(mode, root.as_deref())?);
        Ok(Endpoint { config, tls, ssl_mode: mode })
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn client_config(mode: SslMode, root: Option<&str>) -> Result<ClientConfig, PoolError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| PoolError::InvalidSetting(format!("tls: {e}")))?;
    let chain = match mode {
        SslMode::Disable | SslMode::Prefer | SslMode::Require => None,
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let roots = Arc::new(load_roots(root)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| PoolError::InvalidSetting(format!("tls roots: {e}")))?;
            Some(webpki)
        }
    };
    let config = match chain {
        Some(webpki) if mode == SslMode::VerifyFull => {
            builder.with_webpki_verifier(webpki).with_no_client_auth()
        }
        chain => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Lenient { provider, chain }))
            .with_no_client_auth(),
    };
    Ok(config)
}

fn load_roots(root: Option<&str>) -> Result<RootCertStore, PoolError> {
    let mut store = RootCertStore::empty();
    let bad = |msg: String| PoolError::InvalidSetting(msg);
    match root {
        Some("system") => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(bad(format!(
                    "sslrootcert=system: no usable certificate in the system store ({} errors)",
                    found.errors.len()
                )));
            }
        }
        Some(path) => add_pem_file(&mut store, Path::new(path))?,
        None => {
            let default = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".postgresql/root.crt"));
            match default {
                Some(path) if path.is_file() => add_pem_file(&mut store, &path)?,
                _ => {
                    return Err(bad("sslmode verify-ca and verify-full need trusted roots: set sslrootcert to a PEM file, or to `system`, or provide ~/.postgresql/root.crt".to_owned()))
                }
            }
        }
    }
    Ok(store)
}

fn add_pem_file(store: &mut RootCertStore, path: &Path) -> Result<(), PoolError> {
    let bad = |why: String| PoolError::InvalidSetting(format!("sslrootcert {}: {why}", path.display()));
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    let (added, _) = store.add_parsable_certificates(certs);
    if added == 0 {
        return Err(bad("holds no usable certificate".to_owned()));
    }
    Ok(())
}

/// `prefer`, `require` and `verify-ca`: encrypt, and prove the handshake
/// was signed by the certificate's key. Without a chain check any
/// certificate is trusted (libpq's `prefer` and `require`); with one
/// (`verify-ca`) the chain must reach a trusted root, and the name may differ.
#[derive(Debug)]
struct Lenient {
    provider: Arc<CryptoProvider>,
    /// `verify-ca`'s verifier, built from the same provider.
    chain: Option<Arc<WebPkiServerVerifier>>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else { return Ok(ServerCertVerified::assertion()) };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_bad_ones_are_named() {
        assert_eq!(Endpoint::parse("postgres://h/db").unwrap().ssl_mode, SslMode::Prefer);
        assert_eq!(Endpoint::parse("postgres://h/db?sslmode=disable").unwrap().ssl_mode, SslMode::Disable);
        assert_eq!(Endpoint::parse("host=h sslmode=require").unwrap().ssl_mode, SslMode::Require);
        let err = Endpoint::parse("postgres://h/db?sslmode=allow").unwrap_err().to_string();
        assert!(err.contains("\"allow\""), "{err}");
    }

    #[test]
    fn verifying_modes_need_roots_and_say_so() {
        let err = Endpoint::parse("postgres://h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
    }
}
