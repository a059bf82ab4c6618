//! Test certificates made with rcgen: a CA, etcd's serving certificate and a
//! client certificate (kubeadm's `etcd/ca.crt`, `etcd/server.crt`,
//! `apiserver-etcd-client.crt`), plus a second, unrelated CA and a client
//! certificate it signed, for the refusals. [`TestCa`] makes certificates on
//! demand for the API's secure serving tests (users with groups, expired
//! certificates).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use watchcache::etcd_server::EtcdServerTls;

pub struct Pki {
    pub dir: tempfile::TempDir,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(p, KeyPair::generate().expect("ca key")).expect("ca cert")
}

fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    cn: &str,
    sans: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
    let mut p = CertificateParams::new(sans).expect("leaf params");
    p.distinguished_name.push(DnType::CommonName, cn);
    p.extended_key_usages = vec![usage];
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let key = KeyPair::generate().expect("leaf key");
    let cert = p.signed_by(&key, issuer).expect("leaf cert");
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    /// Writes every file into a fresh temp dir.
    pub fn generate() -> Pki {
        let dir = tempfile::tempdir().expect("pki dir");
        let write = |name: &str, text: &str| {
            std::fs::write(dir.path().join(name), text).expect("write pem");
        };
        let ca1 = ca("etcd-ca");
        write("ca.crt", &ca1.pem());
        let (c, k) = leaf(
            &ca1,
            "etcd-server",
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        write("server.crt", &c);
        write("server.key", &k);
        let (c, k) = leaf(
            &ca1,
            "kube-apiserver-etcd-client",
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        write("client.crt", &c);
        write("client.key", &k);
        let ca2 = ca("some-other-ca");
        write("other-ca.crt", &ca2.pem());
        let (c, k) = leaf(&ca2, "intruder", &[], ExtendedKeyUsagePurpose::ClientAuth);
        write("other-client.crt", &c);
        write("other-client.key", &k);
        Pki { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// etcd's serving files, with `--client-cert-auth`.
    pub fn etcd_server_tls(&self) -> EtcdServerTls {
        EtcdServerTls {
            cert_file: self.path("server.crt"),
            key_file: self.path("server.key"),
            trusted_ca_file: self.path("ca.crt"),
            client_cert_auth: true,
        }
    }
}

/// A certificate authority whose key stays in memory.
pub struct TestCa {
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key, as PEM files.
#[derive(Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("ca key");
        let cert = p.self_signed(&key).expect("ca cert");
        TestCa {
            cert_pem: cert.pem(),
            issuer: Issuer::new(p, key),
        }
    }

    /// Writes the CA certificate to `dir/{name}`.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, &self.cert_pem).expect("write ca");
        p
    }

    /// A serving certificate for 127.0.0.1 and localhost.
    pub fn server_cert(&self, dir: &Path, name: &str) -> CertFiles {
        let mut p = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("server params");
        p.distinguished_name.push(DnType::CommonName, name);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(p, dir, name)
    }

    /// A client certificate: CN = user, O = group (kube-apiserver's mapping).
    pub fn client_cert(
        &self,
        dir: &Path,
        user: &str,
        group: Option<&str>,
        expired: bool,
    ) -> CertFiles {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("client params");
        p.distinguished_name.push(DnType::CommonName, user);
        if let Some(g) = group {
            p.distinguished_name.push(DnType::OrganizationName, g);
        }
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if expired {
            p.not_before = rcgen::date_time_ymd(2001, 1, 1);
            p.not_after = rcgen::date_time_ymd(2002, 1, 1);
        }
        let name = if expired {
            format!("{user}-expired")
        } else {
            user.to_string()
        };
        self.sign(p, dir, &name)
    }

    fn sign(&self, p: CertificateParams, dir: &Path, name: &str) -> CertFiles {
        let key = KeyPair::generate().expect("key");
        let cert = p.signed_by(&key, &self.issuer).expect("sign");
        let files = CertFiles {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        };
        std::fs::write(&files.cert, cert.pem()).expect("write cert");
        std::fs::write(&files.key, key.serialize_pem()).expect("write key");
        files
    }
}
