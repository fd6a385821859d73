//! `parse_regex`: the first input byte picks a configuration, the rest is
//! the line.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use petrel_fuzz::processors::common::OnError;
use petrel_fuzz::processors::parse_regex::{Config, ParseRegex};

const PATTERNS: &[&str] = &[
    r"\[(?P<time>[^]]+)]\s\[(?P<level>\w+)]\s\[(?P<pid>\d+)]\s(?P<file>\S+):(?P<line>\d+)\slog:(?P<log>.*)",
    r"^(?<a>x+)|(?<b>y+)(?<rest>.*)$",
    r"(?<k>[a-z]+)=(?:(?<q>'[^']*')|(?<v>\S*))",
    r"(*UTF)(*UCP)^(?<word>\w+)\s+(?<tail>.+)",
    r"^(?<all>(?:ab|a)*)c",
];

static PROCS: LazyLock<Vec<ParseRegex>> = LazyLock::new(|| {
    let mut v = Vec::new();
    for p in PATTERNS {
        for on_error in [OnError::Keep, OnError::Drop, OnError::Raw("raw".into())] {
            let c = Config {
                field: "message".into(),
                pattern: (*p).into(),
                on_error,
            };
            v.push(ParseRegex::new(&c, petrel_fuzz::metrics()).expect("pattern"));
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
