//! `parse_delimiter`: the first input byte picks a configuration, the rest
//! is the line.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use petrel_fuzz::processors::common::OnError;
use petrel_fuzz::processors::parse_delimiter::{Config, Extra, ParseDelimiter};

static PROCS: LazyLock<Vec<ParseDelimiter>> = LazyLock::new(|| {
    let mut v = Vec::new();
    let shapes: &[(&[u8], Option<u8>, usize)] = &[
        (b"|", Some(b'"'), 6),
        (b"|", None, 3),
        (b", ", Some(b'\''), 4),
        (b"\t", Some(b'"'), 1),
        (b"::", Some(b'"'), 2),
    ];
    for &(sep, quote, keys) in shapes {
        for extra in [Extra::Last, Extra::Drop, Extra::Error] {
            for on_error in [OnError::Keep, OnError::Drop, OnError::Raw("raw".into())] {
                let c = Config {
                    field: "message".into(),
                    separator: sep.to_vec(),
                    quote,
                    keys: (0..keys).map(|i| format!("k{i}")).collect(),
                    extra,
                    on_error,
                };
                v.push(ParseDelimiter::new(&c, petrel_fuzz::metrics()).expect("build"));
            }
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
