//! `syslog_parse`: the first input byte picks the format, time zone and
//! "now"; the rest is the frame. Checks that every range lies within the
//! frame, that the escape flag agrees with `unescape_sd_value`, and that a
//! reused `Message` and a trailing newline change nothing.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use petrel_syslog::{parse, unescape_sd_value, Context, Format, Message, Range};
use petrel_time::TimeZone;

static CONTEXTS: LazyLock<Vec<Context>> = LazyLock::new(|| {
    let zones = [
        TimeZone::Utc,
        TimeZone::Fixed(14 * 3600),
        TimeZone::from_name("America/New_York").expect("zone"),
    ];
    let nows = [
        1_735_689_600 * 1_000_000_000, // 2025-01-01T00:00:00Z
        1_735_646_400 * 1_000_000_000, // 2024-12-31T12:00:00Z
        i64::MIN,
        i64::MAX,
    ];
    let mut v = Vec::new();
    for tz in &zones {
        for &now_ns in &nows {
            v.push(Context {
                tz: tz.clone(),
                now_ns,
            });
        }
    }
    v
});

fn in_bounds(r: &Range, len: usize) -> bool {
    r.start <= r.end && r.end <= len
}

fn check(frame: &[u8], m: &Message) {
    let len = frame.len();
    for r in [&m.hostname, &m.app_name, &m.proc_id, &m.msg_id]
        .into_iter()
        .flatten()
    {
        assert!(in_bounds(r, len), "{r:?}");
    }
    assert!(in_bounds(&m.message, len));
    for id in &m.sd_ids {
        assert!(in_bounds(id, len));
    }
    for p in &m.sd {
        assert!(in_bounds(&p.id, len) && in_bounds(&p.name, len) && in_bounds(&p.value, len));
        assert!(m.sd_ids.contains(&p.id));
        let v = &frame[p.value.clone()];
        assert_eq!(unescape_sd_value(v).len() < v.len(), p.escaped);
    }
    assert!(m.facility.is_none_or(|f| f <= 23) && m.severity.is_none_or(|s| s <= 7));
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, frame)) = data.split_first() else {
        return;
    };
    let format = [Format::Auto, Format::Rfc5424, Format::Rfc3164][usize::from(sel % 3)];
    let ctx = &CONTEXTS[usize::from(sel / 3) % CONTEXTS.len()];

    let mut fresh = Message::default();
    let r = parse(frame, format, ctx, &mut fresh);
    check(frame, &fresh);

    // A Message left dirty by another frame gives the same result.
    let mut reused = Message::default();
    let _ = parse(
        b"<13>1 2024-01-01T00:00:00Z h a p m [j k=\"v\"][k] junk",
        Format::Auto,
        ctx,
        &mut reused,
    );
    assert_eq!(parse(frame, format, ctx, &mut reused), r);
    assert_eq!(reused, fresh);

    // Trailing line terminators are ignored.
    let mut nl = frame.to_vec();
    nl.extend_from_slice(b"\r\n");
    let mut m = Message::default();
    assert_eq!(parse(&nl, format, ctx, &mut m), r);
    assert_eq!(m, fresh);
});
