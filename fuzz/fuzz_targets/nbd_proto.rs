//! Bytes from an NBD client: option data (NBD_OPT_GO/INFO, meta context requests) and
//! transmission request headers. Nothing may panic, and what parses round-trips.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_nbd::proto::{InfoRequest, MetaContextRequest, Request, REQUEST_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = InfoRequest::parse(data) {
        assert_eq!(InfoRequest::parse(&r.encode()).unwrap(), r);
    }
    if let Ok(r) = MetaContextRequest::parse(data) {
        assert_eq!(MetaContextRequest::parse(&r.encode()).unwrap(), r);
    }
    for chunk in data.chunks_exact(REQUEST_LEN) {
        let head: &[u8; REQUEST_LEN] = chunk.try_into().unwrap();
        if let Ok(r) = Request::parse(head) {
            assert_eq!(&r.encode(), head);
        }
    }
});
