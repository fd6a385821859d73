//! `parse_json`: the first input byte picks a configuration, the rest is
//! the line.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use petrel_fuzz::processors::common::OnError;
use petrel_fuzz::processors::parse_json::{Config, ParseJson};

static PROCS: LazyLock<Vec<ParseJson>> = LazyLock::new(|| {
    let mut v = Vec::new();
    for (flatten, separator) in [(false, "."), (true, "."), (true, "__")] {
        for on_error in [OnError::Keep, OnError::Drop, OnError::Raw("raw".into())] {
            let c = Config {
                field: "message".into(),
                flatten,
                separator: separator.into(),
                on_error,
            };
            v.push(ParseJson::new(&c, petrel_fuzz::metrics()).expect("build"));
        }
    }
    v
});

fuzz_target!(|data: &[u8]| {
    let Some((sel, line)) = data.split_first() else {
        return;
    };
    petrel_fuzz::check(&PROCS[*sel as usize % PROCS.len()], line);
});
