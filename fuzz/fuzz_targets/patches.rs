//! PATCH bodies: a strategic merge patch applied to any object (the first
//! JSON value of the input, the second is the patch). No panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use watchcache::api::patch::strategic_merge as smp;

fuzz_target!(|data: &[u8]| {
    let mut values = serde_json::Deserializer::from_slice(data).into_iter::<serde_json::Value>();
    let (Some(Ok(mut target)), Some(Ok(patch))) = (values.next(), values.next()) else {
        return;
    };
    smp::apply(&mut target, &patch);
    let _ = smp::stripped(&target);
});
