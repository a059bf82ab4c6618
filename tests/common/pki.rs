//! Test certificates made with rcgen: a CA, etcd's serving certificate and a
//! client certificate (kubeadm's `etcd/ca.crt`, `etcd/server.crt`,
//! `apiserver-etcd-client.crt`), plus a second, unrelated CA and a client
//! certificate it signed, for the refusals.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
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
