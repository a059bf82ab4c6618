//! The value transformers of kube-apiserver's encryption providers, byte for
//! byte (k8s.io/apiserver/pkg/storage/value/encrypt/{aes,secretbox,identity}).
//! The ciphers are RustCrypto's; this file only lays out nonce, ciphertext
//! and prefix as kube-apiserver does.

use aes::cipher::{BlockDecryptMut, BlockEncryptMut, KeyIvInit, block_padding::Pkcs7};
use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes128Gcm, Aes256Gcm, AesGcm};
use crypto_secretbox::XSalsa20Poly1305;
use rand::TryRngCore;

/// Why a cipher refused a value; the caller adds which provider it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CipherError {
    /// Shorter than nonce/IV (+ tag), or not whole AES blocks.
    Truncated,
    /// Authentication or padding failed: a wrong key or a tampered value.
    Failed,
    /// The system random source failed (writes only).
    Random,
}

/// kube-apiserver's AES-GCM nonce: 12 random bytes in front of the sealed data.
const GCM_NONCE: usize = 12;
/// AES block and CBC IV size.
const AES_BLOCK: usize = 16;
/// NaCl secretbox: 24-byte nonce, 16-byte Poly1305 tag.
const SECRETBOX_NONCE: usize = 24;
const SECRETBOX_TAG: usize = 16;

type Aes192Gcm = AesGcm<aes::Aes192, aes_gcm::aead::consts::U12>;

/// One provider's cipher with one key.
pub(super) enum Cipher {
    AesGcm128(Box<Aes128Gcm>),
    AesGcm192(Box<Aes192Gcm>),
    AesGcm256(Box<Aes256Gcm>),
    /// AES-CBC keeps the raw key: the `cbc` crate builds a cipher per value
    /// (it is keyed together with the IV).
    AesCbc(Vec<u8>),
    Secretbox(Box<XSalsa20Poly1305>),
}

impl Cipher {
    /// `kind` is the provider name; the key length was validated by the
    /// config (16/24/32 for AES, 32 for secretbox).
    pub(super) fn new(kind: &str, key: &[u8]) -> Option<Cipher> {
        Some(match (kind, key.len()) {
            ("aesgcm", 16) => Cipher::AesGcm128(Box::new(Aes128Gcm::new_from_slice(key).ok()?)),
            ("aesgcm", 24) => Cipher::AesGcm192(Box::new(Aes192Gcm::new_from_slice(key).ok()?)),
            ("aesgcm", 32) => Cipher::AesGcm256(Box::new(Aes256Gcm::new_from_slice(key).ok()?)),
            ("aescbc", 16 | 24 | 32) => Cipher::AesCbc(key.to_vec()),
            ("secretbox", 32) => {
                Cipher::Secretbox(Box::new(XSalsa20Poly1305::new_from_slice(key).ok()?))
            }
            _ => return None,
        })
    }

    /// Plain value -> nonce/IV + ciphertext (without the `k8s:enc:` prefix).
    /// `aad` is the etcd key; only AES-GCM authenticates it, as in Kubernetes.
    pub(super) fn seal(&self, plain: &[u8], aad: &[u8]) -> Result<Vec<u8>, CipherError> {
        let sealed = |nonce: &[u8], r: Result<Vec<u8>, aes_gcm::aead::Error>| {
            r.map(|ct| [nonce, &ct].concat())
                .map_err(|_| CipherError::Failed)
        };
        match self {
            Cipher::AesGcm128(c) => {
                let n = random::<GCM_NONCE>()?;
                sealed(&n, c.encrypt((&n).into(), Payload { msg: plain, aad }))
            }
            Cipher::AesGcm192(c) => {
                let n = random::<GCM_NONCE>()?;
                sealed(&n, c.encrypt((&n).into(), Payload { msg: plain, aad }))
            }
            Cipher::AesGcm256(c) => {
                let n = random::<GCM_NONCE>()?;
                sealed(&n, c.encrypt((&n).into(), Payload { msg: plain, aad }))
            }
            Cipher::AesCbc(key) => {
                let iv = random::<AES_BLOCK>()?;
                let ct = match key.len() {
                    16 => cbc::Encryptor::<aes::Aes128>::new_from_slices(key, &iv)
                        .map(|e| e.encrypt_padded_vec_mut::<Pkcs7>(plain)),
                    24 => cbc::Encryptor::<aes::Aes192>::new_from_slices(key, &iv)
                        .map(|e| e.encrypt_padded_vec_mut::<Pkcs7>(plain)),
                    _ => cbc::Encryptor::<aes::Aes256>::new_from_slices(key, &iv)
                        .map(|e| e.encrypt_padded_vec_mut::<Pkcs7>(plain)),
                }
                .map_err(|_| CipherError::Failed)?;
                Ok([&iv[..], &ct].concat())
            }
            Cipher::Secretbox(c) => {
                let n = random::<SECRETBOX_NONCE>()?;
                sealed(&n, c.encrypt((&n).into(), plain))
            }
        }
    }

    /// nonce/IV + ciphertext (prefix already removed) -> plain value.
    pub(super) fn open(&self, data: &[u8], aad: &[u8]) -> Result<Vec<u8>, CipherError> {
        let gcm_split = || {
            if data.len() < GCM_NONCE {
                Err(CipherError::Truncated)
            } else {
                Ok(data.split_at(GCM_NONCE))
            }
        };
        let auth = |r: Result<Vec<u8>, aes_gcm::aead::Error>| r.map_err(|_| CipherError::Failed);
        match self {
            Cipher::AesGcm128(c) => {
                let (n, ct) = gcm_split()?;
                auth(c.decrypt(n.into(), Payload { msg: ct, aad }))
            }
            Cipher::AesGcm192(c) => {
                let (n, ct) = gcm_split()?;
                auth(c.decrypt(n.into(), Payload { msg: ct, aad }))
            }
            Cipher::AesGcm256(c) => {
                let (n, ct) = gcm_split()?;
                auth(c.decrypt(n.into(), Payload { msg: ct, aad }))
            }
            Cipher::AesCbc(key) => {
                if data.len() < AES_BLOCK {
                    return Err(CipherError::Truncated);
                }
                let (iv, ct) = data.split_at(AES_BLOCK);
                if ct.len() % AES_BLOCK != 0 {
                    return Err(CipherError::Truncated);
                }
                // CBC has no authentication: a wrong key or a tampered
                // value shows up only as bad padding (or garbage).
                match key.len() {
                    16 => cbc::Decryptor::<aes::Aes128>::new_from_slices(key, iv)
                        .map(|d| d.decrypt_padded_vec_mut::<Pkcs7>(ct)),
                    24 => cbc::Decryptor::<aes::Aes192>::new_from_slices(key, iv)
                        .map(|d| d.decrypt_padded_vec_mut::<Pkcs7>(ct)),
                    _ => cbc::Decryptor::<aes::Aes256>::new_from_slices(key, iv)
                        .map(|d| d.decrypt_padded_vec_mut::<Pkcs7>(ct)),
                }
                .map_err(|_| CipherError::Failed)?
                .map_err(|_| CipherError::Failed)
            }
            Cipher::Secretbox(c) => {
                if data.len() < SECRETBOX_NONCE + SECRETBOX_TAG {
                    return Err(CipherError::Truncated);
                }
                let (n, ct) = data.split_at(SECRETBOX_NONCE);
                auth(c.decrypt(n.into(), ct))
            }
        }
    }
}

/// N bytes from the operating system's CSPRNG (Kubernetes: crypto/rand).
fn random<const N: usize>() -> Result<[u8; N], CipherError> {
    let mut b = [0u8; N];
    rand::rngs::OsRng
        .try_fill_bytes(&mut b)
        .map_err(|_| CipherError::Random)?;
    Ok(b)
}
