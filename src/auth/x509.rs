//! Client-certificate authentication (`--client-ca-file`), as kube-apiserver:
//! the chain must verify against the CA bundle for client authentication
//! (webpki: validity period, signatures, key usage); the user is the
//! subject's CommonName and the groups its Organization entries.
//!
//! The TLS layer asks for a certificate but does not reject a bad one during
//! the handshake ([`DeferredClientCertVerifier`]): like kube-apiserver, a bad
//! certificate is a 401 `Status` the client can read, and a request without
//! one can still use a token or be anonymous.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, UnixTime};

use super::{AuthnError, UserInfo};

#[derive(Debug, thiserror::Error)]
pub enum ClientCaError {
    #[error("{file}: cannot read PEM certificates: {message}")]
    Read { file: String, message: String },
    #[error("{file}: no certificates found")]
    Empty { file: String },
    #[error("{file}: {message}")]
    Invalid { file: String, message: String },
}

/// Verifies client certificates against the client CA bundle.
#[derive(Debug, Clone)]
pub struct CertAuthenticator {
    verifier: Arc<dyn ClientCertVerifier>,
}

impl CertAuthenticator {
    /// Loads the PEM CA bundle of `--client-ca-file`.
    pub fn load(path: &Path) -> Result<CertAuthenticator, ClientCaError> {
        let file = path.display().to_string();
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| ClientCaError::Read {
                file: file.clone(),
                message: e.to_string(),
            })?;
        CertAuthenticator::from_certs(certs, &file)
    }

    /// Builds the verifier from DER CA certificates; `file` names the source.
    pub fn from_certs(
        certs: Vec<CertificateDer<'static>>,
        file: &str,
    ) -> Result<CertAuthenticator, ClientCaError> {
        if certs.is_empty() {
            return Err(ClientCaError::Empty { file: file.into() });
        }
        let mut roots = RootCertStore::empty();
        for cert in certs {
            roots.add(cert).map_err(|e| ClientCaError::Invalid {
                file: file.into(),
                message: e.to_string(),
            })?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            crate::tls::crypto_provider(),
        )
        .allow_unauthenticated()
        .build()
        .map_err(|e| ClientCaError::Invalid {
            file: file.into(),
            message: e.to_string(),
        })?;
        Ok(CertAuthenticator { verifier })
    }

    /// The verifier for the TLS handshake: it checks the client's signature
    /// (possession of the key) but leaves the chain to [`Self::authenticate`].
    pub fn handshake_verifier(&self) -> Arc<dyn ClientCertVerifier> {
        Arc::new(DeferredClientCertVerifier {
            inner: Arc::clone(&self.verifier),
        })
    }

    /// The user of a presented chain (end entity first): `Some(Ok)` when it
    /// verifies and has a CommonName, `Some(Err)` when it does not verify,
    /// None when it verifies without a CommonName (kube: no opinion).
    pub fn authenticate(
        &self,
        chain: &[CertificateDer<'static>],
    ) -> Option<Result<UserInfo, AuthnError>> {
        let (end_entity, intermediates) = chain.split_first()?;
        if let Err(e) = self
            .verifier
            .verify_client_cert(end_entity, intermediates, UnixTime::now())
        {
            return Some(Err(AuthnError::InvalidCertificate(e.to_string())));
        }
        match subject_user(end_entity) {
            Ok(Some(user)) => Some(Ok(user)),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

/// User = subject CN, groups = subject O entries. With several CNs the
/// last counts: Go's `pkix.Name.FillFromRDNSequence` overwrites CommonName
/// per attribute, so kube-apiserver sees the last one, and a certificate
/// must name the same user here. Every O is a group, in order, as there.
fn subject_user(cert: &CertificateDer<'_>) -> Result<Option<UserInfo>, AuthnError> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|e| AuthnError::InvalidCertificate(e.to_string()))?;
    let subject = parsed.subject();
    let text = |attr: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        attr.as_str()
            .map(String::from)
            .map_err(|e| AuthnError::InvalidCertificate(format!("subject: {e}")))
    };
    let name = match subject.iter_common_name().last() {
        Some(cn) => text(cn)?,
        None => return Ok(None),
    };
    if name.is_empty() {
        return Ok(None);
    }
    let groups = subject
        .iter_organization()
        .map(text)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(UserInfo {
        name,
        uid: String::new(),
        groups,
        ..Default::default()
    }))
}

/// Asks for a client certificate and checks the handshake signatures with
/// the real verifier, but accepts any chain: chain verification happens per
/// connection in [`CertAuthenticator::authenticate`].
#[derive(Debug)]
struct DeferredClientCertVerifier {
    inner: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for DeferredClientCertVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };

    fn ca(name: &str) -> (CertificateDer<'static>, Issuer<'static, KeyPair>) {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        (cert.der().clone(), Issuer::new(p, key))
    }

    fn client(
        issuer: &Issuer<'_, KeyPair>,
        cn: &str,
        orgs: &[&str],
        expired: bool,
    ) -> CertificateDer<'static> {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        for o in orgs {
            p.distinguished_name.push(DnType::OrganizationName, *o);
        }
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if expired {
            p.not_before = rcgen::date_time_ymd(2000, 1, 1);
            p.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        p.signed_by(&key, issuer).unwrap().der().clone()
    }

    #[test]
    fn user_from_subject_and_chain_checks() {
        let (ca_der, issuer) = ca("test-ca");
        let auth = CertAuthenticator::from_certs(vec![ca_der], "ca.pem").unwrap();
        let good = client(&issuer, "alice", &["dev"], false);
        let user = auth.authenticate(&[good]).unwrap().unwrap();
        assert_eq!(user.name, "alice");
        assert_eq!(user.groups, ["dev"]);

        let expired = client(&issuer, "alice", &[], true);
        assert!(matches!(
            auth.authenticate(&[expired]),
            Some(Err(AuthnError::InvalidCertificate(_)))
        ));

        let (_, other) = ca("other-ca");
        let foreign = client(&other, "mallory", &["system:masters"], false);
        assert!(matches!(
            auth.authenticate(&[foreign]),
            Some(Err(AuthnError::InvalidCertificate(_)))
        ));
        assert!(auth.authenticate(&[]).is_none());
    }

    /// Two CN attributes (rcgen keeps one per DnType, so the second is
    /// spelt as a custom type with the CN OID): the user is the last, as
    /// kube-apiserver sees it; two O attributes are both groups.
    #[test]
    fn last_common_name_is_the_user() {
        let (ca_der, issuer) = ca("test-ca");
        let auth = CertAuthenticator::from_certs(vec![ca_der], "ca.pem").unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, "alice");
        p.distinguished_name.push(DnType::OrganizationName, "dev");
        p.distinguished_name
            .push(DnType::CustomDnType(vec![2, 5, 4, 3]), "system:admin");
        p.distinguished_name
            .push(DnType::CustomDnType(vec![2, 5, 4, 10]), "ops");
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &issuer).unwrap().der().clone();
        let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).unwrap();
        assert_eq!(parsed.subject().iter_common_name().count(), 2);
        let user = auth.authenticate(&[cert]).unwrap().unwrap();
        assert_eq!(user.name, "system:admin");
        assert_eq!(user.groups, ["dev", "ops"]);
    }

    #[test]
    fn empty_bundle_is_an_error() {
        let e = CertAuthenticator::from_certs(vec![], "ca.pem")
            .unwrap_err()
            .to_string();
        assert!(e.contains("ca.pem"), "{e}");
    }
}
