//! The TLS ClientHello/SNI reader (`tollgate_proxy::sni`), on arbitrary first bytes of a
//! connection. Checks, besides not panicking: a name found is lower-case, and whatever a
//! prefix of the bytes decides (a name, none, invalid) the whole bytes decide the same, as
//! the listener acts on the first decision.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_proxy::sni::{MAX_CLIENT_HELLO, Sni, parse};

fuzz_target!(|data: &[u8]| {
    let data = &data[..data.len().min(MAX_CLIENT_HELLO)];
    let whole = parse(data);
    if let Sni::Found(name) = &whole {
        assert_eq!(*name, name.to_ascii_lowercase());
    }
    for cut in [data.len() / 3, data.len() / 2, data.len().saturating_sub(1)] {
        let early = parse(&data[..cut]);
        if early != Sni::Incomplete {
            assert_eq!(early, whole, "the first {cut} bytes decided otherwise");
        }
    }
});
