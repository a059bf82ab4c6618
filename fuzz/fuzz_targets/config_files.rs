//! Files an operator writes: the TOML config, the EncryptionConfiguration
//! and RBAC policy (YAML or JSON) and the static token file (CSV). Every
//! mistake is an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use watchcache::auth::rbac::Policy;
use watchcache::auth::token_file::TokenFile;
use watchcache::config::Config;
use watchcache::storage::encryption::EncryptionTransformer;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = Config::parse(text, "fuzz.toml");
    let cfg = Config::example();
    let _ = EncryptionTransformer::parse(text, "fuzz.yaml", &cfg.resources, &cfg.etcd.prefix);
    let _ = Policy::parse(&[(text, "fuzz.yaml")]);
    let _ = TokenFile::parse(text, "tokens.csv");
});
